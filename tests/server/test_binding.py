"""The new-session limits per address, under a clock the test moves: a router in this
process and a scripted backend on real sockets (tests/e2e/test_binding.py: sessions bound
to the token that created them)."""

from __future__ import annotations

from pathlib import Path

from tests.fleet import start_router, start_scripted
from tests.support import CWD, AcpClient


class Clock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_new_sessions_per_address_are_limited_and_recover(tmp_path: Path) -> None:
    async def inactive(session_id: str) -> dict[str, str]:
        return {"status": "inactive"}

    clock = Clock()
    limits = {"new_sessions_per_minute_per_address": 2}
    async with (
        start_scripted("a", inactive) as backend,
        start_router([("a", backend.url)], clock=clock, router=limits) as router,
        AcpClient.connect(router.url) as client,
    ):
        new = {"cwd": CWD, "mcpServers": []}
        # refused by the routing core before the quota: costs the address no token
        early = await client.request("session/new", new)
        assert early["error"]["code"] == -32600
        await client.initialize()
        reserved = await client.request("session/new", new, request_id="acp-router:1")
        assert reserved["error"]["code"] == -32600
        made = [await client.request("session/new", new) for _ in range(2)]
        assert all("result" in answer for answer in made), made
        refused = await client.request("session/new", new)
        assert refused["error"]["code"] == -32014
        assert refused["error"]["data"] == {
            "limit": "address",
            "retryAfterMs": 30_000,
            "retryable": True,
        }
        resumed = await client.request("session/resume", {"sessionId": "s", "cwd": CWD})
        assert "result" in resumed  # attached: a fork of it reaches the quota
        fork = await client.request("session/fork", {"sessionId": "s", "cwd": CWD})
        assert fork["error"]["code"] == -32014  # a fork makes a session too
        # other requests are not limited
        assert "result" in await client.request("session/status", {"sessionId": "s"})
        clock.now += 29.9
        assert (await client.request("session/new", new))["error"]["code"] == -32014
        clock.now += 0.1
        assert "result" in await client.request("session/new", new)
        assert router.metric("acp_router_limited_total", limit="sessions_per_address") == 3
        assert router.metric("acp_router_client_errors_total", code="-32014") == 3
        received = [m for m in backend.received if m.get("method") == "session/new"]
        assert len(received) == 3  # refused requests never reached the backend
        # another address has a bucket of its own
        assert (await client.request("session/new", new))["error"]["code"] == -32014
        async with AcpClient.connect(router.url, source="127.0.0.2") as neighbour:
            await neighbour.initialize()
            assert "result" in await neighbour.request("session/new", new)
