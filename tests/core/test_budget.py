"""router.core.quotas.Budget as the routing core spends it: which requests cost a locate
or a new session, that a request the core refuses for another reason costs nothing, that
the time is the request's, and that a refusal is told as a Limited effect
(tests.routes_driver plays the shell)."""

from __future__ import annotations

from router.core import quotas
from router.core.effects import AskPool, Limited, Locate, Place, Query, Send
from router.core.quotas import Budget, LocateQuota, SessionQuota
from router.protocol.errors import NoBackendAvailable
from router.protocol.ids import BackendId, SessionId
from tests.routes_driver import (
    Client,
    as_request,
    error,
    error_reply,
    new_params,
    request,
    result,
    sid,
)

ADDRESS = "192.0.2.7"
#: far more than any test spends: the limit a test does not look at never says no
PLENTY = 1000


def budget(
    *,
    locates: int = PLENTY,
    sessions_per_address: int = PLENTY,
    sessions: int = PLENTY,
    sessions_quota: SessionQuota | None = None,
) -> Budget:
    """A connection's budget, full at time 0: ``locates`` per minute on the connection,
    ``sessions_per_address`` and ``sessions`` (the process's) new sessions per minute."""
    return Budget(
        sessions_quota or SessionQuota(sessions_per_address, sessions, max_addresses=8),
        LocateQuota(locates, PLENTY, max_clients=8, per_principal=PLENTY),
        ADDRESS,
        quotas.Client("address", ADDRESS),
        0.0,
    )


def test_what_may_ask_the_whole_pool_costs_a_locate_and_what_is_routed_costs_nothing() -> None:
    client = Client(budget=budget(locates=3))
    client.new_session(1, "a", "s1")
    client.send(request(2, "session/status", sid("s1")))  # asks the pool, attached or not: 1
    client.send(request(3, "session/resume", sid("s1")))  # attached: straight there
    close = request(4, "session/close", sid("s1"))
    assert client.send(close) == ()  # held behind the resume
    assert isinstance(client.send(request(5, "session/resume", sid("s2")))[0], Locate)  # 2
    assert isinstance(client.send(request(6, "session/close", sid("s3")))[0], Locate)  # 3
    refused = client.send(request(7, "session/load", sid("s4")))
    assert refused[0] == Limited("locates", "connection")
    assert error_reply(refused[1:], 7, -32014)["limit"] == "connection"
    # the held close goes where its session is attached: nothing to locate, nothing spent
    assert client.backend("a", result(3, {}))[-1] == Send(BackendId("a"), close)
    # a resume located again after a -32002 is the router's doing: not charged either
    client.located(5, "b")
    assert isinstance(client.backend("b", error(5, -32002))[-1], Locate)


def test_each_list_page_costs_a_locate() -> None:
    """A page of ``session/list`` asks every backend: it is charged as a locate is."""
    client = Client(budget=budget(locates=1))
    listing = request(1, "session/list", {})
    assert client.send(listing) == (AskPool(Query.LIST, as_request(listing)),)
    refused = client.send(request(2, "session/list", {}))
    assert refused[0] == Limited("locates", "connection")
    assert error_reply(refused[1:], 2, -32014)["limit"] == "connection"


def test_a_new_session_refused_by_the_core_costs_no_token() -> None:
    """The quota is spent after the core's own checks: a ``session/new`` before
    ``initialize``, one with a reserved id, or one with an id already in flight is
    refused for that, and the address's one token is still there for the real one."""
    client = Client(initialized=False, budget=budget(sessions_per_address=1))
    error_reply(client.send(request(1, "session/new", new_params())), 1, -32600)
    client.send(request("init", "initialize", {"protocolVersion": 1}))
    client.initialized("init", {"protocolVersion": 1})
    reserved = request("acp-router:x", "session/new", new_params())
    error_reply(client.send(reserved), "acp-router:x", -32600)
    assert isinstance(client.send(request(2, "session/new", new_params()))[0], Place)
    error_reply(client.send(request(2, "session/new", new_params())), 2, -32600)  # in flight
    refused = client.send(request(3, "session/new", new_params()))
    assert refused[0] == Limited("sessions", "address")
    assert error_reply(refused[1:], 3, -32014)["limit"] == "address"


def test_the_process_limit_is_shared_by_every_connection_and_refills_with_time() -> None:
    shared = SessionQuota(PLENTY, 1, max_addresses=8)
    first = Client(budget=budget(sessions_quota=shared))
    second = Client(budget=budget(sessions_quota=shared))
    assert isinstance(first.send(request(1, "session/new", new_params()), now=1.0)[0], Place)
    refused = second.send(request(1, "session/new", new_params()), now=2.0)
    assert refused[0] == Limited("sessions", "process")
    data = error_reply(refused[1:], 1, -32014)
    assert data["limit"] == "process"
    assert 0 < data["retryAfterMs"] <= 60_000
    # a minute later, the one token per minute is back
    assert isinstance(second.send(request(2, "session/new", new_params()), now=62.0)[0], Place)


def test_a_fork_costs_a_new_session() -> None:
    client = Client(budget=budget(sessions_per_address=2))
    client.new_session(1, "a", "s1")  # the first token
    fork = request(2, "session/fork", sid("s1"))
    assert client.send(fork)[-1] == Send(BackendId("a"), fork)  # the second
    refused = client.send(request(3, "session/fork", sid("s1")))
    assert refused[0] == Limited("sessions", "address")


def test_a_held_request_spends_the_budget_as_of_its_arrival() -> None:
    """A close held behind its session's resume is located once the resume fails; it is
    charged then, with the time it came (when the budget had refilled), not with the
    time of whatever event released it."""
    client = Client(budget=budget(locates=1))
    resume = request(1, "session/resume", sid("s1"))
    assert isinstance(client.send(resume, now=0.0)[0], Locate)  # the one locate
    close = request(2, "session/close", sid("s1"))
    assert client.send(close, now=61.0) == ()  # held; a token a minute: one is back
    released = client.fail(1, NoBackendAvailable())
    assert Locate(as_request(close), SessionId("s1")) in released
    assert not any(isinstance(effect, Limited) for effect in released)
