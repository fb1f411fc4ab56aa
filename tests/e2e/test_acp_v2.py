"""ACP v2 through a v2 stdio agent behind ``acp-router host``: a v2 ``initialize`` is
answered in the v2 layout with ``capabilities.session.status``, and ``session/status``
carries the last foreground ``state`` snapshot (never one the agent did not report), there
and through a router (tests/server/test_acp_v2.py: v2 and newer methods against scripted
backends)."""

from __future__ import annotations

import json
import sys
from typing import Any

from router.protocol.acp import EPOCH_META_KEY as EPOCH
from tests.fleet import start_router
from tests.hosted import start_host
from tests.server.support import V2_INITIALIZE
from tests.support import CWD, AcpClient

V2_AGENT = (sys.executable, "-m", "tests.agents.v2_agent")


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
            # no state reported yet: none in the answer (never a made-up idle); the
            # host adds the session's epoch (0: no router resumed it)
            kept = {"_meta": {EPOCH: 0}}
            assert (await client.status(session_id))["result"] == {"status": "active", **kept}
            assert (await client.prompt(session_id, "go"))["result"] == {}
            assert await states_until_idle(client) == ["running", "idle"]
            assert (await client.status(session_id))["result"] == {
                "status": "active",
                "state": {"state": "idle", "stopReason": "end_turn"},
                **kept,
            }
            await client.prompt(session_id, "/malformed")
            assert await states_until_idle(client) == ["running", 5]
            assert (await client.status(session_id))["result"] == {"status": "active", **kept}

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
