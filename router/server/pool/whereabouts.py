"""Where this replica believes each session is: what a locate starts from, where a resume
will most likely go, where a new session goes, and what backends' answers teach it
(docs/architecture.md, "Every rule and its file": the rules are the core's
:class:`~router.core.directory.Directory`, :mod:`~router.core.locate` and
:class:`~router.core.fleet.Fleet`; this is their shell, on the pool's clock)."""

from __future__ import annotations

from router.core.locate import Located, LocateRound, Snapshot
from router.core.placement import Asked
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
        """What a locate of ``session_id`` starts from (:meth:`Directory.snapshot`), the
        pool as it is now."""
        pool = self.pool
        directory = pool.directory
        candidates = pool.fleet.candidates(
            session_id, directory.attached_to(session_id), pool.roster.retired, pool.now()
        )
        return directory.snapshot(
            session_id,
            candidates,
            policy=pool.settings.router.policy,
            tried=tried,
            ask_all=ask_all,
            claimed=claimed,
        )

    def likely(self, session_id: SessionId, claimed: BackendId | None = None) -> BackendId | None:
        """Where a resume of ``session_id`` will most likely go (:meth:`Fleet.likely`);
        ``claimed``: the home its client's hinted id named."""
        pool = self.pool
        directory = pool.directory
        attached, hint = directory.attached_to(session_id), directory.hint(session_id)
        return pool.fleet.likely(session_id, attached, hint, pool.now(), claimed)

    def place_new(self, asked: Asked | None = None) -> BackendId:
        """A backend for a new session (:meth:`router.core.placement.Spread.place`), with
        what its request says (``asked``)."""
        pool = self.pool
        backend = pool.directory.place(pool.fleet.for_new_sessions(pool.now()), asked)
        if backend is None:
            raise NoBackendAvailable()
        return backend

    def learn(self, session_id: SessionId, backend: BackendId, *, created: bool) -> None:
        """A backend's answer shows ``session_id`` living there (:meth:`Directory.learned`),
        unless it left the pool while the answer was on its way."""
        pool = self.pool
        if backend in pool.fleet:
            has_status = pool.can_probe(backend)
            pool.directory.learned(session_id, backend, created=created, has_status=has_status)

    def taught(self, round_: LocateRound, located: Located | None) -> None:
        """What a locate round teaches the directory (:meth:`Directory.located`), on a
        backend still in the pool (not one that left while the answers were on their
        way)."""
        pool = self.pool
        if located is None:
            pool.directory.located(round_, None)
            return
        backend = located.backend
        member, has_status = backend in pool.fleet, pool.can_probe(backend)
        pool.directory.located(round_, located, member=member, has_status=has_status)
