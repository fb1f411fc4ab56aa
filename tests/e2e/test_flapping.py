"""A backend that flaps is not a backend that is gone (issue 23, item 3): one whose
address refuses for periods shorter than ``control.down_grace_ms``, with short reachable
windows between them, is reached in those windows, so it is never given up and a
resume never lands on another agent. Real agents behind a real relay; the flapping is
the relay's schedule.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

from router.core.health import Health
from router.protocol.ids import BackendId
from tests.fleet import RouterUnderTest, start_fleet, start_router
from tests.relay import Relay, start_relay
from tests.support import CWD, AcpClient

#: the grace, and a reconnect backoff whose cap is a third of it (the least the
#: configuration accepts): before item 3, attempts paced at up to that cap missed the
#: reachable windows of a whole grace now and then
CONTROL = {"down_grace_ms": 1500, "reconnect_initial_ms": 500, "reconnect_max_ms": 500}
REFUSED_SECONDS = 0.5
#: new connections are accepted this long; those it accepted are cut a moment later (an
#: L4 proxy that stops accepting first), so an attempt started in the window completes
REACHABLE_SECONDS = 0.15
CUT_AFTER_SECONDS = 0.05
CYCLES = 14


async def flap(relay: Relay, cycles: int) -> None:
    """Refuse (cutting every connection) for :data:`REFUSED_SECONDS`, then accept new
    connections for :data:`REACHABLE_SECONDS`, ``cycles`` times; the schedule is the
    fault, so it runs on timers."""
    for _ in range(cycles):
        await relay.refuse()
        await asyncio.sleep(REFUSED_SECONDS)
        await relay.listen()
        await asyncio.sleep(REACHABLE_SECONDS)
        relay.stop_listening()
        await asyncio.sleep(CUT_AFTER_SECONDS)


@contextlib.asynccontextmanager
async def watching_gone(router: RouterUnderTest, backend: str) -> AsyncIterator[list[float]]:
    """Each time ``backend`` was seen gone (the pool re-reads health on every event)."""
    seen: list[float] = []
    loop = asyncio.get_running_loop()

    async def watch() -> None:
        while True:
            if router.pool.health(BackendId(backend)) is Health.GONE:
                seen.append(loop.time())
            await router.pool.ready_changed.wait()

    task = asyncio.create_task(watch())
    try:
        yield seen
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def resumes_until(
    router: RouterUnderTest, session_id: str, done: asyncio.Task[None]
) -> set[str]:
    """Resume ``session_id`` through the router from fresh connections until ``done``; the
    agents that answered a prompt after a successful resume."""
    speakers: set[str] = set()
    while not done.done():
        with contextlib.suppress(ConnectionError, OSError, TimeoutError):
            async with AcpClient.connect(router.url) as client:
                await client.initialize()
                resumed = await client.request(
                    "session/resume", {"sessionId": session_id, "cwd": CWD}
                )
                if "result" in resumed:
                    answer = await client.prompt(session_id, "where")
                    if "result" in answer:
                        for message in client.drain_incoming():
                            text = message["params"]["update"]["content"]["text"]
                            speakers.add(text.split("]", 1)[0].lstrip("["))
                else:
                    assert resumed["error"]["data"]["retryable"] is True, resumed
        await asyncio.wait({done}, timeout=0.1)  # the next client, or the end
    return speakers


async def test_a_flapping_backend_is_never_given_up(tmp_path: Path) -> None:
    async with start_fleet(tmp_path, 3) as agents, start_relay(agents[0].url) as relay:
        urls = {agent.agent_id: agent.url for agent in agents}
        backends = [
            ("agent-1", relay.url),
            ("agent-2", urls["agent-2"]),
            ("agent-3", urls["agent-3"]),
        ]
        async with start_router(backends, control=CONTROL) as router:
            async with AcpClient.connect(urls["agent-1"]) as direct:  # active on agent-1
                await direct.initialize()
                session_id = await direct.new_session(CWD)
            async with watching_gone(router, "agent-1") as gone:
                weather = asyncio.create_task(flap(relay, CYCLES))
                speakers = await resumes_until(router, session_id, weather)
                await weather
            await router.wait_health("agent-1", Health.UP)
            assert gone == [], f"agent-1 was given up {len(gone)} times"
            assert speakers <= {"agent-1"}, speakers
            changes = "acp_router_backend_state_changes_total"
            assert router.metric(changes, backend="agent-1", to="gone") == 0
            # it did flap, and the control link got through in the windows
            assert router.metric(changes, backend="agent-1", to="up") >= 3
        for agent_id, url in urls.items():
            async with AcpClient.connect(url) as direct:
                status = (await direct.status(session_id))["result"]["status"]
            assert status == ("active" if agent_id == "agent-1" else "inactive"), agent_id
