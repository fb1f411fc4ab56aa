"""Healing the pool after a fault, in the shell: closing the stale copies of sessions
(a split brain judged, :mod:`router.core.split_brain`), and fencing a backend that comes
back as the same process after it was given up (:mod:`router.core.health`): its copies of
sessions that live elsewhere now are closed before it takes traffic."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from router.core.fencing import FenceRound, Fencing
from router.core.health import Fenced
from router.core.locate import Ask
from router.core.split_brain import How, StaleMarks
from router.protocol import acp
from router.protocol.errors import BackendLinkLost
from router.protocol.ids import BackendId, SessionId
from router.server.pool.backends import Pool

logger = logging.getLogger(__name__)

#: sessions a fence asks a returning backend about at once
FENCE_AT_ONCE = 32

#: stale copies of sessions being closed at once, at most
MAX_CLOSING = 1024


class Healer:
    def __init__(self, pool: Pool) -> None:
        self._pool = pool
        #: backends being fenced
        self._fences: dict[BackendId, asyncio.Task[None]] = {}
        #: stale copies being closed
        self._closing: set[tuple[SessionId, BackendId]] = set()
        pool.on_return = self.fence_soon

    # -- fencing a backend back after it was given up ------------------------------------------

    def fence_soon(self, backend: BackendId) -> None:
        pool = self._pool
        if backend not in self._fences:
            task = pool.spawn(self._fence(backend), f"fence-{backend}")
            if task is not None:
                self._fences[backend] = task
                task.add_done_callback(lambda _: self._fences.pop(backend, None))

    async def _fence(self, backend: BackendId) -> None:
        """``backend`` came back as the same process after it was given up: close its
        copies of the sessions that live elsewhere now (:func:`router.core.split_brain.fence`), then let
        it take traffic. Its sessions are asked about :data:`FENCE_AT_ONCE` at a time."""
        pool = self._pool
        sessions = pool.directory.to_fence(backend)
        logger.warning(
            "backend %s is back as the same process after it was given up: fencing it"
            " (%d sessions to check) before it takes traffic",
            backend,
            len(sessions),
        )
        for start in range(0, len(sessions), FENCE_AT_ONCE):
            chunk = sessions[start : start + FENCE_AT_ONCE]
            await asyncio.gather(*(self._fence_one(backend, s) for s in chunk))
        logger.info("backend %s is fenced", backend)
        pool.hear(backend, Fenced())

    async def _fence_one(self, backend: BackendId, session_id: SessionId) -> None:
        """The probes of a fence of ``session_id`` on ``backend``
        (:class:`router.core.fencing.FenceRound`), and the closes of the copies it finds
        stale: the returning one, or, where its epoch is the highest (another replica
        resumed it there since), the others."""
        pool = self._pool
        directory = pool.directory
        hint = directory.hint(session_id)
        round_ = FenceRound(
            backend,
            pool.ready(),
            order=pool.fleet.ranking.rank(session_id),
            attached=directory.attached_to(session_id),
            hinted=hint.backend if hint is not None else None,
        )
        step: Ask | Fencing = round_.start()
        while isinstance(step, Ask):
            step = round_.hear(await pool.probe_answers(step.backends, session_id))
        stale = step.stale
        if not stale:
            return
        directory.mark_stale(session_id, step.marks)
        for copy in stale:  # closed before the backend takes traffic
            if self._can_close(copy, session_id):
                await self._close(session_id, copy, How.FENCED)
        pool.detach_stale(session_id, stale)

    def stale_found(
        self, session_id: SessionId, stale: Sequence[BackendId], how: How, marks: StaleMarks
    ) -> None:
        """The copies of ``session_id`` on ``stale`` are not its home (a split brain
        judged; ``marks``: the epoch each reported): no resume goes there while it stays
        at that epoch, and, as ``router.split_brain`` says, they are
        closed (in the background), and this replica's clients attached to them are told
        to resume again."""
        pool = self._pool
        if not pool.settings.router.split_brain_policy.acts:
            return
        pool.directory.mark_stale(session_id, marks)
        for backend in stale:
            self.close_stale(session_id, backend, how)
        pool.detach_stale(session_id, stale)

    # -- stale copies --------------------------------------------------------------------------

    def close_stale(self, session_id: SessionId, backend: BackendId, how: How) -> None:
        """Close the stale copy of ``session_id`` on ``backend`` (``session/close`` on its
        control link), in the background; where the backend cannot close sessions, it is
        only kept out of that session's resumes (the directory's stale mark), and said."""
        pool = self._pool
        key = (session_id, backend)
        if key in self._closing or len(self._closing) >= MAX_CLOSING:
            return  # under way, or too many at once: the stale mark keeps resumes off it
        if not self._can_close(backend, session_id):
            return
        self._closing.add(key)
        task = pool.spawn(self._close(session_id, backend, how), f"close-stale-{backend}")
        if task is None:
            self._closing.discard(key)
        else:
            task.add_done_callback(lambda _: self._closing.discard(key))

    def _can_close(self, backend: BackendId, session_id: SessionId) -> bool:
        """Whether ``backend`` can close sessions; if not, it is said and counted (its
        stale copy is only kept out of the session's resumes)."""
        if self._pool.fleet.can_ask(backend, "close"):
            return True
        logger.warning(
            "backend %s holds a stale copy of session %s and cannot close it (no"
            " session/close): it gets no resume of that session while the router remembers;"
            " its operator should restart it",
            backend,
            session_id,
        )
        self._pool.metrics.split_brain_resolved.labels("kept_out").inc()
        return False

    async def _close(self, session_id: SessionId, backend: BackendId, how: How) -> None:
        pool = self._pool
        link = pool.links.get(backend)
        if link is None:
            return
        timeout = pool.settings.probe.list_timeout_ms / 1000
        try:
            response = await link.call(
                acp.SESSION_CLOSE, {"sessionId": session_id}, timeout=timeout
            )
        except (TimeoutError, BackendLinkLost) as exc:
            logger.warning(
                "closing the stale copy of session %s on backend %s failed (%s): it gets no"
                " resume of it meanwhile",
                session_id,
                backend,
                type(exc).__name__,
            )
            return
        error = response.error
        if error is not None and error.code != acp.RESOURCE_NOT_FOUND:
            logger.warning(
                "backend %s refused to close the stale copy of session %s: %s",
                backend,
                session_id,
                error.message,
            )
            return
        logger.info("closed the stale copy of session %s on backend %s", session_id, backend)
        pool.metrics.split_brain_resolved.labels(how.value).inc()
