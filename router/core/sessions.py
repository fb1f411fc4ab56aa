"""The sessions of one client connection, sans-I/O: where each is routed, and the frames
that wait behind its resume, load or close.

Each session is in one :class:`Phase`. Frames for a session wait, in arrival order,
while a call that decides where it lives is in flight (its *holder*: a
``session/resume`` or ``session/load``, or a ``session/close`` of a session not attached
here, which is being located); once that call settles they are released one at a
time (:meth:`SessionTable.next_released`), and frames that arrive meanwhile queue
behind them. Other sessions are never held.
"""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass

from router.core.actions import Attach, Change, Detach
from router.protocol.ids import BackendId, SessionId
from router.protocol.jsonrpc import Notification, Request, RequestId


class Phase(enum.Enum):
    DETACHED = "detached"  # not routed here (listed only while frames wait to be released)
    ATTACHING = "attaching"  # a resume or load is in flight: later frames wait
    ATTACHED = "attached"  # routed to its backend
    RELEASING = "releasing"  # a close, archive or delete is in flight: it detaches when done


@dataclass(slots=True)
class _Session:
    phase: Phase
    #: where it is attached (kept while a resume of an attached session is in flight)
    backend: BackendId | None = None
    #: the call later frames wait behind
    holder: RequestId | None = None
    #: made on the first frame that waits (an empty deque is ~600 B of every session)
    waiting: deque[Request | Notification] | None = None
    #: the client's request that attached it (session/new, resume or load; None for a
    #: child session a backend announced): a failover resumes it with these params
    attached_by: Request | None = None


class SessionTable:
    """The connection's sessions. Bounded by its owner: sessions attached
    (``Limits.max_sessions``) plus those with calls or frames in flight
    (``Limits.max_in_flight``)."""

    def __init__(self) -> None:
        self._table: dict[SessionId, _Session] = {}
        self._releasable: dict[SessionId, None] = {}  # an ordered set

    def phase(self, session_id: SessionId) -> Phase:
        entry = self._table.get(session_id)
        return Phase.DETACHED if entry is None else entry.phase

    def backend(self, session_id: SessionId) -> BackendId | None:
        """Where ``session_id`` is attached on this connection, if it is."""
        entry = self._table.get(session_id)
        return None if entry is None else entry.backend

    def attached(self) -> dict[SessionId, BackendId]:
        """Every attached session and its backend."""
        return {s: e.backend for s, e in self._table.items() if e.backend is not None}

    def count_attached(self) -> int:
        return sum(1 for e in self._table.values() if e.backend is not None)

    def on(self, backend: BackendId) -> list[SessionId]:
        """The sessions attached to ``backend``."""
        return [s for s, e in self._table.items() if e.backend == backend]

    # -- attaching and detaching -------------------------------------------------------------

    def attach(
        self, session_id: SessionId, backend: BackendId, by: Request | None = None
    ) -> tuple[Change, ...]:
        """Route ``session_id`` to ``backend`` (``by`` attached it); what changed (a move
        detaches it first)."""
        entry = self._entry(session_id)
        previous = entry.backend
        if by is not None:
            entry.attached_by = by
        if previous == backend:
            return ()
        entry.backend = backend
        if entry.holder is None:
            entry.phase = Phase.ATTACHED
        detached = () if previous is None else (Detach(session_id, previous),)
        return (*detached, Attach(session_id, backend))

    def attached_by(self, session_id: SessionId) -> Request | None:
        entry = self._table.get(session_id)
        return None if entry is None else entry.attached_by

    def detach(self, session_id: SessionId) -> Detach | None:
        entry = self._table.get(session_id)
        if entry is None or entry.backend is None:
            return None
        backend, entry.backend = entry.backend, None
        if entry.holder is None:
            entry.phase = Phase.DETACHED
        self._tidy(session_id)
        return Detach(session_id, backend)

    def releasing(self, session_id: SessionId) -> None:
        """A close of the attached ``session_id`` went to its backend."""
        entry = self._table.get(session_id)
        if entry is not None and entry.holder is None:
            entry.phase = Phase.RELEASING

    def kept(self, session_id: SessionId) -> None:
        """The close of an attached session failed: it stays attached."""
        entry = self._table.get(session_id)
        if entry is not None and entry.holder is None and entry.backend is not None:
            entry.phase = Phase.ATTACHED

    # -- frames that wait ----------------------------------------------------------------------

    def holding(self, session_id: SessionId) -> bool:
        """Whether a frame for ``session_id`` must wait (a holder in flight, or frames
        ahead of it still waiting)."""
        entry = self._table.get(session_id)
        return entry is not None and (entry.holder is not None or bool(entry.waiting))

    def hold(self, session_id: SessionId, holder: RequestId, phase: Phase) -> None:
        """``holder`` (attaching or releasing ``session_id``) is in flight: later frames
        for the session wait behind it."""
        entry = self._entry(session_id)
        entry.holder, entry.phase = holder, phase
        self._releasable.pop(session_id, None)

    def held_by(self, session_id: SessionId, holder: RequestId) -> bool:
        entry = self._table.get(session_id)
        return entry is not None and entry.holder == holder

    def wait(self, session_id: SessionId, frame: Request | Notification) -> None:
        entry = self._table[session_id]
        if entry.waiting is None:
            entry.waiting = deque()
        entry.waiting.append(frame)

    def settled(self, session_id: SessionId, request_id: RequestId) -> None:
        """``request_id`` is answered: if it held ``session_id``, its frames may go."""
        entry = self._table.get(session_id)
        if entry is None or entry.holder != request_id:
            return
        entry.holder = None
        entry.phase = Phase.ATTACHED if entry.backend is not None else Phase.DETACHED
        if entry.waiting:
            self._releasable[session_id] = None
        else:
            self._tidy(session_id)

    def next_released(self) -> Request | Notification | None:
        """The oldest frame that waited behind a settled holder, or None."""
        session_id = next(iter(self._releasable), None)
        if session_id is None:
            return None
        entry = self._table[session_id]
        assert entry.waiting  # only sessions with waiting frames are releasable
        frame = entry.waiting.popleft()
        if not entry.waiting:
            del self._releasable[session_id]
            self._tidy(session_id)
        return frame

    def drop_waiting(self) -> None:
        """Forget every frame that waits (their requests were answered otherwise) and
        every holder: nothing is released any more."""
        self._releasable.clear()
        for session_id in list(self._table):
            entry = self._table[session_id]
            entry.waiting = None
            entry.holder = None
            entry.phase = Phase.ATTACHED if entry.backend is not None else Phase.DETACHED
            self._tidy(session_id)

    def any_released(self) -> bool:
        """Whether a frame that waited can go now (:meth:`next_released`)."""
        return bool(self._releasable)

    def releasable(self) -> list[SessionId]:
        """Sessions whose waiting frames can go, in the order they will."""
        return list(self._releasable)

    def _entry(self, session_id: SessionId) -> _Session:
        entry = self._table.get(session_id)
        if entry is None:
            entry = self._table[session_id] = _Session(Phase.DETACHED)
        return entry

    def _tidy(self, session_id: SessionId) -> None:
        entry = self._table[session_id]
        if entry.backend is None and entry.holder is None and not entry.waiting:
            del self._table[session_id]
