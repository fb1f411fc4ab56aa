"""router.core.phases: each session of a connection in one phase, every move checked; the
frames that wait behind a holder come back once, in order, when it settles."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from router.core.effects import Attach, Detach
from router.core.phases import (
    LIFECYCLE,
    TRANSITIONS,
    Connection,
    InvalidMove,
    Lifecycle,
    Move,
    Phase,
    SessionTable,
    Waiting,
    orphan_holder,
)
from router.protocol.ids import BackendId, SessionId
from router.protocol.jsonrpc import Notification, Request, RequestId
from router.protocol.reading import parse
from tests.routes_driver import new_params, notification, prompt, request

HOLDING = (Phase.ATTACHING, Phase.CLOSING_ELSEWHERE, Phase.ORPHANED)


def by(request_id: RequestId) -> Request:
    """A client request that attached a session."""
    message = parse(request(request_id, "session/new", new_params()))
    assert isinstance(message, Request)
    return message


def frame(n: int, session_id: str = "s1") -> Waiting:
    """What waits for ``session_id``: a prompt's id (its request is its call's), or a
    cancel (odd, even ``n``)."""
    if n % 2:
        message = parse(prompt(n, session_id))
        assert isinstance(message, Request)
        return message.id
    cancel = parse(notification("session/cancel", {"sessionId": session_id, "n": n}))
    assert isinstance(cancel, Notification)
    return cancel


# -- the table of moves ----------------------------------------------------------------------------


def test_every_phase_is_reached_and_left() -> None:
    reached = {after for targets in TRANSITIONS.values() for after in targets}
    left = {phase for phase, _ in TRANSITIONS}
    assert reached == set(Phase)
    assert left == set(Phase)


def test_a_held_session_leaves_its_holding_phases_only_when_its_holder_settles() -> None:
    """Only its holder's answer ends a holding phase (SETTLE, or ATTACH for a resume that
    succeeded): the frames that wait there are handed back then, never left behind."""
    for (phase, move), targets in TRANSITIONS.items():
        if phase in HOLDING and any(t not in HOLDING for t in targets):
            assert move in (Move.SETTLE, Move.ATTACH), (phase, move)


# -- moves, one by one -----------------------------------------------------------------------------


def test_attach_reports_what_changed() -> None:
    table = SessionTable()
    assert table.attach(SessionId("s1"), BackendId("a"), by(1)) == (Attach("s1", "a"),)
    assert table.phase(SessionId("s1")) is Phase.ATTACHED
    assert table.attach(SessionId("s1"), BackendId("a")) == ()  # attached there already
    assert table.attached_by(SessionId("s1")) == by(1)  # kept when none is given
    assert table.attach(SessionId("s1"), BackendId("b")) == (
        Detach("s1", "a"),
        Attach("s1", "b"),
    )
    assert table.attached() == {"s1": "b"}
    assert table.on(BackendId("b")) == ["s1"]
    assert table.count_attached() == 1


def test_a_resume_of_an_attached_session_holds_it_and_keeps_its_backend() -> None:
    table = SessionTable()
    table.attach(SessionId("s1"), BackendId("a"), by(1))
    table.resume(SessionId("s1"), 2)
    assert table.phase(SessionId("s1")) is Phase.ATTACHING
    assert table.holding(SessionId("s1"))
    assert table.held_by(SessionId("s1"), 2)
    assert not table.held_by(SessionId("s1"), 1)
    assert table.backend(SessionId("s1")) == "a"  # its frames go on there meanwhile
    assert table.attached_by(SessionId("s1")) == by(1)
    # it failed: it rests where it was, by the request that attached it
    assert table.settle(SessionId("s1"), 2) == ((), None)
    assert table.phase(SessionId("s1")) is Phase.ATTACHED
    assert table.attached_by(SessionId("s1")) == by(1)


def test_a_resume_of_a_detached_session_that_fails_leaves_it_detached() -> None:
    table = SessionTable()
    table.resume(SessionId("s1"), 1)
    assert table.backend(SessionId("s1")) is None
    assert table.attached() == {}
    table.wait(SessionId("s1"), frame(2))
    changes, waiting = table.settle(SessionId("s1"), 1)
    assert changes == ()
    assert list(waiting or ()) == [frame(2)]
    assert table.phase(SessionId("s1")) is Phase.DETACHED
    assert len(table) == 0


def test_a_resume_that_succeeds_attaches_where_it_went_and_moves_a_session() -> None:
    table = SessionTable()
    table.attach(SessionId("s1"), BackendId("a"), by(1))
    table.resume(SessionId("s1"), 2)
    changes, waiting = table.settle(SessionId("s1"), 2, BackendId("b"), by(2))
    assert changes == (Detach("s1", "a"), Attach("s1", "b"))
    assert waiting is None  # nothing waited
    assert table.attached_by(SessionId("s1")) == by(2)
    table.resume(SessionId("s1"), 3)
    assert table.settle(SessionId("s1"), 3, BackendId("b"), by(3))[0] == ()  # stays there


def test_settle_by_another_holder_changes_nothing() -> None:
    table = SessionTable()
    table.resume(SessionId("s1"), 1)
    table.wait(SessionId("s1"), frame(2))
    assert table.settle(SessionId("s1"), 9, BackendId("a")) == ((), None)
    assert table.held_by(SessionId("s1"), 1)
    assert table.settle(SessionId("s2"), 1) == ((), None)  # a session in no phase


def test_frames_wait_in_arrival_order_and_come_back_once() -> None:
    table = SessionTable()
    table.resume(SessionId("s1"), 1)
    frames = [frame(n) for n in range(2, 7)]
    for waiting in frames:
        table.wait(SessionId("s1"), waiting)
    _, back = table.settle(SessionId("s1"), 1, BackendId("a"))
    assert list(back or ()) == frames
    table.resume(SessionId("s1"), 7)
    assert table.settle(SessionId("s1"), 7) == ((), None)  # none of them again


def test_a_close_of_an_attached_session_is_closing_and_holds_nothing() -> None:
    table = SessionTable()
    table.attach(SessionId("s1"), BackendId("a"), by(1))
    table.close(SessionId("s1"), 2)
    assert table.phase(SessionId("s1")) is Phase.CLOSING
    assert not table.holding(SessionId("s1"))
    assert table.backend(SessionId("s1")) == "a"
    table.close(SessionId("s1"), 3)  # a second close changes nothing
    assert table.phase(SessionId("s1")) is Phase.CLOSING
    table.keep(SessionId("s1"))  # it failed
    assert table.phase(SessionId("s1")) is Phase.ATTACHED
    assert table.attached_by(SessionId("s1")) == by(1)
    table.keep(SessionId("s1"))  # only a closing session is kept
    assert table.phase(SessionId("s1")) is Phase.ATTACHED
    table.close(SessionId("s1"), 4)
    assert table.detach(SessionId("s1")) == Detach("s1", "a")  # it succeeded
    assert table.phase(SessionId("s1")) is Phase.DETACHED


def test_a_close_of_a_detached_session_is_located_and_holds_it() -> None:
    table = SessionTable()
    table.close(SessionId("s1"), 1)
    assert table.phase(SessionId("s1")) is Phase.CLOSING_ELSEWHERE
    assert table.holding(SessionId("s1"))
    assert table.backend(SessionId("s1")) is None
    assert table.attached_by(SessionId("s1")) is None
    table.wait(SessionId("s1"), frame(2))
    changes, waiting = table.settle(SessionId("s1"), 1)
    assert (changes, list(waiting or ())) == ((), [frame(2)])
    assert table.phase(SessionId("s1")) is Phase.DETACHED


def test_detach_gives_up_where_a_held_session_was_attached_and_keeps_it_held() -> None:
    table = SessionTable()
    table.attach(SessionId("s1"), BackendId("a"))
    table.resume(SessionId("s1"), 1)
    assert table.detach(SessionId("s1")) == Detach("s1", "a")
    assert table.phase(SessionId("s1")) is Phase.ATTACHING
    assert table.backend(SessionId("s1")) is None
    assert table.detach(SessionId("s1")) is None  # nothing more to give up
    assert table.settle(SessionId("s1"), 1) == ((), None)
    assert table.phase(SessionId("s1")) is Phase.DETACHED


def test_a_lost_link_detaches_its_sessions() -> None:
    table = SessionTable()
    for name, backend in (("s1", "a"), ("s2", "a"), ("s3", "b"), ("s4", "a")):
        table.attach(SessionId(name), BackendId(backend), by(name))
    table.close(SessionId("s2"), 1)
    table.resume(SessionId("s4"), 2)
    detached, orphaned = table.lose(BackendId("a"), orphan=False)
    assert detached == [Detach("s1", "a"), Detach("s2", "a"), Detach("s4", "a")]
    assert orphaned == []
    assert table.attached() == {"s3": "b"}
    assert table.phase(SessionId("s4")) is Phase.ATTACHING  # its resume is still out
    assert table.held_by(SessionId("s4"), 2)


def test_with_failover_a_lost_link_orphans_the_sessions_a_client_attached() -> None:
    table = SessionTable()
    table.attach(SessionId("s1"), BackendId("a"), by(1))
    table.attach(SessionId("child"), BackendId("a"))  # announced: no request attached it
    table.attach(SessionId("s2"), BackendId("a"), by(2))
    table.close(SessionId("s2"), 3)  # being closed: not resumed elsewhere
    detached, orphaned = table.lose(BackendId("a"), orphan=True)
    assert detached == [Detach("s1", "a"), Detach("child", "a"), Detach("s2", "a")]
    assert orphaned == ["s1"]
    assert table.phase(SessionId("s1")) is Phase.ORPHANED
    assert table.held_by(SessionId("s1"), orphan_holder(SessionId("s1")))
    assert table.attached_by(SessionId("s1")) == by(1)
    assert table.phase(SessionId("child")) is Phase.DETACHED
    assert table.phase(SessionId("s2")) is Phase.DETACHED
    # its failover's resume goes out: the frames that waited for it wait on behind that
    table.wait(SessionId("s1"), frame(4))
    table.resume(SessionId("s1"), "failover")
    assert table.attached_by(SessionId("s1")) == by(1)
    table.wait(SessionId("s1"), frame(5))
    _, waiting = table.settle(SessionId("s1"), "failover", BackendId("b"), by(1))
    assert list(waiting or ()) == [frame(4), frame(5)]
    assert table.attached() == {"s1": "b"}


def test_drop_waiting_forgets_the_frames_and_every_holder() -> None:
    table = SessionTable()
    table.attach(SessionId("s1"), BackendId("a"), by(1))
    table.resume(SessionId("s1"), 2)
    table.close(SessionId("s2"), 3)
    table.wait(SessionId("s1"), frame(4))
    table.wait(SessionId("s2"), frame(5))
    table.drop_waiting()
    assert table.phase(SessionId("s1")) is Phase.ATTACHED  # where it was
    assert table.phase(SessionId("s2")) is Phase.DETACHED
    table.resume(SessionId("s1"), 6)
    assert table.settle(SessionId("s1"), 6) == ((), None)  # the frames are gone


def test_detach_all_detaches_what_is_attached() -> None:
    table = SessionTable()
    table.attach(SessionId("s1"), BackendId("a"))
    table.attach(SessionId("s2"), BackendId("b"))
    table.close(SessionId("s2"), 1)
    table.resume(SessionId("s3"), 2)
    assert table.detach_all() == (Detach("s1", "a"), Detach("s2", "b"))
    assert table.attached() == {}


# -- moves the table does not allow ----------------------------------------------------------------


def test_a_held_session_cannot_be_resumed_again() -> None:
    table = SessionTable()
    table.resume(SessionId("s1"), 1)
    with pytest.raises(InvalidMove):
        table.resume(SessionId("s1"), 2)
    table.close(SessionId("s2"), 3)
    with pytest.raises(InvalidMove):
        table.resume(SessionId("s2"), 4)
    assert table.held_by(SessionId("s1"), 1)
    assert table.held_by(SessionId("s2"), 3)


@pytest.mark.parametrize("holding", ["resume", "close", "orphan"])
def test_a_held_session_cannot_be_attached_past_its_holder(holding: str) -> None:
    """Attaching it would forget its holder, and the frames behind it with it."""
    table = SessionTable()
    if holding == "orphan":
        table.attach(SessionId("s1"), BackendId("a"), by(1))
        table.lose(BackendId("a"), orphan=True)
    elif holding == "resume":
        table.resume(SessionId("s1"), 1)
    else:
        table.close(SessionId("s1"), 1)
    before = table.phase(SessionId("s1"))
    table.wait(SessionId("s1"), frame(2))
    with pytest.raises(InvalidMove):
        table.attach(SessionId("s1"), BackendId("b"))
    assert table.phase(SessionId("s1")) is before


def test_a_closing_session_cannot_be_attached_again() -> None:
    table = SessionTable()
    table.attach(SessionId("s1"), BackendId("a"))
    table.close(SessionId("s1"), 1)
    with pytest.raises(InvalidMove):
        table.attach(SessionId("s1"), BackendId("b"))
    assert table.phase(SessionId("s1")) is Phase.CLOSING


def test_only_a_resume_settles_into_an_attachment() -> None:
    table = SessionTable()
    table.close(SessionId("s1"), 1)
    with pytest.raises(InvalidMove):
        table.settle(SessionId("s1"), 1, BackendId("a"))
    assert table.held_by(SessionId("s1"), 1)


@pytest.mark.parametrize("attached", [False, True])
def test_a_frame_waits_only_behind_a_holder(attached: bool) -> None:
    table = SessionTable()
    if attached:
        table.attach(SessionId("s1"), BackendId("a"))
    with pytest.raises(InvalidMove):
        table.wait(SessionId("s1"), frame(1))
    assert table.phase(SessionId("s1")) is (Phase.ATTACHED if attached else Phase.DETACHED)


# -- random moves against a model ------------------------------------------------------------------

SESSIONS = tuple(SessionId(s) for s in ("s1", "s2", "s3"))
BACKENDS = tuple(BackendId(b) for b in ("a", "b"))
INDEX = st.integers(0, len(SESSIONS) - 1)
#: mostly aimed at a session a move means something for; now and then at any
AIMED = st.sampled_from([True, True, True, False])


@dataclass
class Expected:
    """What the model says of one session."""

    phase: Phase = Phase.DETACHED
    backend: BackendId | None = None
    holder: RequestId | None = None
    by: Request | None = None
    waiting: list[Waiting] = field(default_factory=list)
    #: a held session that was attached when it was held, and still is
    attached_meanwhile: bool = False


class Sessions(RuleBasedStateMachine):
    """SessionTable driven through random moves, each checked against a model: a move
    the table allows never raises, one it does not raises InvalidMove and changes
    nothing; frames that wait come back exactly once, in order, or are dropped."""

    def __init__(self) -> None:
        super().__init__()
        self.table = SessionTable()
        self.model: dict[SessionId, Expected] = {s: Expected() for s in SESSIONS}
        self.counter = 0
        self.back: list[Waiting] = []  # frames that came back, in the order they did
        self.dropped: list[Waiting] = []
        self.waited: list[Waiting] = []

    def _next(self) -> int:
        self.counter += 1
        return self.counter

    def _pick(self, index: int, aimed: bool, *phases: Phase) -> SessionId:
        """A session in one of ``phases`` when ``aimed`` and there is one, else any."""
        found = [s for s in SESSIONS if self.model[s].phase in phases]
        return found[index % len(found)] if aimed and found else SESSIONS[index]

    def _settle_model(self, s: SessionId, attach_to: BackendId | None, by: Request | None) -> None:
        m = self.model[s]
        previous = m.backend if m.phase is Phase.ATTACHING else None
        if attach_to is not None:
            self.model[s] = Expected(Phase.ATTACHED, attach_to, by=by)
        elif previous is not None:
            self.model[s] = Expected(Phase.ATTACHED, previous, by=m.by)
        else:
            self.model[s] = Expected()

    @initialize(
        backends=st.lists(st.sampled_from(BACKENDS), min_size=3, max_size=3),
        made=st.lists(AIMED, min_size=3, max_size=3),
    )
    def all_attached(self, backends: list[BackendId], made: list[bool]) -> None:
        """Start with every session attached: made by the client's request, mostly, or
        announced by a backend (attached by no request)."""
        for s, b, with_by in zip(SESSIONS, backends, made, strict=True):
            self.attach(s, b, with_by)

    # -- moves ---------------------------------------------------------------------------------

    @rule(s=st.sampled_from(SESSIONS), b=st.sampled_from(BACKENDS), with_by=AIMED)
    def attach(self, s: SessionId, b: BackendId, with_by: bool) -> None:
        m = self.model[s]
        request = by(self._next()) if with_by else None
        if m.phase not in (Phase.DETACHED, Phase.ATTACHED):
            with pytest.raises(InvalidMove):
                self.table.attach(s, b, request)
            return
        changes = self.table.attach(s, b, request)
        previous = m.backend
        expected = () if previous == b else (*_detach(s, previous), Attach(s, b))
        assert changes == expected
        self.model[s] = Expected(Phase.ATTACHED, b, by=request or m.by)

    @rule(index=INDEX, aimed=AIMED)
    def resume(self, index: int, aimed: bool) -> None:
        self._resume(self._pick(index, aimed, Phase.ATTACHED, Phase.CLOSING, Phase.DETACHED))

    @rule(index=INDEX, aimed=AIMED)
    def fail_over(self, index: int, aimed: bool) -> None:
        """A failover's resume of an orphaned session."""
        self._resume(self._pick(index, aimed, Phase.ORPHANED))

    def _resume(self, s: SessionId) -> None:
        m = self.model[s]
        holder = self._next()
        if m.phase in (Phase.ATTACHING, Phase.CLOSING_ELSEWHERE):
            with pytest.raises(InvalidMove):
                self.table.resume(s, holder)
            return
        self.table.resume(s, holder)
        kept = m.phase in (Phase.ATTACHED, Phase.CLOSING)
        self.model[s] = Expected(
            Phase.ATTACHING,
            m.backend if kept else None,
            holder,
            m.by if m.phase is not Phase.DETACHED else None,
            m.waiting,  # an orphan's frames wait on behind its failover's resume
            attached_meanwhile=kept,
        )

    @rule(s=st.sampled_from(SESSIONS))
    def close(self, s: SessionId) -> None:
        m = self.model[s]
        holder = self._next()
        self.table.close(s, holder)
        if m.phase is Phase.ATTACHED:
            self.model[s] = Expected(Phase.CLOSING, m.backend, by=m.by)
        elif m.phase is Phase.DETACHED:
            self.model[s] = Expected(Phase.CLOSING_ELSEWHERE, holder=holder)

    @rule(s=st.sampled_from(SESSIONS))
    def keep(self, s: SessionId) -> None:
        self.table.keep(s)
        m = self.model[s]
        if m.phase is Phase.CLOSING:
            self.model[s] = Expected(Phase.ATTACHED, m.backend, by=m.by)

    @rule(s=st.sampled_from(SESSIONS))
    def detach(self, s: SessionId) -> None:
        m = self.model[s]
        detached = self.table.detach(s)
        if m.phase in (Phase.ATTACHED, Phase.CLOSING):
            assert m.backend is not None
            assert detached == Detach(s, m.backend)
            self.model[s] = Expected()
        elif m.phase is Phase.ATTACHING and m.backend is not None:
            assert detached == Detach(s, m.backend)
            m.backend, m.attached_meanwhile = None, False
        else:
            assert detached is None

    @rule(index=INDEX, aimed=AIMED, orphan=AIMED)
    def lose(self, index: int, aimed: bool, orphan: bool) -> None:
        b = self.model[self._pick(index, aimed, Phase.ATTACHED)].backend or BACKENDS[index % 2]
        detached, orphaned = self.table.lose(b, orphan=orphan)
        on = [s for s in SESSIONS if self.model[s].backend == b]
        assert sorted(detached, key=str) == sorted((Detach(s, b) for s in on), key=str)
        expected_orphans = []
        for s in on:
            m = self.model[s]
            if orphan and m.phase is Phase.ATTACHED and m.by is not None:
                self.model[s] = Expected(Phase.ORPHANED, holder=orphan_holder(s), by=m.by)
                expected_orphans.append(s)
            elif m.phase is Phase.ATTACHING:
                m.backend, m.attached_meanwhile = None, False
            else:
                self.model[s] = Expected()
        assert sorted(orphaned) == expected_orphans

    @rule(index=INDEX, right=AIMED, attach_to=st.none() | st.sampled_from(BACKENDS))
    def settle(self, index: int, right: bool, attach_to: BackendId | None) -> None:
        """A call is answered: mostly one that holds a session, sometimes another."""
        s = self._pick(index, right, *HOLDING)
        m = self.model[s]
        holder = m.holder if right and m.holder is not None else self._next()
        request = by(self._next())
        holds = m.phase in HOLDING and m.holder == holder
        if holds and attach_to is not None and m.phase is not Phase.ATTACHING:
            with pytest.raises(InvalidMove):  # only a resume settles into an attachment
                self.table.settle(s, holder, attach_to, request)
            return
        changes, waiting = self.table.settle(s, holder, attach_to, request)
        if not holds:
            assert (changes, waiting) == ((), None)
            return
        previous = m.backend
        if attach_to is None or previous == attach_to:
            assert changes == ()
        else:
            assert changes == (*_detach(s, previous), Attach(s, attach_to))
        assert list(waiting or ()) == m.waiting
        self.back += m.waiting
        self._settle_model(s, attach_to, request)

    @rule(index=INDEX, aimed=AIMED, frames=st.integers(1, 3))
    def wait(self, index: int, aimed: bool, frames: int) -> None:
        s = self._pick(index, aimed, *HOLDING)
        m = self.model[s]
        for _ in range(frames):
            waiting = frame(self._next(), s)
            if m.phase not in HOLDING:
                with pytest.raises(InvalidMove):
                    self.table.wait(s, waiting)
                return
            self.table.wait(s, waiting)
            m.waiting.append(waiting)
            self.waited.append(waiting)

    @rule()
    def drop_waiting(self) -> None:
        self.table.drop_waiting()
        for s in SESSIONS:
            m = self.model[s]
            if m.phase in HOLDING:
                self.dropped += m.waiting
                self._settle_model(s, None, None)

    @rule()
    def detach_all(self) -> None:
        expected = tuple(
            Detach(s, m.backend) for s, m in self.model.items() if m.backend is not None
        )
        assert set(self.table.detach_all()) == set(expected)
        for s in SESSIONS:
            m = self.model[s]
            if m.phase in (Phase.ATTACHED, Phase.CLOSING):
                self.model[s] = Expected()
            elif m.backend is not None:
                m.backend, m.attached_meanwhile = None, False

    # -- invariants ----------------------------------------------------------------------------

    @invariant()
    def phases_agree(self) -> None:
        for s, m in self.model.items():
            assert self.table.phase(s) is m.phase
            assert self.table.holding(s) == (m.phase in HOLDING)
            if m.holder is not None:
                assert self.table.held_by(s, m.holder)
            expected_by = None if m.phase in (Phase.DETACHED, Phase.CLOSING_ELSEWHERE) else m.by
            assert self.table.attached_by(s) == expected_by
        assert set(self.table) == {
            s for s, m in self.model.items() if m.phase is not Phase.DETACHED
        }

    @invariant()
    def backend_is_set_exactly_where_attached(self) -> None:
        for s, m in self.model.items():
            backend = self.table.backend(s)
            assert backend == m.backend
            attached = m.phase in (Phase.ATTACHED, Phase.CLOSING) or (
                m.phase is Phase.ATTACHING and m.attached_meanwhile
            )
            assert (backend is not None) == attached
        expected = {s: m.backend for s, m in self.model.items() if m.backend is not None}
        assert self.table.attached() == expected
        assert self.table.count_attached() == len(expected)
        for b in BACKENDS:
            assert self.table.on(b) == [s for s in self.table if expected.get(s) == b]

    @invariant()
    def only_held_phases_hold_frames(self) -> None:
        """The frames the table keeps (read from its state: the core needs no reader for
        them) are the model's, in order, and only a held session keeps any."""
        for s, m in self.model.items():
            state = self.table._table.get(s)
            kept = list(getattr(state, "waiting", None) or ())
            assert kept == m.waiting
            assert not kept or m.phase in HOLDING

    @invariant()
    def every_frame_that_waited_comes_back_once(self) -> None:
        still = [f for m in self.model.values() for f in m.waiting]
        texts = [_text(f) for f in (*self.back, *self.dropped, *still)]
        assert sorted(texts) == sorted(_text(f) for f in self.waited)
        assert len(set(texts)) == len(texts)


def _text(waiting: Waiting) -> str:
    """What tells waiting frames apart: a notification's text, a request's id."""
    return waiting.text if isinstance(waiting, Notification) else f"request {waiting!r}"


def _detach(s: SessionId, backend: BackendId | None) -> tuple[Detach, ...]:
    return () if backend is None else (Detach(s, backend),)


Sessions.TestCase.settings = settings(max_examples=300, stateful_step_count=40, deadline=None)
test_sessions = Sessions.TestCase


# -- a connection's own lifecycle ------------------------------------------------------------------


def test_a_connection_opens_with_initialize_and_ends_once_closed_or_gone() -> None:
    reached = set(LIFECYCLE.values())
    assert reached == set(Lifecycle) - {Lifecycle.NEW}  # nothing goes back to new
    assert {phase for phase, _ in LIFECYCLE} == set(Lifecycle) - {Lifecycle.GONE}  # the end
    connection = Connection()
    phases = [(connection.phase, connection.closed)]
    first = by("init")
    connection.initialized(first)
    assert connection.initialize is first
    phases.append((connection.phase, connection.closed))
    connection.stop()
    phases.append((connection.phase, connection.closed))
    with pytest.raises(InvalidMove):
        connection.initialized(by("again"))  # a stopping connection routes nothing
    connection.gone()
    phases.append((connection.phase, connection.closed))
    assert phases == [
        (Lifecycle.NEW, False),
        (Lifecycle.OPEN, False),
        (Lifecycle.STOPPING, True),
        (Lifecycle.GONE, True),
    ]
    with pytest.raises(InvalidMove):
        connection.stop()
