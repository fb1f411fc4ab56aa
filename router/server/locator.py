"""Locating sessions: the I/O around :class:`router.core.locate.LocateRound`.

A locate takes the pool's snapshot of the session, and sends the probes the round asks
for until it decides; concurrent resumes of one session share one locate (single
flight), and at most :data:`MAX_CONCURRENT_LOCATES` run at once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

from router.core.locate import Ask, Located, LocateRound, Stage
from router.protocol.acp import ProbeResult
from router.protocol.errors import LocateInconclusive, NoBackendAvailable, SessionNotFound
from router.protocol.ids import BackendId, SessionId
from router.server import log_context

if TYPE_CHECKING:
    from router.server.pool import Pool

logger = logging.getLogger(__name__)

#: cap on locates running at once; more wait their turn instead of storming the pool
MAX_CONCURRENT_LOCATES = 256

#: a locate is shared by the resumes of one session that have tried the same backends
_LocateKey = tuple[SessionId, tuple[BackendId, ...]]

#: the ``outcome`` label of a locate that ended in each of the router's errors
_FAILED = {
    LocateInconclusive: "unknown_failed",
    NoBackendAvailable: "no_backend",
    SessionNotFound: "not_found",
}


class Locator:
    def __init__(self, pool: Pool) -> None:
        self._pool = pool
        self._inflight: dict[_LocateKey, asyncio.Task[Located]] = {}
        self._slots = asyncio.Semaphore(MAX_CONCURRENT_LOCATES)

    async def locate(self, session_id: SessionId, tried: tuple[BackendId, ...] = ()) -> Located:
        """Where ``session_id`` should be resumed, skipping the backends in ``tried`` that
        already answered ``-32002`` to this resume. Concurrent calls share one locate."""
        key = (session_id, tried)
        task = self._inflight.get(key)
        if task is None:
            task = asyncio.create_task(self._locate(session_id, tried), name="locate")
            self._inflight[key] = task
            task.add_done_callback(lambda done: self._done(key, done))
        # shield: a caller that goes away must not cancel the locate others wait on
        return await asyncio.shield(task)

    def cancel(self) -> None:
        """Stop every locate in flight (the pool is stopping)."""
        for task in self._inflight.values():
            task.cancel()

    def _done(self, key: _LocateKey, task: asyncio.Task[Located]) -> None:
        if self._inflight.get(key) is task:
            del self._inflight[key]
        if not task.cancelled():
            task.exception()  # retrieved: every waiter may have gone away

    async def _locate(self, session_id: SessionId, tried: tuple[BackendId, ...]) -> Located:
        # one locate serves every connection waiting on it: it is about the session only
        log_context.connection.set(None)
        log_context.session.set(session_id)
        metrics = self._pool.metrics
        started = time.perf_counter()
        outcome = "error"
        try:
            async with self._slots:
                located = await self._run(session_id, tried)
            outcome = located.outcome.value
            return located
        except (LocateInconclusive, NoBackendAvailable, SessionNotFound) as exc:
            outcome = _FAILED[type(exc)]
            raise
        finally:
            metrics.locates.labels(outcome).inc()
            metrics.locate_duration.labels(outcome).observe(time.perf_counter() - started)

    async def _run(self, session_id: SessionId, tried: tuple[BackendId, ...]) -> Located:
        pool = self._pool
        settings = pool.settings.cache
        round_ = LocateRound(
            pool.snapshot(session_id, tried), now=pool.now(), verify_after=settings.verify_seconds
        )
        try:
            step = round_.start()
            while isinstance(step, Ask):
                step = round_.hear(await pool.probe_many(step.backends, session_id))
        finally:
            pool.metrics.locate_cache.labels(round_.stage.value).inc()
            pool.metrics.fanout.observe(round_.probes)
            if round_.fanned_out:
                pool.metrics.fanouts.inc()
            heard = round_.answers.items()
            absent = [b for b, r in heard if r is ProbeResult.NOT_FOUND]
            known_before = round_.snapshot.absent  # remembered, not heard again
            pool.directory.absences.add(
                session_id, probed=[b for b in absent if b not in known_before]
            )
        if step.split_brain:
            pool.metrics.split_brain.inc()
            logger.warning(
                "split brain: session %s is active on %s; routing to %s",
                session_id,
                ", ".join(step.split_brain),
                step.backend,
            )
        if round_.stage is not Stage.HIT or round_.checked is not None:
            pool.remember(session_id, step.backend, round_.checked)
        return step
