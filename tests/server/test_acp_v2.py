"""ACP v2 and newer methods through the router, against scripted backends on real sockets:
the ``state_update`` a v2 ``session/resume`` sends before its answer arrives first; a
``subagent_update`` announcing a child session routes the child to its parent's backend;
``session/archive`` and ``session/delete`` are routed like ``session/close``. And a v2 stdio
agent behind ``acp-router host``: a v2 ``initialize`` is answered in the v2 layout with
``capabilities.session.status``, and ``session/status`` carries the last foreground
``state`` snapshot (never one the agent did not report).
"""

from __future__ import annotations

import json
import sys
from typing import Any

from router.protocol.ids import BackendId
from tests.fleet import ScriptedBackend, start_router, start_scripted
from tests.hosted import start_host
from tests.support import AcpClient

CWD = "/work/project"


def holding(session_id: str):  # type: ignore[no-untyped-def]
    async def status(asked: str) -> dict[str, Any] | None:
        return {"status": "active" if asked == session_id else "inactive"}

    return status


def update(session_id: str, **body: Any) -> str:
    params = {"sessionId": session_id, "update": body}
    return json.dumps({"jsonrpc": "2.0", "method": "session/update", "params": params})


def asked(backend: ScriptedBackend, method: str) -> list[str]:
    return [m["params"]["sessionId"] for m in backend.received if m.get("method") == method]


async def test_the_state_update_before_a_resume_answer_arrives_first() -> None:
    async with start_scripted("b", holding("sess_p")) as backend:
        backend.before_resume.append(
            update("sess_p", sessionUpdate="state_update", state="running")
        )
        async with start_router([("b", backend.url)]) as router:
            async with AcpClient.connect(router.url) as client:
                await client.initialize()
                resumed = await client.request(
                    "session/resume", {"sessionId": "sess_p", "cwd": CWD}
                )
                assert resumed["result"] == {}
                frames = [json.loads(frame) for frame in client.raw_frames]
                kinds = [f.get("method") or f"answer {f['id']}" for f in frames[1:]]
                assert kinds == ["session/update", f"answer {resumed['id']}"]
                assert frames[1]["params"]["update"] == {
                    "sessionUpdate": "state_update",
                    "state": "running",
                }


async def test_a_child_session_announced_by_its_parent_is_routed_to_the_parents_backend() -> None:
    async with (
        start_scripted("a", holding("sess_other")) as other,
        start_scripted("b", holding("sess_p")) as parent_backend,
    ):
        parent_backend.before_resume.append(
            update("sess_p", sessionUpdate="subagent_update", sessionId="sess_child", title="tests")
        )
        async with start_router([("a", other.url), ("b", parent_backend.url)]) as router:
            async with AcpClient.connect(router.url) as client:
                await client.initialize()
                # before the announcement, the child is not attached here
                early = await client.prompt("sess_child", "hi")
                assert early["error"]["code"] == -32010
                await client.request("session/resume", {"sessionId": "sess_p", "cwd": CWD})
                prompted = await client.prompt("sess_child", "hi")
                assert prompted.get("result") == {}, prompted
                assert (
                    router.pool.directory.attached[BackendId("b")] == 2
                )  # the parent and its child
                await client.notify("session/cancel", {"sessionId": "sess_child"})
                await client.status("sess_p")  # a round trip: the cancel went before it
            assert asked(parent_backend, "session/prompt") == ["sess_child"]
            assert "sess_child" in asked(parent_backend, "session/cancel")
            assert asked(other, "session/prompt") == []


async def test_archive_and_delete_are_routed_like_close() -> None:
    async with (
        start_scripted("a", holding("sess_a")) as one,
        start_scripted("b", holding("sess_b")) as two,
    ):
        async with start_router([("a", one.url), ("b", two.url)]) as router:
            async with AcpClient.connect(router.url) as client:
                await client.initialize()
                # not attached here: located by probe, forwarded, not attached
                archived = await client.request("session/archive", {"sessionId": "sess_a"})
                assert archived.get("result") == {}, archived
                assert asked(one, "session/archive") == ["sess_a"]
                # attached: forwarded, then detached
                await client.request("session/resume", {"sessionId": "sess_b", "cwd": CWD})
                deleted = await client.request("session/delete", {"sessionId": "sess_b"})
                assert deleted.get("result") == {}, deleted
                assert asked(two, "session/delete") == ["sess_b"]
                after = await client.prompt("sess_b", "still there?")
                assert after["error"]["code"] == -32010
            assert asked(two, "session/archive") == []


# -- a v2 agent behind the host -----------------------------------------------------------------

V2_AGENT = (sys.executable, "-m", "tests.agents.v2_agent")
V2_INITIALIZE = {
    "protocolVersion": 2,
    "info": {"name": "tests", "version": "0"},
    "capabilities": {},
}


async def states_until_idle(client: AcpClient) -> list[Any]:
    seen = []
    while True:
        message = await client.next_incoming()
        seen.append(message["params"]["update"]["state"])
        if seen[-1] not in ("running",):
            return seen


async def test_a_v2_agent_behind_host_reports_its_foreground_state_in_status() -> None:
    async with start_host("v2", *V2_AGENT) as host:
        async with AcpClient.connect(host.url) as client:
            init = (await client.request("initialize", V2_INITIALIZE))["result"]
            assert init["protocolVersion"] == 2
            assert init["capabilities"] == {"session": {"status": {}}}
            session_id = await client.new_session()
            # no state reported yet: none in the answer (never a made-up idle)
            assert (await client.status(session_id))["result"] == {"status": "active"}
            assert (await client.prompt(session_id, "go"))["result"] == {}
            assert await states_until_idle(client) == ["running", "idle"]
            assert (await client.status(session_id))["result"] == {
                "status": "active",
                "state": {"state": "idle", "stopReason": "end_turn"},
            }
            await client.prompt(session_id, "/malformed")
            assert await states_until_idle(client) == ["running", 5]
            assert (await client.status(session_id))["result"] == {"status": "active"}

        # through a router: located by the host's answer (a v2 capability), and the
        # resume's state_update comes before its answer
        async with start_router([("v2", host.url)]) as router:
            async with AcpClient.connect(router.url) as client:
                await client.initialize()
                resume = {"sessionId": session_id, "cwd": CWD}
                resumed = await client.request("session/resume", resume)
                assert resumed.get("result") == {}, resumed
                frames = [json.loads(frame) for frame in client.raw_frames[1:]]
                assert [f.get("method") for f in frames] == ["session/update", None]
                assert frames[0]["params"]["update"]["sessionUpdate"] == "state_update"
                # the router's own session/status passes the agent's state through, and
                # leaves out one it did not report well formed (the last was malformed)
                assert (await client.status(session_id))["result"] == {"status": "active"}
                assert (await client.prompt(session_id, "go"))["result"] == {}
                while (await client.next_incoming())["params"]["update"]["state"] != "idle":
                    pass
                idle = {"status": "active", "state": {"state": "idle", "stopReason": "end_turn"}}
                assert (await client.status(session_id))["result"] == idle
                async with AcpClient.connect(router.url) as other:  # not attached: a fan-out
                    await other.initialize()
                    assert (await other.status(session_id))["result"] == idle
            assert router.metric("acp_router_locate_total", outcome="active") == 1


async def test_a_v2_client_initialize_is_accepted_and_negotiated_to_the_pools_version() -> None:
    async with start_scripted("b", holding("sess_p")) as backend:
        async with start_router([("b", backend.url)]) as router:
            async with AcpClient.connect(router.url) as client:
                init = await client.request("initialize", V2_INITIALIZE)
                # the pool is spoken to in v1: the client gets 1 (ACP's negotiation rule)
                assert init["result"]["protocolVersion"] == 1
                assert init["result"]["agentCapabilities"]["sessionCapabilities"]["status"] == {}
                resumed = await client.request(
                    "session/resume", {"sessionId": "sess_p", "cwd": CWD}
                )
                assert resumed.get("result") == {}
            replayed = next(m for m in backend.received if m.get("id") == "acp-router:initialize")
            assert replayed["params"]["protocolVersion"] == 1
            assert replayed["params"]["info"] == V2_INITIALIZE["info"]  # the rest as it came
