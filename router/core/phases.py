"""The sessions of one client connection, sans-I/O: each in one phase, every move checked.

Rule 1: every change of a session's phase on a connection is made here, by one of the
moves of :data:`TRANSITIONS`, and nowhere else. Rule 2: what a session needs in a phase
is the data of that phase (:class:`Attached`, :class:`Closing`, :class:`Attaching`,
:class:`ClosingElsewhere`, :class:`Orphaned`), so a field cannot outlive the phase it means
something in. A session in no phase is *detached* and is not in the table.

Frames for a session in a *holding* phase (attaching, locating, orphaned) wait, in
arrival order, behind the call that holds it (its resume or load, a close being
located, a failover to come). When the holder settles, the phase ends and the frames
are handed back (:meth:`SessionTable.settle`) to be routed as if they had just arrived;
one of them may hold the session again, and those behind it wait on. Other sessions
are never held. docs/architecture.md draws the machine.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import ClassVar, Final

from router.core.effects import Attach, Change, Detach
from router.protocol.ids import BackendId, SessionId, reserved_id
from router.protocol.jsonrpc import Notification, Request, RequestId

#: a frame that may wait behind its session's holder
Frame = Request | Notification
#: what waits: a notification itself, or a request's id (the request is recorded once,
#: with its call, in :attr:`router.core.client_side.ClientSide.calls`)
Waiting = Notification | RequestId


class Phase(enum.Enum):
    DETACHED = "detached"  # not routed here (not in the table)
    ATTACHED = "attached"  # routed to its backend
    CLOSING = "closing"  # attached, and a close (archive, delete) of it is in flight
    ATTACHING = "attaching"  # a resume or load of it is in flight: later frames wait
    CLOSING_ELSEWHERE = "closing_elsewhere"  # a close of it, not attached here, is out: frames wait
    ORPHANED = "orphaned"  # its link was lost; a failover will resume it: frames wait


class Move(enum.Enum):
    ATTACH = "attach"  # an answer (or an announcement) put it on a backend
    RESUME = "resume"  # a resume or load of it goes out, or a failover's
    CLOSE = "close"  # a close of it goes out
    SETTLE = "settle"  # the call that held it is answered, and attached nothing
    KEEP = "keep"  # the close of it failed: it stays attached
    DETACH = "detach"  # it is no longer routed here (closed, gone from its backend, left)
    LOSE = "lose"  # the link it was routed on ended
    ORPHAN = "orphan"  # the link it was routed on ended; a failover will resume it


_D, _A, _C, _R, _L, _O = (
    Phase.DETACHED,
    Phase.ATTACHED,
    Phase.CLOSING,
    Phase.ATTACHING,
    Phase.CLOSING_ELSEWHERE,
    Phase.ORPHANED,
)

#: (phase, move) -> the phases it may lead to: the one table of every move a session makes
TRANSITIONS: Mapping[tuple[Phase, Move], frozenset[Phase]] = {
    (_D, Move.ATTACH): frozenset({_A}),  # session/new, fork, or a child announced
    (_D, Move.RESUME): frozenset({_R}),
    (_D, Move.CLOSE): frozenset({_L}),
    (_A, Move.ATTACH): frozenset({_A}),  # a session made again under a known id
    (_A, Move.RESUME): frozenset({_R}),
    (_A, Move.CLOSE): frozenset({_C}),
    (_A, Move.DETACH): frozenset({_D}),
    (_A, Move.LOSE): frozenset({_D}),
    (_A, Move.ORPHAN): frozenset({_O}),
    (_C, Move.RESUME): frozenset({_R}),
    (_C, Move.KEEP): frozenset({_A}),
    (_C, Move.DETACH): frozenset({_D}),
    (_C, Move.LOSE): frozenset({_D}),
    (_R, Move.ATTACH): frozenset({_A}),  # the resume (or load) succeeded
    # it failed: the session rests where it was attached, if anywhere
    (_R, Move.SETTLE): frozenset({_A, _D}),
    (_R, Move.DETACH): frozenset({_R}),  # where it was attached is given up meanwhile
    (_R, Move.LOSE): frozenset({_R}),
    (_L, Move.SETTLE): frozenset({_D}),
    (_O, Move.RESUME): frozenset({_R}),  # the failover's resume goes out
    (_O, Move.SETTLE): frozenset({_D}),  # no failover after all
}


class InvalidMove(AssertionError):
    """A move :data:`TRANSITIONS` does not allow: a bug in the core, never the peer's doing."""


class Lifecycle(enum.Enum):
    """A client connection's own phase (its sessions' are :class:`SessionTable`'s)."""

    NEW = "new"  # no initialize yet: nothing but initialize is routed
    OPEN = "open"  # initialized: frames are routed
    STOPPING = "stopping"  # the router closes it: every request gets RouterStopping
    GONE = "gone"  # its client has gone: nothing more comes or goes


#: the phases in which a connection takes no more requests (:attr:`Connection.closed`)
#: (a tuple: ``in`` finds a member by identity, where a set calls Enum.__hash__, in Python)
CLOSED: Final = (Lifecycle.STOPPING, Lifecycle.GONE)


class ConnectionMove(enum.Enum):
    INITIALIZE = "initialize"  # an initialize is routed (the first, or one again)
    STOP = "stop"  # the router closes it (ending.abandon)
    GO = "go"  # the client has gone (ending.client_gone)


#: (phase, move) -> the phase it leads to: the one table of every move a connection makes
LIFECYCLE: Mapping[tuple[Lifecycle, ConnectionMove], Lifecycle] = {
    (Lifecycle.NEW, ConnectionMove.INITIALIZE): Lifecycle.OPEN,
    (Lifecycle.OPEN, ConnectionMove.INITIALIZE): Lifecycle.OPEN,  # replayed on new links
    (Lifecycle.NEW, ConnectionMove.STOP): Lifecycle.STOPPING,
    (Lifecycle.OPEN, ConnectionMove.STOP): Lifecycle.STOPPING,
    (Lifecycle.STOPPING, ConnectionMove.STOP): Lifecycle.STOPPING,  # closed twice at once
    (Lifecycle.NEW, ConnectionMove.GO): Lifecycle.GONE,
    (Lifecycle.OPEN, ConnectionMove.GO): Lifecycle.GONE,
    (Lifecycle.STOPPING, ConnectionMove.GO): Lifecycle.GONE,
}


class Connection:
    """One client connection's phase (:data:`LIFECYCLE`), and its ``initialize``, the
    data of the open phase (replayed on every link opened)."""

    def __init__(self) -> None:
        self.phase = Lifecycle.NEW
        self.initialize: Request | None = None

    @property
    def closed(self) -> bool:
        """Whether it takes no more requests (the router closes it, or its client went)."""
        return self.phase in CLOSED

    def initialized(self, request: Request) -> None:
        """``request``, an ``initialize``, is routed."""
        self._move(ConnectionMove.INITIALIZE)
        self.initialize = request

    def stop(self) -> None:
        self._move(ConnectionMove.STOP)

    def gone(self) -> None:
        self._move(ConnectionMove.GO)

    def _move(self, move: ConnectionMove) -> None:
        after = LIFECYCLE.get((self.phase, move))
        if after is None:
            raise InvalidMove(f"connection: {move.value} from {self.phase.value}")
        self.phase = after


@dataclass(slots=True)
class Attached:
    phase: ClassVar[Phase] = Phase.ATTACHED
    backend: BackendId
    #: the client's request that attached it (None: a child a backend announced): a
    #: failover resumes it with these params
    by: Request | None = None


@dataclass(slots=True)
class Closing:
    phase: ClassVar[Phase] = Phase.CLOSING
    backend: BackendId
    by: Request | None = None


@dataclass(slots=True)
class Attaching:
    phase: ClassVar[Phase] = Phase.ATTACHING
    holder: RequestId
    #: where it is attached meanwhile (a resume of an attached session), if anywhere
    backend: BackendId | None = None
    by: Request | None = None
    waiting: deque[Waiting] | None = None  # made on the first frame that waits


@dataclass(slots=True)
class ClosingElsewhere:
    phase: ClassVar[Phase] = Phase.CLOSING_ELSEWHERE
    holder: RequestId
    waiting: deque[Waiting] | None = None


@dataclass(slots=True)
class Orphaned:
    phase: ClassVar[Phase] = Phase.ORPHANED
    holder: RequestId
    by: Request
    waiting: deque[Waiting] | None = None


State = Attached | Closing | Attaching | ClosingElsewhere | Orphaned
Holding = Attaching | ClosingElsewhere | Orphaned

# the states isinstance asks of, built once (``A | B`` in a call builds a union each time:
# 2.6x the check itself, and SessionTable.backend runs for every session-scoped request)
#: a state whose frames go to its backend
_ROUTED: Final = (Attached, Closing, Attaching)
#: a state a resume starts from with what it knew
_RESUMABLE: Final = (Attached, Closing, Orphaned)
#: a state on a backend, no holder
_ON_BACKEND: Final = (Attached, Closing)


class SessionTable:
    """The connection's sessions, each in its phase. Bounded by its owner: sessions
    attached (``Limits.max_sessions``) plus those with calls or frames in flight
    (``Limits.max_in_flight``)."""

    def __init__(self) -> None:
        self._table: dict[SessionId, State] = {}

    def __len__(self) -> int:
        return len(self._table)

    def __iter__(self) -> Iterator[SessionId]:
        return iter(self._table)

    def phase(self, session_id: SessionId) -> Phase:
        state = self._table.get(session_id)
        return Phase.DETACHED if state is None else state.phase

    def _move(self, session_id: SessionId, move: Move, after: State | None) -> None:
        before = self.phase(session_id)
        allowed = TRANSITIONS.get((before, move), frozenset())
        if (Phase.DETACHED if after is None else after.phase) not in allowed:
            raise InvalidMove(f"{session_id}: {move.value} from {before.value}")
        if after is None:
            del self._table[session_id]
        else:
            self._table[session_id] = after

    # -- reading -------------------------------------------------------------------------------

    def backend(self, session_id: SessionId) -> BackendId | None:
        """Where ``session_id`` is routed on this connection, if anywhere."""
        state = self._table.get(session_id)
        return state.backend if isinstance(state, _ROUTED) else None

    def attached(self) -> dict[SessionId, BackendId]:
        """Every session routed to a backend here, and that backend."""
        return {s: b for s in self._table if (b := self.backend(s)) is not None}

    def count_attached(self) -> int:
        return sum(1 for s in self._table if self.backend(s) is not None)

    def on(self, backend: BackendId) -> list[SessionId]:
        """The sessions routed to ``backend``."""
        return [s for s in self._table if self.backend(s) == backend]

    def attached_by(self, session_id: SessionId) -> Request | None:
        state = self._table.get(session_id)
        return None if isinstance(state, ClosingElsewhere) or state is None else state.by

    def holding(self, session_id: SessionId) -> bool:
        """Whether a frame for ``session_id`` must wait behind a holder."""
        return isinstance(self._table.get(session_id), Holding)

    def resuming(self, session_id: SessionId) -> RequestId | None:
        """The resume or load ``session_id`` is attaching by, while its answer is out."""
        state = self._table.get(session_id)
        return state.holder if isinstance(state, Attaching) else None

    def held_by(self, session_id: SessionId, holder: RequestId) -> bool:
        state = self._table.get(session_id)
        return isinstance(state, Holding) and state.holder == holder

    # -- moves ---------------------------------------------------------------------------------

    def attach(
        self, session_id: SessionId, backend: BackendId, by: Request | None = None
    ) -> tuple[Change, ...]:
        """``session_id``, detached or attached, is routed to ``backend`` now (a session
        made there, or a child announced there): what changed, for the directory."""
        state = self._table.get(session_id)
        if not (state is None or isinstance(state, Attached)):  # it would forget its holder
            raise InvalidMove(f"{session_id}: attach from {state.phase.value}")
        previous = None if state is None else state.backend
        if by is None and state is not None:
            by = state.by
        self._move(session_id, Move.ATTACH, Attached(backend, by))
        return _changes(session_id, previous, backend)

    def resume(self, session_id: SessionId, holder: RequestId) -> None:
        """A resume or load of ``session_id`` goes out (``holder``): later frames wait."""
        state = self._table.get(session_id)
        waiting = state.waiting if isinstance(state, Orphaned) else None
        if isinstance(state, _RESUMABLE):
            backend = None if isinstance(state, Orphaned) else state.backend
            after = Attaching(holder, backend, state.by, waiting)
        else:
            after = Attaching(holder)
        self._move(session_id, Move.RESUME, after)

    def close(self, session_id: SessionId, holder: RequestId) -> None:
        """A close (archive, delete) of ``session_id`` goes out: an attached session is
        closing (its frames still go to its backend); one not attached here is being
        located, and later frames wait."""
        state = self._table.get(session_id)
        if isinstance(state, Attached):
            self._move(session_id, Move.CLOSE, Closing(state.backend, state.by))
        elif state is None:
            self._move(session_id, Move.CLOSE, ClosingElsewhere(holder))

    def keep(self, session_id: SessionId) -> None:
        """The close of an attached session failed: it stays attached."""
        state = self._table.get(session_id)
        if isinstance(state, Closing):
            self._move(session_id, Move.KEEP, Attached(state.backend, state.by))

    def detach(self, session_id: SessionId) -> Detach | None:
        """``session_id`` is no longer routed to its backend here; a held one stays held."""
        state = self._table.get(session_id)
        if isinstance(state, _ON_BACKEND):
            self._move(session_id, Move.DETACH, None)
            return Detach(session_id, state.backend)
        if isinstance(state, Attaching) and state.backend is not None:
            backend, state.backend = state.backend, None
            self._move(session_id, Move.DETACH, state)
            return Detach(session_id, backend)
        return None

    def lose(self, backend: BackendId, *, orphan: bool) -> tuple[list[Detach], list[SessionId]]:
        """The link to ``backend`` ended: its sessions are detached, and, with ``orphan``
        (failover), those a client request attached are kept for a failover, their
        frames waiting. What was detached, and what was orphaned."""
        detached: list[Detach] = []
        orphaned: list[SessionId] = []
        for session_id in self.on(backend):
            state = self._table[session_id]
            detached.append(Detach(session_id, backend))
            if orphan and isinstance(state, Attached) and state.by is not None:
                holder = orphan_holder(session_id)
                self._move(session_id, Move.ORPHAN, Orphaned(holder, state.by))
                orphaned.append(session_id)
            elif isinstance(state, Attaching):
                state.backend = None
                self._move(session_id, Move.LOSE, state)
            else:
                self._move(session_id, Move.LOSE, None)
        return detached, orphaned

    def settle(
        self,
        session_id: SessionId,
        holder: RequestId,
        attach_to: BackendId | None = None,
        by: Request | None = None,
    ) -> tuple[tuple[Change, ...], deque[Waiting] | None]:
        """``holder`` is answered. If it held ``session_id``, the session is attached to
        ``attach_to`` (a resume or load that succeeded, ``by`` it), or else rests where it
        was (attached, or detached); what changed, and the frames that waited, in arrival
        order, to be routed now."""
        state = self._table.get(session_id)
        if not isinstance(state, Holding) or state.holder != holder:
            return (), None
        previous = state.backend if isinstance(state, Attaching) else None
        if attach_to is not None:
            self._move(session_id, Move.ATTACH, Attached(attach_to, by))
            return _changes(session_id, previous, attach_to), state.waiting
        if previous is not None:
            by = state.by if isinstance(state, Attaching) else None
            self._move(session_id, Move.SETTLE, Attached(previous, by))
        else:
            self._move(session_id, Move.SETTLE, None)
        return (), state.waiting

    def wait(self, session_id: SessionId, frame: Waiting) -> None:
        """``frame`` (a notification, or a request's id) waits behind the holder of
        ``session_id`` (:meth:`holding`)."""
        state = self._table.get(session_id)
        if not isinstance(state, Holding):
            raise InvalidMove(f"{session_id}: a frame waits behind no holder")
        if state.waiting is None:
            state.waiting = deque()
        state.waiting.append(frame)

    def drop_waiting(self) -> None:
        """Forget every frame that waits (their requests were answered otherwise) and
        every holder: each held session rests where it was."""
        for session_id in list(self._table):
            state = self._table[session_id]
            if isinstance(state, Holding):
                state.waiting = None
                self.settle(session_id, state.holder)

    def detach_all(self) -> tuple[Detach, ...]:
        """The client connection is gone: every session is detached."""
        detached = [self.detach(s) for s in list(self._table)]
        return tuple(d for d in detached if d is not None)


def _changes(
    session_id: SessionId, previous: BackendId | None, backend: BackendId
) -> tuple[Change, ...]:
    if previous == backend:
        return ()
    detached = () if previous is None else (Detach(session_id, previous),)
    return (*detached, Attach(session_id, backend))


def orphan_holder(session_id: SessionId) -> str:
    """What an orphaned session waits behind until its failover starts (an id in the
    router's own space, so no client request can be it)."""
    return reserved_id(f"orphan:{session_id}")
