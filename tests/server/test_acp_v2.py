"""ACP v2 and newer methods through the router, against scripted backends on real sockets:
the ``state_update`` a v2 ``session/resume`` sends before its answer arrives first; a
``subagent_update`` announcing a child session routes the child to its parent's backend;
``session/archive`` and ``session/delete`` are routed like ``session/close``; a v2
``initialize`` is negotiated to the pool's version (tests/e2e/test_acp_v2.py: a v2 stdio
agent behind ``acp-router host``).
"""

from __future__ import annotations

import json
from typing import Any

from router.protocol.ids import BackendId
from tests.fleet import ScriptedBackend, start_router, start_scripted
from tests.server.support import V2_INITIALIZE
from tests.support import CWD, AcpClient


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


# -- a v2 client --------------------------------------------------------------------------------


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
