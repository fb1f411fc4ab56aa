"""What the router keeps is bounded by what it serves (issue 17), on reference agents:
requests for sessions attached here cost no locate, and a frozen backend (it accepts TCP
and answers nothing) gets no new sessions once a probe goes unanswered, and
``session/list`` answers from the others within the probe timeout, naming it (its page
alone says nothing of the backend's health) (tests/server/test_bounded.py: against
scripted backends)."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from router.core.health import Health
from router.protocol.ids import BackendId
from router.server.links import control
from tests.fleet import RouterUnderTest, backends_of, start_fleet, start_router
from tests.server.support import client_status
from tests.support import WAIT, AcpClient, AgentProcess, answered_by, resume


async def test_requests_for_sessions_attached_here_cost_no_locate(tmp_path: Path) -> None:
    limits = {"locates_per_minute_per_connection": 2}
    async with (
        start_fleet(tmp_path, 2) as agents,
        start_router(backends_of(agents), router=limits) as router,
        AcpClient.connect(router.url) as client,
    ):
        await client.initialize()
        sessions = [await client.new_session() for _ in range(3)]
        for session_id in sessions:  # attached here: routed, not located
            assert "result" in await resume(client, session_id)
            closed = await client.request("session/close", {"sessionId": session_id})
            assert "result" in closed, closed  # on the old main: -32014 from the third on
        for n in range(2):  # now the budget is spent on what is located
            assert (await resume(client, f"sess_nobody_{n}"))["error"]["code"] == -32002
        limited = await resume(client, "sess_nobody_2")
        assert limited["error"]["code"] == -32014, limited
        assert router.metric("acp_router_limited_total", limit="locates_per_connection") == 1


# -- a frozen backend ---------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def frozen_first(
    tmp_path: Path, settings: dict[str, Any] | None = None
) -> AsyncIterator[tuple[RouterUnderTest, AgentProcess]]:
    """Two agents behind a router (probe timeout 300 ms; ``settings``: more of its
    ``[router]`` table), the first frozen (SIGSTOP: it accepts TCP and answers nothing)
    for the block; then thawed, and up again. The router, and the agent that stays up."""
    async with (
        start_fleet(tmp_path, 2) as agents,
        start_router(
            backends_of(agents), probe={"timeout_ms": 300}, router=settings or {}
        ) as router,
    ):
        frozen, thawed = agents
        frozen.cli.process.send_signal(signal.SIGSTOP)
        try:
            yield router, thawed
        finally:
            frozen.cli.process.send_signal(signal.SIGCONT)
        await router.wait_health("agent-1", Health.UP)  # it answers again


async def test_a_frozen_backend_gets_no_new_sessions_and_list_answers_without_it(
    tmp_path: Path,
) -> None:
    async with frozen_first(tmp_path) as (router, thawed):
        async with AcpClient.connect(router.url) as client:
            await client.initialize()
            loop = asyncio.get_running_loop()
            started = loop.time()
            listed = await client.request("session/list", {})
            # on the old main: -32603 for everyone after 5 s
            assert listed["result"]["_meta"] == {"unlistedBackends": ["agent-1"]}, listed
            assert loop.time() - started < 2.0  # about one probe timeout
            # a page left it out, and that is all: one client's list is no evidence for
            # everyone (a backend busy with a slow list may answer nothing else meanwhile)
            assert router.pool.health(BackendId("agent-1")) is Health.UP
            # a probe that goes unanswered makes it silent
            status = await client_status(client, "sess_anyone")
            assert status["error"]["code"] == -32012, status
            assert router.pool.health(BackendId("agent-1")) is Health.UNKNOWN
            # while it stays silent it gets no new sessions (on the old main: some,
            # each answered -32013 after the connect deadline)
            for _ in range(6):
                session_id = await client.new_session()
                assert await answered_by(client, session_id) == thawed.agent_id
            started = loop.time()
            listed = await client.request("session/list", {})
            assert listed["result"]["_meta"] == {"unlistedBackends": ["agent-1"]}
            assert loop.time() - started < 1.0  # not asked at all now


async def test_watching_a_silent_backend_whose_link_takes_no_probe_does_not_spin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # it lists as fast as it can: every page costs a locate, so a budget that does not
    # run out within the watch's pace
    unlimited = {"locates_per_minute_per_connection": 1_000_000}
    async with frozen_first(tmp_path, unlimited) as (router, thawed):
        async with AcpClient.connect(router.url) as client:
            await client.initialize()
            await client_status(client, "sess_anyone")  # its probe times out: silent
            assert router.pool.health(BackendId("agent-1")) is Health.UNKNOWN
            # its link, still up, takes no more requests (as when its table of
            # unanswered ones is full): each retry of the watch is refused at once
            monkeypatch.setattr(control, "MAX_PENDING", 0)

            def refused() -> float:
                return router.metric("acp_router_probes_total", backend="agent-1", result="unknown")

            asked = refused()
            loop = asyncio.get_running_loop()
            started = loop.time()
            # the event loop still serves everyone else once the watch's probe in
            # flight has timed out (on the old main the watch then retried without
            # yielding, forever: no answer came after that)
            async with asyncio.timeout(WAIT):
                while refused() == asked:
                    # every control link refuses now: no backend could be asked
                    listed = await client.request("session/list", {})
                    assert listed["error"]["code"] == -32012, listed
            for _ in range(3):
                session_id = await client.new_session()
                assert await answered_by(client, session_id) == thawed.agent_id
            elapsed = loop.time() - started
            retried = refused() - asked
            # at the timeout's pace
            assert 1 <= retried <= elapsed / 0.3 + 2, (retried, elapsed)
            monkeypatch.undo()  # the watch hears it again once it is thawed
