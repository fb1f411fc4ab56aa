"""What the core's fleet says about a pool that has just started (issue 23): which
members a locate waits for, and whether the router knows what its pool offers."""

from __future__ import annotations

from typing import Any

from router.core.fleet import FirstContact, Fleet
from router.core.health import CameUp, Instance, LinkDown
from router.core.placement import Node
from router.protocol.ids import BackendId, SessionId

A, B = BackendId("a"), BackendId("b")
GRACE = 30.0
WITHIN = 5.0


def started(now: float = 100.0) -> Fleet:
    fleet = Fleet(GRACE)
    for backend in (A, B):
        fleet.join(backend, now)
    fleet.rank([Node(A, 1), Node(B, 1)])
    return fleet


def answer(fleet: Fleet, backend: BackendId, now: float) -> None:
    fleet.hear(backend, CameUp(Instance.of({"_meta": {}})), now)
    fleet.capabilities[backend] = {"agentCapabilities": {}}


def test_a_locate_waits_for_the_members_not_heard_from_until_the_latest_joined_deadline() -> None:
    fleet = started()
    assert fleet.first_contact(100.0, WITHIN) == FirstContact((A, B), 105.0)
    answer(fleet, A, 101.0)
    assert fleet.first_contact(101.0, WITHIN) == FirstContact((B,), 105.0)
    answer(fleet, B, 102.0)
    assert fleet.first_contact(102.0, WITHIN) is None


def test_no_member_is_waited_for_past_the_bound() -> None:
    fleet = started()
    assert fleet.first_contact(105.0, WITHIN) is None  # they stay unknown: fail closed


def test_a_member_that_answered_once_is_not_waited_for_when_its_link_drops() -> None:
    fleet = started()
    answer(fleet, A, 101.0)
    fleet.hear(A, LinkDown(), 102.0)
    awaited = fleet.first_contact(102.0, WITHIN)
    assert awaited is not None
    assert awaited.backends == (B,)


def test_a_member_that_joins_later_is_waited_for_from_its_own_join() -> None:
    fleet = started()
    answer(fleet, A, 101.0)
    answer(fleet, B, 101.0)
    late = BackendId("c")
    fleet.join(late, 200.0)
    fleet.rank([Node(A, 1), Node(B, 1), Node(late, 1)])
    assert fleet.first_contact(201.0, WITHIN) == FirstContact((late,), 205.0)


def test_the_pool_is_introduced_once_any_member_said_what_it_offers() -> None:
    fleet = started()
    assert not fleet.introduced()
    answer(fleet, B, 101.0)
    assert fleet.introduced()
    assert Fleet(GRACE).introduced()  # no member: nothing to wait for


def test_an_initialize_waits_for_one_member_only_and_not_past_the_window() -> None:
    fleet = started()
    assert fleet.first_contact(100.0, WITHIN, any_one=True) == FirstContact((A, B), 105.0)
    answer(fleet, B, 101.0)
    assert fleet.first_contact(101.0, WITHIN, any_one=True) is None  # b said what it offers
    assert fleet.first_contact(101.0, WITHIN) == FirstContact((A,), 105.0)  # a locate waits
    silent = started()
    assert silent.first_contact(106.0, WITHIN, any_one=True) is None  # never answered: no wait


def test_a_list_page_asks_the_members_that_are_up_and_list() -> None:
    fleet = started()
    answer(fleet, A, 101.0)
    answer(fleet, B, 101.0)
    assert fleet.listable(102.0) == set()  # neither advertised session/list
    fleet.capabilities[A] = {"agentCapabilities": {"sessionCapabilities": {"list": {}}}}
    fleet.capabilities[B] = {"agentCapabilities": {"sessionCapabilities": {"list": {}}}}
    assert fleet.listable(102.0) == {A, B}
    fleet.hear(B, LinkDown(), 103.0)
    assert fleet.listable(103.0) == {A}


def test_what_a_backend_offers_is_what_its_control_link_came_up_with() -> None:
    fleet = started()
    listing: dict[str, Any] = {"agentCapabilities": {"sessionCapabilities": {"list": {}}}}
    fleet.hear(A, CameUp(Instance.of({"_meta": {}}), listing), 101.0)
    assert fleet.can_ask(A, "list")
    assert not fleet.can_ask(B, "list")  # not heard from
    fleet.hear(A, CameUp(Instance.of({"_meta": {}}), {"agentCapabilities": {}}), 102.0)
    assert not fleet.can_ask(A, "list")  # it came up again without it


def test_a_claimed_home_is_a_likely_one_only_when_it_is_a_member() -> None:
    fleet = started()
    answer(fleet, A, 101.0)
    answer(fleet, B, 101.0)
    session = SessionId("s")
    assert fleet.likely(session, (), None, 102.0, claimed=B) == B
    assert fleet.likely(session, (), None, 102.0, claimed=BackendId("stranger")) is None
    assert fleet.likely(session, (A,), None, 102.0, claimed=B) == A  # attached here first
