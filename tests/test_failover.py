"""The router keeps its one promise through ordinary weather, against real processes:
a session runs on one instance, and a client that comes back finds it (issue 7).

* A control link that drops is not a backend that is gone: while a relay holds the
  reconnect silent, resumes fail closed (retryable), and the session comes back on its
  holder afterwards.
* Oversized probe material (a 5 MB ``sessionId`` or ``cwd``) is refused to its sender and
  never reaches the control links.
"""

from __future__ import annotations

from pathlib import Path

from tests.fleet import backends_of, start_fleet, start_router
from tests.support import AcpClient, JsonObject

CWD = "/work/project"
FIVE_MB = 5 * 1024 * 1024


async def test_oversized_session_ids_and_cwds_are_refused_without_dropping_a_link(
    tmp_path: Path,
) -> None:
    async with start_fleet(tmp_path, 2) as agents, start_router(backends_of(agents)) as router:
        async with AcpClient.connect(router.url) as client:
            await client.initialize()
            session_id = await client.new_session(CWD)
            huge = "s" * FIVE_MB
            oversized: list[tuple[str, JsonObject]] = [
                ("session/status", {"sessionId": huge}),
                ("session/resume", {"sessionId": huge, "cwd": CWD}),
                ("session/load", {"sessionId": huge, "cwd": CWD, "mcpServers": []}),
                ("session/close", {"sessionId": huge}),
                ("session/list", {"cwd": "/" + "x" * FIVE_MB}),
                ("session/list", {"cursor": "c" * FIVE_MB}),
            ]
            for method, params in oversized:
                answer = await client.request(method, params)
                assert answer["error"]["code"] == -32602, (method, answer["error"])
            # every control link stayed up: the pool still answers from both backends
            assert (await client.status(session_id))["result"] == {"status": "active"}
            listed = await client.request("session/list", {"cwd": CWD})
            assert session_id in {s["sessionId"] for s in listed["result"]["sessions"]}
        for agent in agents:
            assert (
                router.metric(
                    "acp_router_backend_state_changes_total", backend=agent.agent_id, to="down"
                )
                == 0
            )
            assert (
                router.metric("acp_router_probes_total", backend=agent.agent_id, result="unknown")
                == 0
            )
