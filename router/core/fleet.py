"""The pool's members as one router replica sees them, sans-I/O: their health, what an
operator set, which are leaving DNS, what each advertises; and the rules that read them:
which backend may take a new session, which a locate may ask, which a resume will most
likely need.

The shell (:class:`router.server.pool.members.Pool`) feeds it what its links see, as
:mod:`router.core.health` events, and asks it; every reading takes ``now`` (the shell's
monotonic clock, in seconds): nothing here reads a clock.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from router.core.health import BackendState, CameUp, Event, Health, Transition, transition
from router.core.hints import Hint
from router.core.locate import AdminState, Candidate, first_guess
from router.core.placement import Node, Ranking
from router.protocol import acp
from router.protocol.ids import BackendId, SessionId


@dataclass(frozen=True, slots=True)
class FirstContact:
    """Members not heard from since they joined, and until when to wait for them."""

    backends: tuple[BackendId, ...]
    until: float


@dataclass(frozen=True, slots=True)
class Leaving:
    """What a DNS source's new answer did (:meth:`Fleet.left_dns`)."""

    #: missing from it, not gone: still members, leaving
    kept: frozenset[BackendId]
    #: of those, the ones that started leaving just now
    newly: tuple[BackendId, ...]
    #: leaving before, gone now: out of the pool
    gone: tuple[BackendId, ...]


@dataclass(frozen=True, slots=True)
class Heard:
    """What one health event did to a backend."""

    before: BackendState
    step: Transition

    @property
    def up_changed(self) -> bool:
        """Whether it turned up, or stopped being up."""
        return (self.before.health is Health.UP) != (self.step.state.health is Health.UP)

    @property
    def faulted(self) -> bool:
        """Whether it stopped answering just now: it was up and answering, and its control
        link went down or it went silent. What this replica believed of the sessions
        there is in doubt (:meth:`router.core.directory.Directory.doubt`): another
        replica may have moved them meanwhile."""
        before, after = self.before, self.step.state
        was = before.health is Health.UP and not before.silent
        return was and (after.health is not Health.UP or after.silent)

    @property
    def gave_up(self) -> bool:
        """Whether it was given up just now: it lost its memory past the grace (or came
        back as the same process after that, to be fenced), so what this replica knew on
        it is kept for a fence (:meth:`router.core.directory.Directory.give_up`)."""
        step = self.step
        return step.lost_memory and (step.state.health is Health.GONE or step.fence)

    @property
    def now_gone(self) -> bool:
        """Whether it was declared gone just now (it held nothing in memory any more)."""
        return self.step.state.health is Health.GONE and self.before.health is not Health.GONE


class Fleet:
    """Members (in configuration order), their health, their admin state and their
    capabilities."""

    def __init__(self, grace: float) -> None:
        #: ``control.down_grace_ms`` in seconds (:mod:`router.core.health`)
        self.grace = grace
        self.ranking = Ranking(())
        self.states: dict[BackendId, BackendState] = {}
        #: backends an operator drained or put in maintenance (absent: ready)
        self.admin: dict[BackendId, AdminState] = {}
        #: found by discovery once, no longer in DNS, not yet gone: no new placements
        self.leaving: set[BackendId] = set()
        #: the last ``initialize`` result each backend's control link saw
        self.capabilities: dict[BackendId, dict[str, Any] | None] = {}

    # -- membership ------------------------------------------------------------------------------

    def __contains__(self, backend: object) -> bool:
        return backend in self.states

    def members(self) -> list[BackendId]:
        """Every member, in configuration order."""
        return [node.id for node in self.ranking.nodes]

    def join(self, backend: BackendId, now: float) -> None:
        """``backend`` is a member (again): unknown until its control link answers."""
        self.states[backend] = BackendState.starting(now)
        self.capabilities[backend] = None

    def leave(self, backend: BackendId) -> None:
        self.states.pop(backend, None)
        self.capabilities.pop(backend, None)
        self.admin.pop(backend, None)
        self.leaving.discard(backend)

    def rank(self, nodes: Iterable[Node]) -> None:
        """The members and their weights, in configuration order."""
        self.ranking = Ranking(nodes)

    def left_dns(
        self, present: Collection[BackendId], missing: Iterable[BackendId], now: float
    ) -> Leaving:
        """A DNS source lists ``present`` now, and no longer lists ``missing``: those not
        yet gone stay in the pool, *leaving* (no new placements; they may still hold
        sessions in memory, and leave once gone); the others leave now. A backend listed
        again is not leaving."""
        missing = list(missing)
        kept = frozenset(b for b in missing if self.health(b, now) is not Health.GONE)
        gone = tuple(b for b in missing if b not in kept and b in self.leaving)
        newly = tuple(sorted(kept - self.leaving))
        self.leaving = (self.leaving - set(present)) | kept
        return Leaving(kept, newly, gone)

    def set_admin(self, backend: BackendId, state: AdminState) -> None:
        """What an operator set ``backend`` to (ready, drain, maint)."""
        if state is AdminState.READY:
            self.admin.pop(backend, None)
        else:
            self.admin[backend] = state

    # -- health ------------------------------------------------------------------------------------

    def hear(self, backend: BackendId, event: Event, now: float) -> Heard:
        """A link to ``backend`` saw ``event``: its state moves (the caller checked it is
        a member)."""
        before = self.states[backend]
        if isinstance(event, CameUp) and event.capabilities is not None:
            self.capabilities[backend] = event.capabilities
        step = transition(before, event, now=now, grace=self.grace)
        self.states[backend] = step.state
        return Heard(before, step)

    def leaves_now(self, backend: BackendId, heard: Heard) -> bool:
        """Whether ``backend``, gone from DNS and still in the pool while it might hold
        sessions, leaves it now: ``heard`` made it gone."""
        return backend in self.leaving and heard.step.state.health is Health.GONE

    def health(self, backend: BackendId, now: float) -> Health:
        """Up, unknown (not probed, but may still run sessions) or gone, as of ``now``."""
        state = self.states.get(backend)
        return Health.GONE if state is None else state.at(now, self.grace)

    def ready(self, now: float) -> list[BackendId]:
        """Backends that are up: probed, and new sessions may go there."""
        return [b for b in self.members() if self.health(b, now) is Health.UP]

    def listable(self, now: float) -> set[BackendId]:
        """Backends a ``session/list`` page asks: up, and listing
        (:mod:`router.core.listing` says what their pages make)."""
        return {b for b in self.ready(now) if self.can_ask(b, "list")}

    def unreachable(self, now: float) -> list[BackendId]:
        """Backends that are not up but not gone (:mod:`router.core.health`)."""
        return [b for b in self.members() if self.health(b, now) is Health.UNKNOWN]

    def order(self, session_id: SessionId, now: float) -> list[BackendId]:
        """Backends that are up, in the session's rendezvous order."""
        return [b for b in self.ranking.rank(session_id) if self.health(b, now) is Health.UP]

    def mixed(self, backend: BackendId) -> bool:
        """Whether ``backend``'s URL was seen to reach more than one process
        (:mod:`router.core.health`)."""
        state = self.states.get(backend)
        return state is not None and state.mixed

    def can_ask(self, backend: BackendId, capability: str) -> bool:
        """Whether ``backend`` is a member whose control link saw it advertise
        ``capability`` (``status``, ``list``...)."""
        seen = self.capabilities.get(backend)
        return seen is not None and acp.has_session_capability(seen, capability)

    # -- what may go where ---------------------------------------------------------------------------

    def draining(self) -> set[BackendId]:
        """Backends that take no new sessions but keep those located there: drained by
        an operator, in maintenance, or gone from DNS."""
        return self.leaving | self.admin.keys()

    def open_to_sessions(self, backend: BackendId, now: float) -> bool:
        """Whether a session (a resume, a pool of one's first frame) may be sent to
        ``backend``: up, and not in maintenance."""
        return (
            self.health(backend, now) is Health.UP
            and self.admin.get(backend) is not AdminState.MAINT
        )

    def for_new_sessions(self, now: float) -> list[Node]:
        """The members a new session may be placed on: up, and not draining."""
        draining = self.draining()
        return [
            node
            for node in self.ranking.nodes
            if node.id not in draining and self.health(node.id, now) is Health.UP
        ]

    def only_backend(self, now: float) -> BackendId | None:
        """The pool's one backend, when it has one and it is open to sessions."""
        members = self.members()
        if len(members) != 1 or not self.open_to_sessions(members[0], now):
            return None
        return members[0]

    def likely(
        self,
        session_id: SessionId,
        attached: Collection[BackendId],
        hint: Hint | None,
        now: float,
        claimed: BackendId | None = None,
    ) -> BackendId | None:
        """Where a resume of ``session_id`` will most likely go, known without asking
        anyone: a backend it is attached to here, else the hinted one, else the home its
        client's hinted id named (``claimed``, when that is a member), else the pool's
        only backend; None when there is no such guess or it is not open to the session.
        Its link is opened while the locate runs (docs/architecture.md, "Links")."""
        hint = first_guess(hint, claimed if claimed in self else None)
        if attached:
            backend = min(attached)
        elif hint is not None:
            backend = hint.backend
        else:
            return self.only_backend(now)
        return backend if self.open_to_sessions(backend, now) else None

    def candidates(
        self,
        session_id: SessionId,
        attached: Collection[BackendId],
        retired: Collection[BackendId],
        now: float,
    ) -> tuple[Candidate, ...]:
        """Every member as a locate of ``session_id`` sees it, in its rendezvous order:
        one ranking, one health reading each. A backend that left the pool while the
        session is attached to it here (``retired``) comes last: it is still where the
        session runs."""
        members = [
            Candidate(
                b,
                self.health(b, now),
                has_status=self.can_ask(b, "status"),
                admin=self.admin.get(b, AdminState.READY),
                leaving=b in self.leaving,
                attached=b in attached,
                mixed=self.mixed(b),
            )
            for b in self.ranking.rank(session_id)
        ]
        gone_from_pool = [
            Candidate(b, Health.UNKNOWN, has_status=False, attached=True)
            for b in sorted(attached)
            if b not in self.states and b in retired
        ]
        return (*members, *gone_from_pool)

    def first_contact(
        self, now: float, within: float, *, any_one: bool = False
    ) -> FirstContact | None:
        """The members to wait for: not heard from since they joined (a router just
        started), for at most ``within`` seconds after they joined; None: there is none.
        A locate waits for all of them (before their first answer it would find them
        unknown and fail closed); an ``initialize`` (``any_one``) only until one member
        has said what it offers (:meth:`introduced`). Past the window nothing waits: a
        backend that never answers costs each client nothing."""
        if any_one and self.introduced():
            return None
        awaited = [
            (backend, state.since + within)
            for backend in self.members()
            if not (state := self.states[backend]).seen
            and state.health is Health.UNKNOWN
            and state.since + within > now
        ]
        if not awaited:
            return None
        return FirstContact(tuple(b for b, _ in awaited), max(until for _, until in awaited))

    def introduced(self) -> bool:
        """Whether the router knows what its pool offers: a member's ``initialize`` has
        answered, or there is no member to wait for. Until then, what a client is told at
        ``initialize`` would lack every way back into a session (a router just started)."""
        return not self.ranking.nodes or any(
            self.capabilities.get(b) is not None for b in self.members()
        )

    def advertised(self) -> list[Mapping[str, Any]]:
        """What each member's ``initialize`` said, for those that answered."""
        return [c for b in self.members() if (c := self.capabilities.get(b)) is not None]
