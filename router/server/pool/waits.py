"""Waiting on a backend's health, for a failover (:mod:`router.core.failover`): until it
is known whether the backend kept its memory, or the wait is over; and, for a client's
``initialize`` and a locate, on the first answers of backends that have just joined
(:meth:`router.core.fleet.Fleet.first_contact`).

Each wait wakes on every change of the pool's health (:attr:`Pool.ready_changed`), and,
at the latest, when the core says the backend's health changes by itself
(:func:`router.core.health.lapses_at`); a wait never wakes in a loop that does not
wait (docs/architecture.md, "Waits").
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from router.core import health
from router.core.health import Health
from router.protocol.ids import BackendId
from router.server.pool.backends import Pool

logger = logging.getLogger(__name__)

#: the least a wait sleeps before it reads the health again: a lapse computed to the
#: microsecond must have passed on the clock that reads it
MIN_WAIT = 0.001


async def known(pool: Pool, backend: BackendId, timeout: float) -> Health:
    """``backend``'s health once it is up or gone (known to have kept, or lost, its
    memory), waiting up to ``timeout`` seconds; unknown if it is neither by then."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while (reading := pool.health(backend)) is Health.UNKNOWN:
        wait = deadline - loop.time()
        if wait <= 0:
            return reading
        state = pool.fleet.states.get(backend)
        lapses = None if state is None else health.lapses_at(state, pool.fleet.grace)
        if lapses is not None:
            wait = min(wait, max(lapses - pool.now(), 0.0) + MIN_WAIT)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(wait):
                await pool.ready_changed.wait()
    return reading


async def decided(pool: Pool, backend: BackendId, timeout: float) -> Health:
    """:func:`known`, until :func:`router.core.health.decided` says a failover may stop
    waiting; unknown if it does not by ``timeout``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        reading = await known(pool, backend, deadline - loop.time())
        answers = await pool.alive(backend) if reading is Health.UP else None
        if health.decided(reading, answers_probe=answers):
            return reading
        left = deadline - loop.time()
        if left <= 0:
            return Health.UNKNOWN
        with contextlib.suppress(TimeoutError):  # until its state changes, or a while
            async with asyncio.timeout(min(pool.settings.probe.timeout_ms / 1000, left)):
                await pool.ready_changed.wait()


async def first_contact(pool: Pool, what: str, *, any_one: bool = False) -> None:
    """Wait until the members a router just started has not heard from have answered
    (``any_one``: until one has), each for ``router.connect_timeout_ms`` after it joined
    at most (:meth:`router.core.fleet.Fleet.first_contact`); at once when none is waited
    for. ``what`` waits, for the log."""
    within = pool.settings.router.connect_timeout_ms / 1000
    told = False
    while (awaited := pool.fleet.first_contact(pool.now(), within, any_one=any_one)) is not None:
        if not told:
            told = True
            logger.info(
                "%s waits up to %.1f s for backends not yet heard from: %s",
                what,
                awaited.until - pool.now(),
                ", ".join(awaited.backends),
            )
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(max(awaited.until - pool.now(), 0.0) + MIN_WAIT):
                await pool.ready_changed.wait()
