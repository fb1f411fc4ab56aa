"""Waits on a backend's health never spin (issue 23): a failover waiting for a backend
that is up but silent (its probes go unanswered, no client link open to it) waits for
events until its bound, and wakes a handful of times, not once per loop turn. Real
router, a real scripted backend; the pool's own event is counted as it is waited on."""

from __future__ import annotations

import asyncio

from router.core.health import Health
from router.protocol.ids import BackendId
from router.server.pool import waits
from tests.fleet import never_answer, start_router, start_scripted


class CountedEvent(asyncio.Event):
    """An event that counts how often it is waited on (each wake-up of a wait loop)."""

    def __init__(self) -> None:
        super().__init__()
        self.waits = 0

    async def wait(self) -> bool:  # type: ignore[override]
        self.waits += 1
        return await super().wait()


async def test_a_wait_for_a_silent_backend_waits_for_events_not_in_a_loop() -> None:
    backend = BackendId("frozen")
    control = {"down_grace_ms": 300, "reconnect_initial_ms": 20, "reconnect_max_ms": 100}
    async with (
        start_scripted("frozen", never_answer) as frozen,
        start_router([("frozen", frozen.url)], control=control, probe={"timeout_ms": 50}) as router,
    ):
        pool = router.pool
        assert not await pool.alive(backend)  # its probe goes unanswered: silent
        assert pool.health(backend) is Health.UNKNOWN  # up, but silent: unknown
        # it never lapses by itself (its control link is up): only an event may change it,
        # and the grace since it came up runs out during the wait
        counted = CountedEvent()
        pool.ready_changed = counted
        health = await waits.known(pool, backend, 0.6)
        assert health is Health.UNKNOWN
        assert counted.waits <= 3, f"{counted.waits} wake-ups in 0.6 s: the wait spins"
