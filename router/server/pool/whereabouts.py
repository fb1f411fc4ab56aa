"""Where this replica believes each session is: what a locate starts from, where a resume
will most likely go, where a new session goes, and what backends' answers teach it
(docs/architecture.md, "Every rule and its file": the rules are the core's
:class:`~router.core.directory.Directory`, :mod:`~router.core.locate` and
:class:`~router.core.fleet.Fleet`; this is their shell, on the pool's clock)."""

from __future__ import annotations

from router.core.locate import Snapshot, first_guess, hint_after_answer, lasting
from router.protocol import acp
from router.protocol.acp import ProbeResult
from router.protocol.errors import NoBackendAvailable
from router.protocol.ids import BackendId, SessionId
from router.server.pool.backends import Pool


class Whereabouts:
    """The pool's directory of sessions, read and taught on the pool's clock."""

    def __init__(self, pool: Pool) -> None:
        self.pool = pool

    def snapshot(
        self,
        session_id: SessionId,
        tried: tuple[BackendId, ...] = (),
        *,
        ask_all: bool = False,
        claimed: BackendId | None = None,
    ) -> Snapshot:
        """What a locate of ``session_id`` starts from (:class:`router.core.locate.Snapshot`);
        ``ask_all``: the whole pool is asked (an audit), as it is for a session seen split
        lately; ``claimed``: the home the client's hinted id named (a member, or nothing)."""
        pool = self.pool
        directory = pool.directory
        candidates = pool.fleet.candidates(
            session_id, directory.attached_to(session_id), pool.roster.retired, pool.now()
        )
        refused = directory.absences.resumed(session_id)
        return Snapshot(
            session_id,
            candidates,
            directory.hint(session_id),
            pool.settings.router.policy,
            (*tried, *(b for b in sorted(refused) if b not in tried)),
            directory.absences.probed(session_id),
            directory.stale.get(session_id, frozenset()),
            ask_all or session_id in directory.suspects,
            self._member(claimed),
        )

    def likely(self, session_id: SessionId, claimed: BackendId | None = None) -> BackendId | None:
        """Where a resume of ``session_id`` will most likely go (:meth:`Fleet.likely`);
        ``claimed``: the home its client's hinted id named."""
        pool = self.pool
        directory = pool.directory
        hint = first_guess(directory.hint(session_id), self._member(claimed))
        return pool.fleet.likely(session_id, directory.attached_to(session_id), hint, pool.now())

    def _member(self, claimed: BackendId | None) -> BackendId | None:
        """A client's claim, when it names a member of the pool."""
        return claimed if claimed in self.pool.links else None

    def place_new(self) -> BackendId:
        """A backend for a new session (:meth:`router.core.placement.Spread.place`)."""
        pool = self.pool
        backend = pool.directory.place(pool.fleet.for_new_sessions(pool.now()))
        if backend is None:
            raise NoBackendAvailable()
        return backend

    def learn(self, session_id: SessionId, backend: BackendId, *, created: bool) -> None:
        """A backend's answer shows ``session_id`` living there: remember it
        (:func:`router.core.locate.hint_after_answer`)."""
        directory = self.pool.directory
        directory.absences.forget(session_id)
        checked = hint_after_answer(directory.hint(session_id), backend, created, self.pool.now())
        self.remember(session_id, backend, checked)
        # what the admin page shows until a probe says more
        directory.hear(session_id, {backend: acp.StatusAnswer(ProbeResult.ACTIVE)})

    def remember(self, session_id: SessionId, backend: BackendId, checked: float | None) -> None:
        """Keep a hint that ``session_id`` lives on ``backend`` (a member of the pool)."""
        pool = self.pool
        if backend in pool.fleet:  # not one that left while the answer was on its way
            lasts = lasting(has_status=pool.can_probe(backend))
            pool.directory.remember(session_id, backend, checked, lasting=lasts)
