"""The check of attached sessions, off the request path: every ``control.heartbeat_seconds``
the sessions attached through this router are asked about again, across the pool, so a
replica whose clients are attached to a copy the fleet has moved away from (another
replica resumed the session elsewhere during a fault this one did not see) finds out
within a heartbeat, not at its next resume. What a check finds is the core's
(:func:`router.core.split_brain.check_attached`): stale copies are closed as a split
brain is, and the connections attached to them, or to a copy their agent no longer has,
detach it (their clients get ``-32010`` and resume it again, where it lives).

A check costs one probe per backend that is up; the checks spend a budget of their own
of ``cache.audit_probes_per_second`` (:class:`router.core.quotas.AuditBudget`), so a
replica with more attached sessions than that covers checks them over several beats
(the oldest checked first), and the pool is never asked more than the budget says.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict

from router.core import split_brain
from router.core.quotas import AuditBudget
from router.protocol.ids import SessionId
from router.server.observability import log_context
from router.server.pool.backends import Pool
from router.server.pool.healing import Healer

logger = logging.getLogger(__name__)

#: sessions checked at once
CHECK_AT_ONCE = 32


class Sweep:
    def __init__(self, pool: Pool, healer: Healer) -> None:
        self._pool = pool
        self._healer = healer
        #: attached sessions waiting for their check, the longest waiting first (bounded
        #: by the sessions attached here, which the directory bounds)
        self._queue: OrderedDict[SessionId, None] = OrderedDict()
        self._budget = AuditBudget(pool.now())

    async def run(self) -> None:
        """Check the attached sessions every heartbeat, until cancelled."""
        pool = self._pool
        while True:
            await asyncio.sleep(pool.settings.control.heartbeat_seconds)  # the beat: a timer
            for session_id in pool.directory.attachments:
                self._queue.setdefault(session_id, None)
            await self._beat()

    async def _beat(self) -> None:
        """Check queued sessions while the budget covers them; the rest wait for the next
        beat."""
        pool = self._pool
        while self._queue:
            rate = pool.settings.cache.audit_probes_per_second
            chunk: list[SessionId] = []
            while self._queue and len(chunk) < CHECK_AT_ONCE:
                cost = float(max(len(pool.ready()), 1))
                if self._budget.spend(cost, rate, pool.now()) > 0:
                    break
                session_id, _ = self._queue.popitem(last=False)
                chunk.append(session_id)
            if not chunk:
                return
            await asyncio.gather(*(self.check(s) for s in chunk))

    async def check(self, session_id: SessionId) -> None:
        """Ask the pool about ``session_id``, attached here, and act on what the core
        makes of the answers."""
        pool = self._pool
        directory = pool.directory
        attached = directory.attached_to(session_id)
        if not attached:
            return
        log_context.session.set(session_id)
        targets = [*pool.ready(), *(b for b in attached if b not in pool.ready())]
        answers = await pool.probe_answers(targets, session_id)
        hint = directory.hint(session_id)
        # judged only where it was attached before the probes went out (and still is): a
        # resume answered meanwhile may have come after its probe there
        attached &= directory.attached_to(session_id)
        checked = split_brain.check_attached(
            answers,
            order=pool.fleet.ranking.rank(session_id),
            attached=attached,
            mixed={b for b in attached if pool.fleet.mixed(b)},
            placed=hint.backend if hint is not None else None,
        )
        outcome = "clean"
        if checked.stale:
            assert checked.how is not None
            outcome = "split"
            pool.metrics.split_brain.inc()
            logger.warning(
                "split brain: session %s, attached here, has stale copies on %s (the home"
                " chosen by %s)",
                session_id,
                ", ".join(checked.stale),
                checked.how.value,
            )
            marks = split_brain.mark(checked.stale, answers)
            self._healer.stale_found(session_id, checked.stale, checked.how, marks)
        if checked.denied:
            outcome = "split" if checked.stale else "denied"
            logger.info(
                "session %s, attached here to %s, is no longer in memory there: its"
                " connections here detach it",
                session_id,
                ", ".join(checked.denied),
            )
            pool.detach_stale(session_id, checked.denied)
        pool.metrics.attached_checks.labels(outcome).inc()
