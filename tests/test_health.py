"""router.core.health: backend states and their transitions, and a model of the core
(health + locate) that checks no interleaving runs one session on two backends."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings, strategies as st

from router.core.health import (
    BackendState,
    CameUp,
    Health,
    Instance,
    LinkDown,
    Transition,
    transition,
)
from router.core.locate import UnknownPolicy, decide
from router.protocol.acp import ProbeResult
from router.protocol.errors import LocateInconclusive, NoBackendAvailable
from router.protocol.ids import BackendId

GRACE = 30.0
AGENT = (("name", "agent"), ("version", "1"))


def _instance(nonce: str | None = "n1", info: tuple[tuple[str, str], ...] = AGENT) -> Instance:
    return Instance(info, nonce)


def _step(state: BackendState, event: CameUp | LinkDown, now: float) -> Transition:
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


def test_a_refused_reconnect_is_gone_at_once() -> None:
    down = _step(UP, LinkDown(), 10.0).state
    step = _step(down, LinkDown(refused=True), 10.5)
    assert step.state.health is Health.GONE
    assert step.lost_memory
    # told once
    assert not _step(step.state, LinkDown(refused=True), 11.0).lost_memory
    assert _step(UP, LinkDown(refused=True), 1.0).state.health is Health.GONE


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


def test_coming_back_after_the_grace_reports_the_lost_memory() -> None:
    down = _step(UP, LinkDown(), 10.0).state
    step = _step(down, CameUp(_instance()), 45.0)
    assert step.state.health is Health.UP
    assert step.lost_memory
    assert not step.restarted


def test_the_first_answer_loses_nothing() -> None:
    step = _step(BackendState.starting(0.0), CameUp(_instance()), 1.0)
    assert step == Transition(BackendState(Health.UP, 1.0, _instance()))


# -- a model: agents, a router core, links that flap ---------------------------------------------

NAMES = (BackendId("a"), BackendId("b"), BackendId("c"))
SESSION = "s1"


@dataclass
class Agent:
    """One backend process: whether it runs, and whether the session is in its memory."""

    nonce: int = 0
    alive: bool = True
    holds: bool = False
    #: the router's control link to it is cut (a partition), though it may run
    partitioned: bool = False
    #: since when the router has not reached it
    unreachable_since: float | None = None


@dataclass
class World:
    grace: float
    policy: UnknownPolicy = UnknownPolicy.FAIL_CLOSED
    now: float = 0.0
    agents: dict[BackendId, Agent] = field(default_factory=lambda: {n: Agent() for n in NAMES})
    states: dict[BackendId, BackendState] = field(default_factory=dict)
    resumed: int = 0

    def __post_init__(self) -> None:
        self.states = {n: BackendState.starting(self.now) for n in NAMES}
        for name in NAMES:
            self._event(name, CameUp(self._instance(name)))

    def _instance(self, name: BackendId) -> Instance:
        return Instance((("name", "agent"),), f"{name}-{self.agents[name].nonce}")

    def _event(self, name: BackendId, event: CameUp | LinkDown) -> None:
        self.states[name] = transition(
            self.states[name], event, now=self.now, grace=self.grace
        ).state

    def health(self, name: BackendId) -> Health:
        return self.states[name].at(self.now, self.grace)

    # steps

    def resume(self, silent: int) -> None:
        """A client resumes the session: probe what is up (some may time out), decide."""
        order = [n for n in NAMES if self.health(n) is Health.UP]
        answers: dict[BackendId, ProbeResult] = {}
        for i, name in enumerate(order):
            agent = self.agents[name]
            if silent >> i & 1:
                answers[name] = ProbeResult.UNKNOWN
            else:
                answers[name] = ProbeResult.ACTIVE if agent.holds else ProbeResult.INACTIVE
        unreachable = [n for n in NAMES if self.health(n) is Health.UNKNOWN]
        try:
            located = decide(
                order, answers, self.policy, session_id=SESSION, unreachable=unreachable
            )
        except (LocateInconclusive, NoBackendAvailable):
            return
        assert self.health(located.backend) is Health.UP, "placed on a backend not up"
        self.agents[located.backend].holds = True  # shared store: any instance resumes it
        self.resumed += 1

    def partition(self, name: BackendId) -> None:
        agent = self.agents[name]
        if agent.alive and not agent.partitioned:
            agent.partitioned = True
            agent.unreachable_since = self.now
            self._event(name, LinkDown())

    def heal(self, name: BackendId) -> None:
        agent = self.agents[name]
        if agent.alive and agent.partitioned:
            agent.partitioned = False
            agent.unreachable_since = None
            self._event(name, CameUp(self._instance(name)))

    def crash(self, name: BackendId, refused: bool) -> None:
        """The process dies and forgets; its port refuses, or its host went dark."""
        agent = self.agents[name]
        if agent.alive:
            agent.alive, agent.holds = False, False
            agent.unreachable_since = agent.unreachable_since or self.now
            self._event(name, LinkDown(refused=refused))

    def restart(self, name: BackendId) -> None:
        agent = self.agents[name]
        if not agent.alive:
            agent.alive, agent.partitioned, agent.unreachable_since = True, False, None
            agent.nonce += 1
            self._event(name, CameUp(self._instance(name)))

    def wait(self, seconds: float) -> None:
        """Time passes; a partition never outlasts the grace (the assumption the grace
        stands for: longer than that, only the agent's own fencing can help)."""
        for name, agent in self.agents.items():
            if (
                agent.partitioned
                and self.now + seconds - (agent.unreachable_since or 0) >= self.grace
            ):
                self.heal(name)
        self.now += seconds
        for name, agent in self.agents.items():
            if not agent.alive:
                self._event(name, LinkDown())  # a failed reconnect

    def holders(self) -> list[BackendId]:
        return [n for n, a in self.agents.items() if a.alive and a.holds]


def _run(world: World, steps: list[tuple[int, int, int]]) -> None:
    for kind, which, extra in steps:
        name = NAMES[which % len(NAMES)]
        if kind == 0:
            world.resume(extra)
        elif kind == 1:
            world.partition(name)
        elif kind == 2:
            world.heal(name)
        elif kind == 3:
            world.crash(name, refused=bool(extra & 1))
        elif kind == 4:
            world.restart(name)
        else:
            world.wait(float(extra % 40))
        assert len(world.holders()) <= 1, f"the session runs on {world.holders()}"


_STEPS = st.lists(
    st.tuples(st.sampled_from([0, 0, 0, 1, 2, 3, 4, 5]), st.integers(0, 2), st.integers(0, 63)),
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
    # the old rule (down = out of the pool at once) is a grace of zero: a flap splits
    world = World(grace=0.0)
    with pytest.raises(AssertionError, match="the session runs on"):
        _run(world, [(0, 0, 0), (1, 0, 0), (0, 0, 0), (2, 0, 0)])


def test_the_model_resumes_once_the_holder_is_back() -> None:
    world = World(grace=GRACE)
    _run(world, [(0, 0, 0), (1, 0, 0), (0, 0, 0), (0, 0, 0), (2, 0, 0), (0, 0, 0)])
    assert world.resumed == 2  # before the flap, and after it: never during
    assert len(world.holders()) == 1
