"""router.core.health: backend states and their transitions, and a model of the core
(health + locate) that checks no interleaving runs one session on two backends."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings, strategies as st

from router.core.health import (
    BackendState,
    CameUp,
    ClientLinkDown,
    ClientLinkUp,
    Event,
    Fenced,
    Health,
    Instance,
    LinkDown,
    Transition,
    transition,
)
from router.core.locate import Candidate, Snapshot, UnknownPolicy, decide
from router.protocol.acp import ProbeResult
from router.protocol.errors import LocateInconclusive, NoBackendAvailable
from router.protocol.ids import BackendId, SessionId

GRACE = 30.0
AGENT = (("name", "agent"), ("version", "1"))


def _instance(nonce: str | None = "n1", info: tuple[tuple[str, str], ...] = AGENT) -> Instance:
    return Instance(info, nonce)


def _step(state: BackendState, event: Event, now: float) -> Transition:
    return transition(state, event, now=now, grace=GRACE)


UP = BackendState(Health.UP, 0.0, _instance())


# -- Instance ------------------------------------------------------------------------------------


def test_instance_reads_agent_info_and_the_nonce() -> None:
    result = {
        "agentInfo": {"name": "agent", "version": "1", "_meta": {"x": 1}},
        "_meta": {"instanceId": "n1"},
    }
    assert Instance.of(result) == _instance()
    assert Instance.of({"agentInfo": {"version": "1", "name": "agent"}}) == _instance(None)
    assert Instance.of(None) == Instance((), None)
    assert Instance.of({"agentInfo": "x", "_meta": {"instanceId": 5}}) == Instance((), None)


@pytest.mark.parametrize(
    ("before", "after", "same"),
    [
        (_instance("n1"), _instance("n1"), True),
        (_instance("n1"), _instance("n2"), False),
        # with nonces, the nonce decides even if agentInfo changed
        (_instance("n1"), _instance("n1", (("name", "agent"), ("version", "2"))), True),
        # without one on either side, agentInfo decides: an upgrade is a restart
        (_instance(None), _instance(None), True),
        (_instance(None), _instance(None, (("name", "agent"), ("version", "2"))), False),
        (_instance("n1"), _instance(None), True),
    ],
)
def test_same_process(before: Instance, after: Instance, same: bool) -> None:
    assert before.same_process(after) is same


# -- transitions ---------------------------------------------------------------------------------


def test_a_backend_starts_unknown_and_is_gone_after_the_grace() -> None:
    state = BackendState.starting(100.0)
    assert state.at(100.0, GRACE) is Health.UNKNOWN
    assert state.at(129.9, GRACE) is Health.UNKNOWN
    assert state.at(130.0, GRACE) is Health.GONE


def test_a_link_drop_is_unknown_not_gone() -> None:
    step = _step(UP, LinkDown(), 10.0)
    assert step.state == BackendState(Health.UNKNOWN, 10.0, _instance())
    assert not step.lost_memory
    # failed reconnects inside the grace change nothing
    assert _step(step.state, LinkDown(), 20.0) == Transition(step.state)


def test_a_refused_reconnect_is_not_gone() -> None:
    # a proxy, an unready Kubernetes endpoint or a restarting listener refuses while the
    # process behind it runs turns: on the old main this was gone at once
    down = _step(UP, LinkDown(), 10.0).state
    step = _step(down, LinkDown(refused=True), 10.5)
    assert step.state.health is Health.UNKNOWN
    assert not step.lost_memory
    assert _step(UP, LinkDown(refused=True), 1.0).state.health is Health.UNKNOWN
    # only the grace with no link alive makes it gone
    assert _step(step.state, LinkDown(refused=True), 40.0).state.health is Health.GONE


def test_a_live_client_link_keeps_a_backend_from_being_gone() -> None:
    linked = _step(UP, ClientLinkUp(_instance()), 5.0).state
    assert linked.health is Health.UP
    down = _step(linked, LinkDown(refused=True), 10.0).state
    assert down.health is Health.UNKNOWN
    # refused reconnects for far longer than the grace: the client link proves it alive
    assert down.at(1000.0, GRACE) is Health.UNKNOWN
    assert _step(down, LinkDown(refused=True), 1000.0).state.health is Health.UNKNOWN
    # the grace runs from when the last link ended
    ended = _step(down, ClientLinkDown(), 1000.0).state
    assert ended.at(1029.0, GRACE) is Health.UNKNOWN
    assert ended.at(1030.0, GRACE) is Health.GONE


def test_a_client_link_to_a_backend_whose_control_link_is_down_is_alive_not_up() -> None:
    down = _step(UP, LinkDown(), 10.0).state
    step = _step(down, ClientLinkUp(_instance()), 11.0)
    assert step.state.health is Health.UNKNOWN  # not probed: not up
    assert step.state.live_links == 1
    assert not step.lost_memory


def test_a_client_link_can_see_a_restart_while_the_control_link_is_down() -> None:
    down = _step(UP, LinkDown(), 4.0).state
    step = _step(down, ClientLinkUp(_instance("n2")), 5.0)
    assert step.restarted
    assert step.lost_memory
    assert step.state.health is Health.UNKNOWN  # until the control link sees it too
    assert step.state.instance == _instance("n2")
    back = _step(step.state, CameUp(_instance("n2")), 6.0)
    assert back.state.health is Health.UP
    assert not back.restarted


def test_another_process_on_a_client_link_beside_an_up_control_link_is_reported() -> None:
    """One URL, several processes (a balancer, a rolling update with surge): the control
    link is up and speaks for its process, so a client link that reaches another is
    reported, not a restart (on the code before: unknown, hints gone, until the control
    link reconnected)."""
    step = _step(UP, ClientLinkUp(_instance("n2")), 5.0)
    assert step.mismatch
    assert not step.restarted
    assert not step.lost_memory
    assert step.state.health is Health.UP
    assert step.state.instance == _instance()  # the control link's process
    assert (step.state.live_links, step.state.mixed) == (1, True)
    # the control link's own process again: nothing to report
    again = _step(step.state, ClientLinkUp(_instance()), 6.0)
    assert not again.mismatch
    assert again.state.live_links == 2


def test_a_restart_seen_first_on_a_client_link_is_confirmed_by_the_control_link() -> None:
    # the new process answers a client link before the old one's control link drops
    seen = _step(UP, ClientLinkUp(_instance("n2")), 5.0).state
    down = _step(seen, LinkDown(), 5.5).state
    assert down.health is Health.UNKNOWN
    back = _step(down, CameUp(_instance("n2")), 6.0)
    assert back.restarted
    assert back.lost_memory
    assert back.state.health is Health.UP
    assert not back.state.mixed  # its control link speaks for the process it reached
    # a balancer that still reaches the old process: its control link came back to it
    same = _step(down, CameUp(_instance()), 6.0)
    assert not same.restarted
    assert not same.lost_memory
    assert not same.state.mixed


def test_a_backend_never_reached_lapses_quietly() -> None:
    step = _step(BackendState.starting(0.0), LinkDown(refused=True), 31.0)
    assert step.state.health is Health.GONE
    assert not step.lost_memory  # nothing was known of it: nothing to forget


def test_unreachable_past_the_grace_is_gone_and_told_once() -> None:
    down = _step(UP, LinkDown(), 10.0).state
    step = _step(down, LinkDown(), 40.0)
    assert step.state.health is Health.GONE
    assert step.lost_memory
    assert not _step(step.state, LinkDown(), 50.0).lost_memory


def test_the_same_process_coming_back_keeps_its_memory() -> None:
    down = _step(UP, LinkDown(), 10.0).state
    step = _step(down, CameUp(_instance()), 12.0)
    assert step == Transition(BackendState(Health.UP, 12.0, _instance()))


def test_a_new_process_coming_back_lost_the_memory() -> None:
    down = _step(UP, LinkDown(), 10.0).state
    step = _step(down, CameUp(_instance("n2")), 12.0)
    assert step.state == BackendState(Health.UP, 12.0, _instance("n2"))
    assert step.lost_memory
    assert step.restarted


def test_coming_back_after_the_grace_reports_the_lost_memory_and_is_fenced() -> None:
    """Given up is final for what it held: the same process back after the grace is
    unknown (no traffic) until its stale copies are closed, then up."""
    down = _step(UP, LinkDown(), 10.0).state
    step = _step(down, CameUp(_instance()), 45.0)
    assert step.state.health is Health.UNKNOWN
    assert step.state.fencing
    assert step.fence
    assert step.lost_memory
    assert not step.restarted
    assert step.state.at(1_000.0, GRACE) is Health.UNKNOWN  # alive: it does not lapse
    fenced = _step(step.state, Fenced(), 46.0)
    assert fenced.state == BackendState(Health.UP, 46.0, _instance())


def test_a_backend_being_fenced_whose_link_drops_is_fenced_again_when_it_returns() -> None:
    down = _step(UP, LinkDown(), 10.0).state
    fencing = _step(down, CameUp(_instance()), 45.0).state
    dropped = _step(fencing, LinkDown(), 50.0)
    assert dropped.state.health is Health.UNKNOWN
    assert dropped.state.fencing  # still to be fenced
    back = _step(dropped.state, CameUp(_instance()), 55.0)  # within the grace
    assert back.fence
    assert back.state.health is Health.UNKNOWN
    assert _step(dropped.state, Fenced(), 56.0).state == dropped.state  # not while down
    assert dropped.state.at(50.0 + GRACE, GRACE) is Health.GONE  # down past the grace


def test_a_new_process_back_after_the_grace_needs_no_fence() -> None:
    down = _step(UP, LinkDown(), 10.0).state
    step = _step(down, CameUp(_instance("n2")), 45.0)
    assert step.state.health is Health.UP
    assert not step.fence
    assert step.restarted


def test_the_first_answer_loses_nothing() -> None:
    step = _step(BackendState.starting(0.0), CameUp(_instance()), 1.0)
    assert step == Transition(BackendState(Health.UP, 1.0, _instance()))


# -- a model: agents, a router core, links that flap and refuse --------------------------------------

NAMES = (BackendId("a"), BackendId("b"), BackendId("c"))
SESSION = SessionId("s1")


@dataclass
class Agent:
    """One backend process: whether it runs, and whether the session is in its memory."""

    nonce: int = 0
    alive: bool = True
    holds: bool = False
    #: the router's control link to it is cut and its address refuses new connections (a
    #: proxy in front of it, an unready endpoint), though the process runs
    refusing: bool = False
    #: since when the router has not reached it at all
    unreachable_since: float | None = None
    #: a client connection of the router has a live link to it, the session attached there
    client_link: bool = False


@dataclass
class World:
    grace: float
    policy: UnknownPolicy = UnknownPolicy.FAIL_CLOSED
    now: float = 0.0
    agents: dict[BackendId, Agent] = field(default_factory=lambda: {n: Agent() for n in NAMES})
    states: dict[BackendId, BackendState] = field(default_factory=dict)
    resumed: int = 0
    #: the old rule: a refused reconnect is gone at once
    refused_is_gone: bool = False

    def __post_init__(self) -> None:
        self.states = {n: BackendState.starting(self.now) for n in NAMES}
        for name in NAMES:
            self._event(name, CameUp(self._instance(name)))

    def _instance(self, name: BackendId) -> Instance:
        return Instance((("name", "agent"),), f"{name}-{self.agents[name].nonce}")

    def _event(self, name: BackendId, event: Event) -> None:
        state = self.states[name]
        if self.refused_is_gone and isinstance(event, LinkDown) and event.refused:
            state = BackendState(Health.GONE, self.now, state.instance)
        self.states[name] = transition(state, event, now=self.now, grace=self.grace).state

    def health(self, name: BackendId) -> Health:
        return self.states[name].at(self.now, self.grace)

    # steps

    def resume(self, silent: int) -> None:
        """A client resumes the session: probe what is up (some may time out), decide on
        the snapshot, and attach it there through a client link."""
        candidates: list[Candidate] = []
        answers: dict[BackendId, ProbeResult] = {}
        for i, name in enumerate(NAMES):
            agent = self.agents[name]
            health = self.health(name)
            attached = agent.client_link and agent.alive
            candidates.append(Candidate(name, health, attached=attached))
            if health is not Health.UP:
                continue
            if silent >> i & 1:
                answers[name] = ProbeResult.UNKNOWN
            else:
                answers[name] = ProbeResult.ACTIVE if agent.holds else ProbeResult.INACTIVE
        snapshot = Snapshot(SESSION, tuple(candidates), policy=self.policy)
        try:
            located = decide(snapshot, answers)
        except (LocateInconclusive, NoBackendAvailable):
            return
        agent = self.agents[located.backend]
        if not agent.alive or (agent.refusing and not agent.client_link):
            return  # the resume's link cannot open: -32013, nothing runs
        agent.holds = True  # shared store: any instance resumes it
        if not agent.client_link:
            agent.client_link = True
            self._event(located.backend, ClientLinkUp(self._instance(located.backend)))
        self.resumed += 1

    def refuse(self, name: BackendId) -> None:
        """Its address refuses new connections and the control link is cut; a client
        link already open carries on (the turn it runs completes)."""
        agent = self.agents[name]
        if agent.alive and not agent.refusing:
            agent.refusing = True
            agent.unreachable_since = self.now
            self._event(name, LinkDown(refused=True))

    def heal(self, name: BackendId) -> None:
        agent = self.agents[name]
        if agent.alive and agent.refusing:
            agent.refusing = False
            agent.unreachable_since = None
            self._event(name, CameUp(self._instance(name)))

    def client_leaves(self, name: BackendId) -> None:
        """The client whose link carried the session disconnects (the agent keeps it)."""
        agent = self.agents[name]
        if agent.client_link:
            agent.client_link = False
            self._event(name, ClientLinkDown())

    def crash(self, name: BackendId) -> None:
        """The process dies and forgets, taking its links with it."""
        agent = self.agents[name]
        if agent.alive:
            agent.alive, agent.holds = False, False
            agent.unreachable_since = agent.unreachable_since or self.now
            if agent.client_link:
                agent.client_link = False
                self._event(name, ClientLinkDown())
            self._event(name, LinkDown(refused=True))

    def restart(self, name: BackendId) -> None:
        agent = self.agents[name]
        if not agent.alive:
            agent.alive, agent.refusing, agent.unreachable_since = True, False, None
            agent.nonce += 1
            self._event(name, CameUp(self._instance(name)))

    def wait(self, seconds: float) -> None:
        """Time passes, with a failed reconnect to every backend that is not reached. A
        refusing backend that no client link reaches heals within the grace (the
        assumption the grace stands for: longer than that, only the agent's own fencing
        can help); one a client link reaches may refuse for as long as it likes."""
        for name, agent in self.agents.items():
            since = agent.unreachable_since or 0.0
            if (
                agent.refusing
                and not agent.client_link
                and self.now + seconds - since >= self.grace
            ):
                self.heal(name)
        self.now += seconds
        for name, agent in self.agents.items():
            if not agent.alive or agent.refusing:
                self._event(name, LinkDown(refused=True))

    def holders(self) -> list[BackendId]:
        return [n for n, a in self.agents.items() if a.alive and a.holds]


def _run(world: World, steps: list[tuple[int, int, int]]) -> None:
    for kind, which, extra in steps:
        name = NAMES[which % len(NAMES)]
        if kind == 0:
            world.resume(extra)
        elif kind == 1:
            world.refuse(name)
        elif kind == 2:
            world.heal(name)
        elif kind == 3:
            world.crash(name)
        elif kind == 4:
            world.restart(name)
        elif kind == 5:
            world.client_leaves(name)
        else:
            world.wait(float(extra % 40))
        assert len(world.holders()) <= 1, f"the session runs on {world.holders()}"


_STEPS = st.lists(
    st.tuples(
        st.sampled_from([0, 0, 0, 1, 2, 3, 4, 5, 6, 6]), st.integers(0, 2), st.integers(0, 63)
    ),
    min_size=5,
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(_STEPS)
def test_no_interleaving_runs_one_session_on_two_backends(
    steps: list[tuple[int, int, int]],
) -> None:
    _run(World(grace=GRACE), steps)


def test_the_model_sees_the_split_that_down_is_gone_made() -> None:
    # the oldest rule (down = out of the pool at once) is a grace of zero: a flap splits
    world = World(grace=0.0)
    with pytest.raises(AssertionError, match="the session runs on"):
        _run(world, [(0, 0, 0), (5, 0, 0), (1, 0, 0), (0, 0, 0)])


def test_the_model_sees_the_split_that_refused_is_gone_made() -> None:
    # the last rule: a refused reconnect is gone at once, while a client link still runs
    # the session there (a proxy in front of the agent refuses new connections)
    world = World(grace=GRACE, refused_is_gone=True)
    with pytest.raises(AssertionError, match="the session runs on"):
        _run(world, [(0, 0, 0), (1, 0, 0), (0, 0, 0)])
    # the rule now: the live client link keeps the session where it is
    world = World(grace=GRACE)
    _run(world, [(0, 0, 0), (1, 0, 0), (6, 0, 50), (0, 0, 0), (6, 0, 50), (0, 0, 0)])
    assert world.holders() == [NAMES[0]]


def test_the_model_resumes_once_the_holder_is_back() -> None:
    world = World(grace=GRACE)
    steps = [(0, 0, 0), (5, 0, 0), (1, 0, 0), (0, 0, 0), (0, 0, 0), (2, 0, 0), (0, 0, 0)]
    _run(world, steps)
    assert world.resumed == 2  # before the outage, and after it: never during
    assert len(world.holders()) == 1
