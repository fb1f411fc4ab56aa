"""The admin API on a real router before real reference agents: tokens, drain, maintenance,
where a session is, reload; the status page in ``test_admin_page.py``."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.e2e.support import ADMIN, ADMIN_BEARER, ADMIN_TOKEN
from tests.fleet import RouterUnderTest, backends_of, start_fleet, start_router
from tests.support import AcpClient, answered_by, resume


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


async def admin(
    http: aiohttp.ClientSession,
    router: RouterUnderTest,
    method: str,
    path: str,
    status: int = 200,
    headers: dict[str, str] = ADMIN_BEARER,
) -> Any:
    async with http.request(method, f"{router.base}/admin/{path}", headers=headers) as response:
        assert response.status == status, await response.text()
        return await response.json()


@contextlib.asynccontextmanager
async def admin_router(store: Path, count: int) -> AsyncIterator[RouterUnderTest]:
    """A router with the admin API before ``count`` reference agents."""
    async with (
        start_fleet(store, count) as agents,
        start_router(backends_of(agents), admin=ADMIN) as router,
    ):
        yield router


async def new_session_on(router: RouterUnderTest) -> tuple[str, str]:
    """A session made through the router, and the agent that holds it."""
    async with AcpClient.connect(router.url) as client:
        await client.initialize()
        session_id = await client.new_session()
        return session_id, await answered_by(client, session_id)


async def test_without_an_admin_section_there_is_no_admin(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    async with start_fleet(tmp_path, 1) as agents, start_router(backends_of(agents)) as router:
        for path in ("", "backends", "sessions/x"):
            async with http.get(f"{router.base}/admin/{path}", headers=ADMIN_BEARER) as response:
                assert response.status == 404


async def test_the_admin_api_wants_its_own_token(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    auth = {"tokens": ["client-token"]}
    async with (
        start_fleet(tmp_path, 1) as agents,
        start_router(backends_of(agents), admin=ADMIN, auth=auth) as router,
    ):
        for headers in (
            {},
            {"Authorization": "Bearer client-token"},
            {"Authorization": ADMIN_TOKEN},
        ):
            answer = await admin(http, router, "GET", "backends", 401, headers)
            assert answer == {"error": "an admin token is needed"}
        await admin(http, router, "POST", "backends/agent-1/drain", 401, {})
        assert router.pool.fleet.draining() == set()  # a refused call changed nothing
        listed = await admin(http, router, "GET", "backends")
        assert [(b["id"], b["health"], b["admin"]) for b in listed["backends"]] == [
            ("agent-1", "up", "ready")
        ]
        # the page itself holds no data: it loads without a token
        async with http.get(f"{router.base}/admin/") as page:
            assert page.status == 200
            assert "<title>acp-router</title>" in await page.text()


async def test_a_drained_backend_gets_no_new_sessions_but_serves_its_located_ones(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    async with admin_router(tmp_path, 2) as router:
        session_id, holder = await new_session_on(router)
        other = "agent-2" if holder == "agent-1" else "agent-1"
        drained = await admin(http, router, "POST", f"backends/{holder}/drain")
        assert drained["admin"] == "drain"
        gauge = "acp_router_backend_admin_state"
        assert router.metric(gauge, backend=holder, state="drain") == 1
        assert router.metric(gauge, backend=holder, state="ready") == 0
        # new sessions: all elsewhere
        assert [(await new_session_on(router))[1] for _ in range(4)] == [other] * 4
        # the located one: still where it lives, from a fresh connection
        async with AcpClient.connect(router.url) as client:
            await client.initialize()
            assert (await resume(client, session_id)).get("result") == {}
            assert await answered_by(client, session_id) == holder
            listed = await admin(http, router, "GET", "backends")
            row = next(b for b in listed["backends"] if b["id"] == holder)
            assert row["attachedSessions"] == 1
            assert row["pinnedConnections"] == 1  # this connection's link
            assert row["probeLatencyMs"] > 0
            assert row["probeLatencyAverageMs"] > 0
        assert (await admin(http, router, "POST", f"backends/{holder}/ready"))["admin"] == "ready"
        assert router.pool.fleet.draining() == set()


async def test_a_session_on_a_backend_in_maintenance_waits_and_is_never_moved(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    async with admin_router(tmp_path, 2) as router:
        session_id, holder = await new_session_on(router)
        await admin(http, router, "POST", f"backends/{holder}/maint")
        async with AcpClient.connect(router.url) as client:
            await client.initialize()
            refused = await resume(client, session_id)
            assert refused["error"]["code"] == -32012, refused
            assert refused["error"]["data"]["maintenance"] is True
            assert refused["error"]["data"]["backends"] == [holder]
            await admin(http, router, "POST", f"backends/{holder}/ready")
            assert (await resume(client, session_id)).get("result") == {}
            assert await answered_by(client, session_id) == holder


async def test_where_a_session_is_comes_from_a_fresh_probe_and_attaches_nothing(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    async with admin_router(tmp_path, 2) as router:
        session_id, holder = await new_session_on(router)
        probes_before = router.metric("acp_router_probes_total", backend=holder, result="active")
        where = await admin(http, router, "GET", f"sessions/{session_id}")
        assert where["active"] == [holder]
        assert where["attachedHere"] == []
        assert where["backends"][holder] == {"status": "active"}
        after = router.metric("acp_router_probes_total", backend=holder, result="active")
        assert after == probes_before + 1
        assert sum(router.pool.directory.attached.values()) == 0
        unknown = await admin(http, router, "GET", "sessions/sess_nobody")
        assert unknown["active"] == []
        assert {v["status"] for v in unknown["backends"].values()} == {"not_found"}
        # sessions attached through this router are listed with what the router last
        # heard of them, read from memory: refreshing the page costs no probe
        async with AcpClient.connect(router.url) as client:
            await client.initialize()
            await resume(client, session_id)
            probes = router.probes()
            for _ in range(5):
                listed = await admin(http, router, "GET", "sessions")
                (row,) = listed["sessions"]
                assert (row["sessionId"], row["backend"], row["status"]) == (
                    session_id,
                    holder,
                    "active",
                )
                assert isinstance(row["ageSeconds"], float)
                assert listed["truncated"] is False
            # on the old main: one probe per attached session per refresh
            assert router.probes() == probes


async def test_unknown_backends_and_states_are_404_and_reload_without_a_file_is_refused(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    async with admin_router(tmp_path, 1) as router:
        missing = await admin(http, router, "POST", "backends/agent-9/drain", 404)
        assert missing == {"error": "no backend 'agent-9' in the pool"}
        bad_state = await admin(http, router, "POST", "backends/agent-1/sleep", 404)
        assert bad_state == {"error": "the states are ready, drain and maint"}
        refused = await admin(http, router, "POST", "reload", 400)
        assert refused["outcome"] == "refused"
        assert "without a config file" in refused["reason"]
