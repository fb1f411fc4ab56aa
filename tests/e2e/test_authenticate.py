"""``authenticate`` through the router to reference agents that require a key: their own
errors reach the client, and a link to the second agent replays the key
(tests/server/test_authenticate.py: against scripted backends)."""

from __future__ import annotations

from pathlib import Path

from tests.fleet import backends_of, start_fleet, start_router
from tests.support import AcpClient, text_chunks


async def test_reference_agents_that_require_a_key(tmp_path: Path) -> None:
    new = {"cwd": "/w", "mcpServers": []}
    async with (
        start_fleet(tmp_path, 2, "--require-auth", "key") as agents,
        start_router(backends_of(agents)) as router,
        AcpClient.connect(router.url) as client,
    ):
        await client.initialize()
        too_soon = await client.request("session/new", new)
        assert too_soon["error"]["code"] == -32000  # the agent's: authenticate first
        wrong = await client.request("authenticate", {"methodId": "guess"})
        assert wrong["error"] == {
            "code": -32000,
            "message": "Authentication failed: unknown auth method",
            "data": {"methodId": "guess"},
        }
        assert (await client.request("authenticate", {"methodId": "key"}))["result"] == {}
        # the second session lands on the other agent, over a link that replays the key
        sessions = [(await client.request("session/new", new))["result"]["sessionId"] for _ in "ab"]
        speakers = set()
        for session_id in sessions:
            answer = await client.prompt(session_id, "hello")
            assert answer["result"] == {"stopReason": "end_turn"}
            (chunk,) = text_chunks(client.drain_incoming())
            speakers.add(chunk[1].split("]")[0].lstrip("["))
        assert speakers == {agent.agent_id for agent in agents}
        assert router.metric("acp_router_client_errors_total", code="-32013") == 0
