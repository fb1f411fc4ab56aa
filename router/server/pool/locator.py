"""Locating sessions: the I/O around :class:`router.core.locate.LocateRound`, and the
audit that looks for split brain off the request path.

A locate takes the pool's snapshot of the session, and sends the probes the round asks
for until it decides; concurrent resumes of one session share one locate (single
flight), and at most :data:`MAX_CONCURRENT_LOCATES` run at once. A locate that trusted
the hinted backend's ``active`` on its own word (:attr:`Located.audit`) queues the
session for the :class:`Audit`, which asks the whole pool later, within a probe budget.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import replace

from router.core.locate import Ask, Located, LocateRound
from router.core.quotas import AuditBudget
from router.core.split_brain import Verdict
from router.protocol.acp import ProbeResult
from router.protocol.errors import LocateInconclusive, NoBackendAvailable, SessionNotFound
from router.protocol.ids import BackendId, SessionId
from router.server.observability import log_context
from router.server.pool import waits
from router.server.pool.backends import Pool
from router.server.pool.healing import Healer
from router.server.pool.whereabouts import Whereabouts

logger = logging.getLogger(__name__)

#: cap on locates running at once; more wait their turn instead of storming the pool
MAX_CONCURRENT_LOCATES = 256

#: sessions waiting for an audit at most (the oldest requests are dropped beyond it)
MAX_QUEUED = 4096

#: a locate is shared by the resumes of one session that have tried the same backends
#: (and name the same home, if any, and ask the whole pool or not)
_LocateKey = tuple[SessionId, tuple[BackendId, ...], BackendId | None, bool]

#: the ``outcome`` label of a locate that ended in each of the router's errors
_FAILED = {
    LocateInconclusive: "unknown_failed",
    NoBackendAvailable: "no_backend",
    SessionNotFound: "not_found",
}


class Locator:
    def __init__(self, where: Whereabouts, healer: Healer) -> None:
        self._pool = where.pool
        self._where = where
        self._healer = healer
        self._inflight: dict[_LocateKey, asyncio.Task[Located]] = {}
        self._slots = asyncio.Semaphore(MAX_CONCURRENT_LOCATES)
        self.audit = Audit(where, healer)

    async def locate(
        self,
        session_id: SessionId,
        tried: tuple[BackendId, ...] = (),
        claimed: BackendId | None = None,
        *,
        ask_all: bool = False,
    ) -> Located:
        """Where ``session_id`` should be resumed, skipping the backends in ``tried`` that
        already answered ``-32002`` to this resume; ``claimed``: the home the client's
        hinted id named (:attr:`router.core.locate.Snapshot.claimed`); ``ask_all``: the
        whole pool is asked, whatever the hint says (a failover: the fault that orphaned
        the session may have moved it). Concurrent calls share one locate (those with
        another claim run their own)."""
        key = (session_id, tried, claimed, ask_all)
        task = self._inflight.get(key)
        if task is None:
            task = asyncio.create_task(self._locate(*key), name="locate")
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

    async def _locate(
        self,
        session_id: SessionId,
        tried: tuple[BackendId, ...],
        claimed: BackendId | None,
        ask_all: bool,
    ) -> Located:
        # one locate serves every connection waiting on it: it is about the session only
        log_context.connection.set(None)
        log_context.session.set(session_id)
        metrics = self._pool.metrics
        started = time.perf_counter()
        outcome = "error"
        try:
            await waits.first_contact(self._pool, "a locate")
            async with self._slots:
                located = await self._run(session_id, tried, claimed, ask_all)
            outcome = located.outcome.value
            return located
        except (LocateInconclusive, NoBackendAvailable, SessionNotFound) as exc:
            outcome = _FAILED[type(exc)]
            raise
        finally:
            metrics.locates.labels(outcome).inc()
            metrics.locate_duration.labels(outcome).observe(time.perf_counter() - started)

    async def _run(
        self,
        session_id: SessionId,
        tried: tuple[BackendId, ...],
        claimed: BackendId | None,
        ask_all: bool,
    ) -> Located:
        located = await run_round(
            self._where, self._healer, session_id, tried, claimed=claimed, ask_all=ask_all
        )
        if located.audit:
            self.audit.request(session_id)
        return located


async def run_round(
    where: Whereabouts,
    healer: Healer,
    session_id: SessionId,
    tried: tuple[BackendId, ...] = (),
    *,
    audit: bool = False,
    claimed: BackendId | None = None,
    ask_all: bool = False,
) -> Located:
    """One locate round, from the pool's snapshot; its metrics, what it learned
    (absences, the hint), and a split brain it saw. An ``audit`` asks the whole pool
    (the hint left out) and is not a lookup of the hint; ``claimed`` is the home a
    client's hinted id named; ``ask_all``: the whole pool is asked."""
    pool = where.pool
    settings = pool.settings.cache
    snapshot = where.snapshot(session_id, tried, ask_all=audit or ask_all, claimed=claimed)
    round_ = LocateRound(snapshot, now=pool.now(), verify_after=settings.verify_seconds)
    probes: list[tuple[BackendId, ProbeResult]] = []
    step: Ask | Located | None = None
    try:
        step = round_.start()
        while isinstance(step, Ask):
            answers = await pool.probe_answers(step.backends, session_id)
            probes += ((backend, answer.result) for backend, answer in answers.items())
            step = round_.heard(answers)
    finally:
        if not audit:
            pool.metrics.locate_cache.labels(round_.stage.value).inc()
            pool.metrics.fanout.observe(round_.probes)
        if round_.fanned_out:
            pool.metrics.fanouts.inc()
        where.taught(round_, step if isinstance(step, Located) else None)
    assert isinstance(step, Located)  # the round ends in a Located, or raised
    if step.verdict is not None:
        split_brain(pool, healer, session_id, step.verdict, round_.epochs)
    return replace(step, probes=tuple(probes)) if probes else step


def split_brain(
    pool: Pool,
    healer: Healer,
    session_id: SessionId,
    verdict: Verdict,
    epochs: Mapping[BackendId, int],
) -> None:
    """A locate saw ``session_id`` active on more than one backend: count it, and end it
    as ``router.split_brain`` says (:mod:`router.core.split_brain`)."""
    pool.metrics.split_brain.inc()
    stale = ", ".join(verdict.stale)
    if not pool.settings.router.split_brain_policy.acts:
        logger.warning(
            "split brain: session %s is active on %s too; routing to %s (by %s; reported only)",
            session_id,
            stale,
            verdict.home,
            verdict.how.value,
        )
        return
    logger.warning(
        "split brain: session %s is active on %s too; its home is %s (by %s): closing the"
        " stale copies",
        session_id,
        stale,
        verdict.home,
        verdict.how.value,
    )
    marks = {b: epochs.get(b) for b in verdict.stale}
    healer.stale_found(session_id, verdict.stale, verdict.how, marks)


class Audit:
    """Split brain, looked for off the request path.

    A locate that trusted the hinted backend's ``active`` alone queues its session here;
    one task asks the whole pool about each queued session in turn (a full round,
    without the hint), counting a second ``active`` copy in
    ``acp_router_split_brain_detected_total`` and holding the session suspect for
    ``cache.ttl_seconds`` (its resumes then ask everyone and take the best-ranked copy,
    as every replica does), or confirming the hint otherwise. The budget: each trusted locate earns one probe, and
    ``cache.audit_probes_per_second`` more come with time; an audit waits until the
    budget covers its round. So a reconnect storm after a restart costs about two probes
    a resume, not a fan-out each, and split brain is still seen, a little later. The
    queue is bounded (:data:`MAX_QUEUED`: the oldest requests go first).
    """

    def __init__(self, where: Whereabouts, healer: Healer) -> None:
        self._pool = pool = where.pool
        self._where = where
        self._healer = healer
        self._queue: OrderedDict[SessionId, None] = OrderedDict()
        self._budget = AuditBudget(pool.now())
        self._wake = asyncio.Event()

    def request(self, session_id: SessionId) -> None:
        self._budget.earn()  # the probes the trusted locate did not send
        if session_id not in self._queue:
            self._queue[session_id] = None
            while len(self._queue) > MAX_QUEUED:
                self._queue.popitem(last=False)
        self._wake.set()

    async def run(self) -> None:
        """Audit queued sessions, within the budget (:class:`router.core.quotas.AuditBudget`),
        until cancelled."""
        while True:
            if not self._queue:
                self._wake.clear()
                await self._wake.wait()
            rate = self._pool.settings.cache.audit_probes_per_second
            cost = float(len(self._pool.ready()))
            wait = self._budget.spend(cost, rate, self._pool.now())
            if wait > 0:
                await asyncio.sleep(wait)  # the budget refills with time
                continue
            session_id, _ = self._queue.popitem(last=False)
            await self._audit(session_id)

    async def _audit(self, session_id: SessionId) -> None:
        pool = self._pool
        log_context.session.set(session_id)
        outcome = "clean"
        try:
            located = await run_round(self._where, self._healer, session_id, audit=True)
            pool.directory.audited(session_id, located)
            if located.split_brain:
                outcome = "split"
        except (LocateInconclusive, NoBackendAvailable, SessionNotFound):
            outcome = "inconclusive"
        except Exception:  # the audit's boundary: it must not stop auditing
            logger.exception("auditing session %s failed", session_id)
            outcome = "error"
        pool.metrics.audits.labels(outcome).inc()
