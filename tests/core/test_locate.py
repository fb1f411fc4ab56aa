"""router.core.locate: choosing a backend from probe answers, the pool's status, the hint cache."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import pytest

from router.core.health import Health
from router.core.hints import Hint, LocationCache
from router.core.locate import (
    AdminState,
    Ask,
    Candidate,
    Located,
    LocateRound,
    Outcome,
    Snapshot,
    Stage,
    UnknownPolicy,
    decide as decide_snapshot,
    evidence,
    hint_after,
)
from router.core.session_status import StatusRound, pool_status
from router.core.split_brain import How, Verdict, judge
from router.protocol.acp import ProbeResult, StatusAnswer, classify_status, read_status
from router.protocol.errors import (
    ErrorObject,
    LocateInconclusive,
    NoBackendAvailable,
    SessionNotFound,
)
from router.protocol.ids import BackendId, SessionId
from router.protocol.jsonrpc import Response

ACTIVE = ProbeResult.ACTIVE
INACTIVE = ProbeResult.INACTIVE
NOT_FOUND = ProbeResult.NOT_FOUND
UNKNOWN = ProbeResult.UNKNOWN

ORDER = ("a", "b", "c")


def decide(
    order: Sequence[str],
    answers: Mapping[str, ProbeResult],
    policy: UnknownPolicy = UnknownPolicy.FAIL_CLOSED,
    *,
    session_id: str,
    unreachable: Sequence[str] = (),
    remembered: str | None = None,
    tried: Sequence[str] = (),
    draining: Sequence[str] = (),
    maintenance: Sequence[str] = (),
) -> Located:
    """:func:`router.core.locate.decide` over a snapshot made of the pieces: ``order`` are
    the backends up (those in ``answers`` were probed; the rest cannot be), then the
    ``unreachable`` ones (down, not gone)."""

    def admin(backend: str) -> AdminState:
        if backend in maintenance:
            return AdminState.MAINT
        return AdminState.DRAIN if backend in draining else AdminState.READY

    candidates = [
        Candidate(BackendId(b), Health.UP, has_status=b in answers, admin=admin(b)) for b in order
    ]
    candidates += [Candidate(BackendId(b), Health.UNKNOWN, admin=admin(b)) for b in unreachable]
    hint = Hint(BackendId(remembered)) if remembered is not None else None
    snapshot = Snapshot(
        SessionId(session_id), tuple(candidates), hint, policy, tuple(map(BackendId, tried))
    )
    return decide_snapshot(snapshot, {BackendId(b): r for b, r in answers.items()})


def _decide(
    answers: Mapping[str, ProbeResult],
    policy: UnknownPolicy = UnknownPolicy.FAIL_CLOSED,
    order: tuple[str, ...] = ORDER,
) -> Located:
    return decide(order, answers, policy, session_id="s1")


# -- decide ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("where", ORDER)
def test_one_active_wins(where: str) -> None:
    answers = dict.fromkeys(ORDER, NOT_FOUND) | {where: ACTIVE}
    assert _decide(answers) == Located(where, Outcome.ACTIVE)


def test_one_active_wins_over_inactive_and_unknown() -> None:
    answers = {"a": UNKNOWN, "b": INACTIVE, "c": ACTIVE}
    assert _decide(answers) == Located("c", Outcome.ACTIVE)


def test_several_active_pick_the_best_ranked_and_report_split_brain() -> None:
    answers = {"a": NOT_FOUND, "b": ACTIVE, "c": ACTIVE}
    assert _decide(answers) == Located(
        "b", Outcome.ACTIVE, ("b", "c"), Verdict("b", ("c",), How.RANK)
    )
    everywhere = dict.fromkeys(ORDER, ACTIVE)
    assert _decide(everywhere) == Located(
        "a", Outcome.ACTIVE, ORDER, Verdict("a", ("b", "c"), How.RANK)
    )


def test_split_brain_follows_the_ranking_not_the_answer_order() -> None:
    answers = {"c": ACTIVE, "a": ACTIVE}
    located = decide(("c", "b", "a"), answers, session_id="s1")
    assert located == Located("c", Outcome.ACTIVE, ("c", "a"), Verdict("c", ("a",), How.RANK))


@pytest.mark.parametrize(
    "answers",
    [
        {"a": UNKNOWN, "b": NOT_FOUND, "c": NOT_FOUND},
        {"a": NOT_FOUND, "b": INACTIVE, "c": UNKNOWN},
        dict.fromkeys(ORDER, UNKNOWN),
    ],
)
def test_unknown_without_active_fails_closed(answers: dict[str, ProbeResult]) -> None:
    with pytest.raises(LocateInconclusive) as caught:
        _decide(answers)
    error = caught.value.to_error()
    assert error["code"] == -32012
    assert error["data"]["sessionId"] == "s1"
    assert error["data"]["retryable"] is True
    assert error["data"]["backends"] == [b for b in ORDER if answers[b] is UNKNOWN]


def test_unknown_under_place_anyway_goes_to_a_knower_first() -> None:
    answers = {"a": UNKNOWN, "b": NOT_FOUND, "c": INACTIVE}
    located = _decide(answers, UnknownPolicy.PLACE_ANYWAY)
    assert located == Located("c", Outcome.INACTIVE)


def test_unknown_under_place_anyway_falls_back_to_the_best_ranked() -> None:
    answers = {"a": UNKNOWN, "b": NOT_FOUND, "c": NOT_FOUND}
    assert _decide(answers, UnknownPolicy.PLACE_ANYWAY) == Located("a", Outcome.DEFAULT)


def test_inactive_goes_to_the_best_ranked_knower() -> None:
    answers = {"a": NOT_FOUND, "b": INACTIVE, "c": INACTIVE}
    assert _decide(answers) == Located("b", Outcome.INACTIVE)
    assert _decide({"c": INACTIVE}) == Located("c", Outcome.INACTIVE)


def test_nothing_known_goes_to_the_first_in_order() -> None:
    assert _decide(dict.fromkeys(ORDER, NOT_FOUND)) == Located("a", Outcome.DEFAULT)


def test_backends_not_probed_count_as_not_knowing() -> None:
    # a and c do not advertise session/status: never probed, never "unknown"
    assert _decide({"b": NOT_FOUND}) == Located("a", Outcome.DEFAULT)
    assert _decide({}) == Located("a", Outcome.DEFAULT)
    assert _decide({"c": INACTIVE}) == Located("c", Outcome.INACTIVE)


def test_answers_from_backends_outside_the_order_are_ignored() -> None:
    # a backend that went down after answering is not in the order any more
    answers = {"gone": ACTIVE, "other": UNKNOWN, "a": NOT_FOUND, "b": NOT_FOUND, "c": NOT_FOUND}
    assert _decide(answers) == Located("a", Outcome.DEFAULT)


def test_down_but_not_gone_backends_are_unknown() -> None:
    answers = {"a": NOT_FOUND, "b": INACTIVE}
    with pytest.raises(LocateInconclusive) as caught:
        decide(("a", "b"), answers, session_id="s1", unreachable=("c",))
    assert caught.value.to_error()["data"]["backends"] == ["c"]
    # an active answer from a backend that is up still wins: it holds the session
    located = decide(("a", "b"), {"a": ACTIVE}, session_id="s1", unreachable=("c",))
    assert located == Located("a", Outcome.ACTIVE)
    anyway = decide(
        ("a", "b"), answers, UnknownPolicy.PLACE_ANYWAY, session_id="s1", unreachable=("c",)
    )
    assert anyway == Located("b", Outcome.INACTIVE)


def test_nothing_but_unreachable_backends_is_no_backend_available() -> None:
    with pytest.raises(NoBackendAvailable):
        decide((), {}, session_id="s1", unreachable=("a",))


def test_blind_backends_are_tried_remembered_first_then_in_rank_order() -> None:
    # b and c cannot be probed; a said not found
    answers = {"a": NOT_FOUND}
    assert decide(ORDER, answers, session_id="s1", remembered="c") == Located(
        "c", Outcome.REMEMBERED
    )
    assert decide(ORDER, answers, session_id="s1", remembered="c", tried=("c",)) == Located(
        "b", Outcome.DEFAULT
    )
    assert decide(ORDER, answers, session_id="s1", tried=("b",)) == Located("c", Outcome.DEFAULT)
    with pytest.raises(SessionNotFound):
        decide(ORDER, answers, session_id="s1", tried=("b", "c"))


def test_a_remembered_backend_that_can_be_probed_defers_to_its_answer() -> None:
    answers = {"a": NOT_FOUND, "b": INACTIVE, "c": NOT_FOUND}
    located = decide(ORDER, answers, session_id="s1", remembered="c")
    assert located == Located("b", Outcome.INACTIVE)


def test_a_knower_that_said_not_found_on_resume_is_not_tried_again() -> None:
    answers = {"a": INACTIVE, "b": INACTIVE, "c": NOT_FOUND}
    assert decide(ORDER, answers, session_id="s1", tried=("a",)) == Located("b", Outcome.INACTIVE)
    with pytest.raises(SessionNotFound) as caught:
        decide(ORDER, answers, session_id="s1", tried=("a", "b"))
    assert caught.value.to_error()["data"] == {"sessionId": "s1"}


def test_empty_order_is_no_backend_available() -> None:
    with pytest.raises(NoBackendAvailable) as caught:
        _decide({"a": ACTIVE}, order=())
    error = caught.value.to_error()
    assert error["code"] == -32011
    assert error["data"] == {"sessionId": "s1", "retryable": True}


# -- evidence: a backend's answer, else an attachment through this router -------------------------


def _snapshot(*candidates: Candidate, hint: Hint | None = None) -> Snapshot:
    return Snapshot(SessionId("s1"), candidates, hint)


def _up(name: str, **more: Any) -> Candidate:
    return Candidate(BackendId(name), Health.UP, **more)


def test_a_backends_own_answer_wins_over_an_attachment_here() -> None:
    attached = _up("a", attached=True)
    assert evidence(attached, INACTIVE) is INACTIVE
    assert evidence(attached, NOT_FOUND) is NOT_FOUND
    assert evidence(attached, ACTIVE) is ACTIVE
    # where it could not answer, the attachment is the evidence
    assert evidence(attached, UNKNOWN) is ACTIVE
    assert evidence(attached, None) is ACTIVE
    assert evidence(_up("a"), UNKNOWN) is UNKNOWN
    assert evidence(_up("a"), None) is None  # up, cannot be asked: blind


def test_a_live_client_link_keeps_a_refusing_backend_the_sessions_home() -> None:
    # The control link is refused (a proxy in front of a live agent), but a client link of
    # this router still carries the session there: it is active there, never elsewhere.
    holder = Candidate(BackendId("a"), Health.UNKNOWN, attached=True)
    snapshot = _snapshot(holder, _up("b"), _up("c"))
    located = decide_snapshot(snapshot, {BackendId("b"): INACTIVE, BackendId("c"): NOT_FOUND})
    assert located == Located("a", Outcome.ACTIVE)
    # without the attachment it is unknown, and the resume fails closed
    unknown = _snapshot(Candidate(BackendId("a"), Health.UNKNOWN), _up("b"), _up("c"))
    with pytest.raises(LocateInconclusive):
        decide_snapshot(unknown, {BackendId("b"): INACTIVE, BackendId("c"): NOT_FOUND})


def test_a_mixed_backends_answer_does_not_outweigh_a_live_link_here() -> None:
    # its URL reaches more than one process: its control link's "not found" is one
    # process's word, and this router holds the session on a live link to the URL
    mixed = _up("a", attached=True, mixed=True)
    assert evidence(mixed, NOT_FOUND) is ACTIVE
    assert evidence(mixed, INACTIVE) is ACTIVE
    assert evidence(_up("a", mixed=True), NOT_FOUND) is NOT_FOUND  # nothing held here
    snapshot = _snapshot(mixed, _up("b"))
    located = decide_snapshot(snapshot, {BackendId("a"): NOT_FOUND, BackendId("b"): INACTIVE})
    assert located == Located("a", Outcome.ACTIVE)  # never resumed on "b" beside it


def test_a_gone_backend_is_not_in_the_pool() -> None:
    snapshot = _snapshot(Candidate(BackendId("a"), Health.GONE, attached=True), _up("b"))
    assert decide_snapshot(snapshot, {BackendId("b"): INACTIVE}) == Located("b", Outcome.INACTIVE)


# -- a locate round: the hint first, then the pool ------------------------------------------------


def _round(snapshot: Snapshot, now: float = 100.0) -> LocateRound:
    return LocateRound(snapshot, now=now, verify_after=5.0)


def test_a_round_with_no_hint_asks_every_backend_that_can_be_asked() -> None:
    snapshot = _snapshot(_up("a"), _up("b", has_status=False), _up("c"))
    round_ = _round(snapshot)
    assert round_.start() == Ask((BackendId("a"), BackendId("c")))
    located = round_.hear({BackendId("a"): NOT_FOUND, BackendId("c"): ACTIVE})
    assert located == Located("c", Outcome.ACTIVE)
    assert (round_.stage, round_.probes, round_.checked) == (Stage.MISS, 2, 100.0)


def test_a_confirmed_hint_that_says_active_is_trusted_alone() -> None:
    hint = Hint(BackendId("b"), checked=97.0)
    round_ = _round(_snapshot(_up("a"), _up("b"), _up("c"), hint=hint))
    assert round_.start() == Ask((BackendId("b"),))
    assert round_.hear({BackendId("b"): ACTIVE}) == Located("b", Outcome.ACTIVE, alone=True)
    assert (round_.stage, round_.probes, round_.checked) == (Stage.HIT, 1, 97.0)


def test_an_old_confirmation_is_trusted_with_an_audit_to_follow() -> None:
    # after a restart no fan-out confirmed anything: the hint's active is trusted, and
    # the rest of the pool is asked off the request path (the audit), not on it
    hint = Hint(BackendId("b"), checked=90.0)
    round_ = _round(_snapshot(_up("a"), _up("b"), _up("c"), hint=hint))
    round_.start()
    located = round_.hear({BackendId("b"): ACTIVE})
    assert located == Located("b", Outcome.ACTIVE, audit=True, alone=True)
    assert (round_.stage, round_.probes, round_.checked) == (Stage.AUDIT, 1, None)
    never = _round(_snapshot(_up("a"), _up("b"), hint=Hint(BackendId("b"))))
    never.start()
    assert never.hear({BackendId("b"): ACTIVE}) == Located(
        "b", Outcome.ACTIVE, audit=True, alone=True
    )


def test_a_hint_seen_elsewhere_here_asks_the_rest_now_and_sees_a_split() -> None:
    # this router has the session attached on "a" (a live link): "b" saying active too is
    # a split brain in plain sight, not one for an audit to find later
    hint = Hint(BackendId("b"), checked=90.0)
    round_ = _round(_snapshot(_up("a", attached=True), _up("b"), _up("c"), hint=hint))
    round_.start()
    assert round_.hear({BackendId("b"): ACTIVE}) == Ask((BackendId("a"), BackendId("c")))
    located = round_.hear({BackendId("a"): ACTIVE, BackendId("c"): INACTIVE})
    assert located == Located("a", Outcome.ACTIVE, ("a", "b"), Verdict("a", ("b",), How.ATTACHED))
    assert (round_.stage, round_.checked) == (Stage.VERIFY, 100.0)


def test_a_stale_hint_asks_the_rest() -> None:
    round_ = _round(_snapshot(_up("a"), _up("b"), hint=Hint(BackendId("b"), checked=99.0)))
    round_.start()
    assert round_.hear({BackendId("b"): NOT_FOUND}) == Ask((BackendId("a"),))
    assert round_.hear({BackendId("a"): INACTIVE}) == Located("a", Outcome.INACTIVE)
    assert (round_.stage, round_.checked) == (Stage.STALE, None)


def test_a_hint_to_a_backend_that_cannot_be_asked_is_remembered_not_probed() -> None:
    hint = Hint(BackendId("b"), lasting=True)
    round_ = _round(_snapshot(_up("a"), _up("b", has_status=False), hint=hint))
    assert round_.start() == Ask((BackendId("a"),))
    assert round_.hear({BackendId("a"): NOT_FOUND}) == Located("b", Outcome.REMEMBERED)


def test_a_hint_in_maintenance_or_down_is_not_asked_first() -> None:
    maint = _up("b", admin=AdminState.MAINT)
    round_ = _round(_snapshot(_up("a"), maint, hint=Hint(BackendId("b"), checked=99.0)))
    assert round_.start() == Ask((BackendId("a"), BackendId("b")))
    down = Candidate(BackendId("b"), Health.UNKNOWN)
    round_ = _round(_snapshot(_up("a"), down, hint=Hint(BackendId("b"), checked=99.0)))
    assert round_.start() == Ask((BackendId("a"),))


# -- a client's claim: the home its hinted id names ------------------------------------------------


def _claimed(*candidates: Candidate, claimed: str, hint: Hint | None = None) -> Snapshot:
    return Snapshot(SessionId("s1"), candidates, hint, claimed=BackendId(claimed))


def test_a_claim_is_asked_first_and_trusted_only_with_an_audit() -> None:
    round_ = _round(_claimed(_up("a"), _up("b"), _up("c"), claimed="c"))
    assert round_.start() == Ask((BackendId("c"),))
    assert round_.hear({BackendId("c"): ACTIVE}) == Located(
        "c", Outcome.ACTIVE, audit=True, alone=True
    )
    # it said active: a probe confirmed it, so the locate leaves a hint there
    assert hint_after(round_, Located("c", Outcome.ACTIVE, audit=True)) is None


def test_a_claim_that_is_not_active_is_forgotten_and_the_pool_asked() -> None:
    round_ = _round(_claimed(_up("a"), _up("b"), _up("c"), claimed="c"))
    round_.start()
    assert round_.hear({BackendId("c"): NOT_FOUND}) == Ask((BackendId("a"), BackendId("b")))
    located = round_.hear({BackendId("a"): NOT_FOUND, BackendId("b"): NOT_FOUND})
    assert located == Located("a", Outcome.DEFAULT)
    assert hint_after(round_, located) is False  # nothing found: nothing remembered
    assert (round_.stage, round_.probes) == (Stage.STALE, 3)


def test_the_routers_own_hint_is_asked_before_a_claim() -> None:
    hint = Hint(BackendId("b"), checked=99.0)
    round_ = _round(_claimed(_up("a"), _up("b"), _up("c"), claimed="c", hint=hint))
    assert round_.start() == Ask((BackendId("b"),))


def test_a_claim_is_not_where_the_router_placed_a_split_session() -> None:
    # both copies active, neither attached here: the claim does not choose the home (it
    # would, as "placed", if it were the router's own hint); the rank does
    snapshot = _claimed(_up("a"), _up("b"), claimed="b")
    located = decide_snapshot(snapshot, {BackendId("a"): ACTIVE, BackendId("b"): ACTIVE})
    assert located.verdict == Verdict("a", ("b",), How.RANK)
    placed = decide_snapshot(
        Snapshot(SessionId("s1"), snapshot.candidates, Hint(BackendId("b"))),
        {BackendId("a"): ACTIVE, BackendId("b"): ACTIVE},
    )
    assert placed.verdict == Verdict("b", ("a",), How.PLACED)


def test_a_claim_orders_the_backends_that_cannot_be_asked_and_leaves_no_hint() -> None:
    blind = (_up("a", has_status=False), _up("b", has_status=False), _up("c", has_status=False))
    round_ = _round(_claimed(*blind, claimed="b"))
    located = round_.start()
    assert located == Located("b", Outcome.DEFAULT)
    assert isinstance(located, Located)
    assert hint_after(round_, located) is False  # the resume's answer says whether it is there
    # the router's own memory comes first, and is not a default
    remembered = _round(_claimed(*blind, claimed="b", hint=Hint(BackendId("c"), lasting=True)))
    assert remembered.start() == Located("c", Outcome.REMEMBERED)


# -- the router's session/status --------------------------------------------------------------------


def test_status_asks_where_it_is_attached_first() -> None:
    round_ = StatusRound(_snapshot(_up("a"), _up("b", attached=True), _up("c")))
    assert round_.start() == Ask((BackendId("b"),))
    running = {"state": "running"}
    answer = round_.hear({BackendId("b"): StatusAnswer(ACTIVE, running)})
    assert answer == {"status": "active", "state": running}


def test_status_of_a_session_its_backend_no_longer_has_is_the_pools_answer() -> None:
    # closed elsewhere: the backend it is attached to says inactive, and that answer wins
    round_ = StatusRound(_snapshot(_up("a"), _up("b", attached=True)))
    round_.start()
    assert round_.hear({BackendId("b"): StatusAnswer(INACTIVE)}) == Ask((BackendId("a"),))
    assert round_.hear({BackendId("a"): StatusAnswer(NOT_FOUND)}) == {"status": "inactive"}


def test_status_where_no_backend_can_say_is_the_attachment() -> None:
    round_ = StatusRound(_snapshot(_up("a", has_status=False, attached=True)))
    assert round_.start() == {"status": "active"}
    silent = StatusRound(_snapshot(_up("a", attached=True)))
    silent.start()
    assert silent.hear({BackendId("a"): StatusAnswer(UNKNOWN)}) == {"status": "active"}


def test_status_with_nothing_up_and_nothing_attached_is_no_backend() -> None:
    with pytest.raises(NoBackendAvailable):
        StatusRound(_snapshot(Candidate(BackendId("a"), Health.UNKNOWN))).start()


# -- backends an operator took out (drain, maintenance) -------------------------------------------


def test_a_draining_backend_still_takes_the_sessions_located_there() -> None:
    draining = ("a",)
    active = decide(ORDER, {"a": ACTIVE, "b": NOT_FOUND}, session_id="s1", draining=draining)
    assert active == Located("a", Outcome.ACTIVE)
    only_there = {"a": INACTIVE, "b": NOT_FOUND, "c": NOT_FOUND}
    assert decide(ORDER, only_there, session_id="s1", draining=draining) == Located(
        "a", Outcome.INACTIVE
    )


def test_a_draining_backend_takes_nothing_else() -> None:
    # a knower that is not draining comes first; nobody knows it: not the default either
    both = {"a": INACTIVE, "b": NOT_FOUND, "c": INACTIVE}
    assert decide(ORDER, both, session_id="s1", draining=("a",)) == Located("c", Outcome.INACTIVE)
    nobody = dict.fromkeys(ORDER, NOT_FOUND)
    assert decide(ORDER, nobody, session_id="s1", draining=("a",)) == Located("b", Outcome.DEFAULT)
    blind = {"a": NOT_FOUND}  # b and c cannot be probed
    assert decide(ORDER, blind, session_id="s1", draining=("b",)) == Located("c", Outcome.DEFAULT)
    with pytest.raises(NoBackendAvailable):
        decide(ORDER, nobody, session_id="s1", draining=ORDER)


def test_a_session_held_in_maintenance_is_retryable_never_moved() -> None:
    answers = {"a": ACTIVE, "b": INACTIVE, "c": NOT_FOUND}
    with pytest.raises(LocateInconclusive) as caught:
        decide(ORDER, answers, session_id="s1", maintenance=("a",))
    assert caught.value.to_error()["data"] == {
        "sessionId": "s1",
        "backends": ["a"],
        "maintenance": True,
        "retryable": True,
    }
    # it may be in memory on a backend that cannot be probed, where it was placed
    with pytest.raises(LocateInconclusive):
        decide(ORDER, {"a": NOT_FOUND}, session_id="s1", remembered="b", maintenance=("b",))


def test_a_backend_in_maintenance_takes_nothing() -> None:
    answers = {"a": INACTIVE, "b": INACTIVE, "c": NOT_FOUND}
    assert decide(ORDER, answers, session_id="s1", maintenance=("a",)) == Located(
        "b", Outcome.INACTIVE
    )
    nobody = dict.fromkeys(ORDER, NOT_FOUND)
    assert decide(ORDER, nobody, session_id="s1", maintenance=("a", "b")) == Located(
        "c", Outcome.DEFAULT
    )
    with pytest.raises(NoBackendAvailable):
        decide(ORDER, nobody, session_id="s1", maintenance=("a", "b"), draining=("c",))


# -- pool_status -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("answers", "expected"),
    [
        ({"a": ACTIVE}, "active"),
        ({"a": NOT_FOUND, "b": ACTIVE, "c": UNKNOWN}, "active"),
        ({"a": INACTIVE, "b": ACTIVE}, "active"),
        ({"a": INACTIVE, "b": NOT_FOUND}, "inactive"),
        ({"a": UNKNOWN, "b": INACTIVE}, "inactive"),
    ],
)
def test_pool_status(answers: dict[str, ProbeResult], expected: str) -> None:
    assert pool_status(answers, session_id="s1") == {"status": expected}


def test_pool_status_carries_the_state_an_active_backend_reported() -> None:
    running = {"state": "running"}
    answers = {"a": INACTIVE, "b": ACTIVE, "c": ACTIVE}
    assert pool_status(answers, session_id="s1", states={"c": running}) == {
        "status": "active",
        "state": running,
    }
    # not reported: no state at all (never a made-up idle); an inactive one has none
    assert pool_status(answers, session_id="s1", states={}) == {"status": "active"}
    inactive = {"a": INACTIVE, "b": NOT_FOUND}
    assert pool_status(inactive, session_id="s1", states={"a": running}) == {"status": "inactive"}


def test_pool_status_unknown_everywhere_is_not_found() -> None:
    with pytest.raises(SessionNotFound) as caught:
        pool_status({"a": NOT_FOUND, "b": NOT_FOUND}, session_id="s1")
    assert caught.value.to_error() == {
        "code": -32002,
        "message": "Resource not found",
        "data": {"sessionId": "s1"},
    }


def test_pool_status_with_a_silent_backend_is_retryable() -> None:
    with pytest.raises(LocateInconclusive) as caught:
        pool_status({"b": UNKNOWN, "a": NOT_FOUND, "c": UNKNOWN}, session_id="s1")
    data = caught.value.to_error()["data"]
    assert data == {"sessionId": "s1", "backends": ["b", "c"], "retryable": True}


# -- reading session/status answers (router.protocol.acp) ---------------------------------------------------


def _result(result: Any) -> Response:
    return Response(1, result, None, "")


def _error(code: int, data: Any = None) -> Response:
    return Response(1, None, ErrorObject(code, "x", data), "")


@pytest.mark.parametrize(
    ("response", "expected"),
    [
        (_result({"status": "active"}), ACTIVE),
        (_result({"status": "inactive"}), INACTIVE),
        (_result({"status": "sleeping"}), INACTIVE),  # unrecognised: inactive (RFD)
        (_result({"status": "Active"}), INACTIVE),
        (_result({"status": None}), UNKNOWN),
        (_result({}), UNKNOWN),
        (_result(None), UNKNOWN),
        (_error(-32002, {"sessionId": "s1"}), NOT_FOUND),
        (_error(-32002, {"uri": "s1"}), NOT_FOUND),
        (_error(-32002), NOT_FOUND),
        (_error(-32002, {"other": 1}), NOT_FOUND),
        (_error(-32002, {"sessionId": "s2"}), UNKNOWN),
        (_error(-32601), UNKNOWN),
        (_error(-32603, {"sessionId": "s1"}), UNKNOWN),
    ],
)
def test_classify_status(response: Response, expected: ProbeResult) -> None:
    assert classify_status(response, "s1") is expected


@pytest.mark.parametrize(
    ("result", "expected"),
    [
        (
            {"status": "active", "state": {"state": "running"}},
            StatusAnswer(ACTIVE, {"state": "running"}),
        ),
        ({"status": "active", "state": None}, StatusAnswer(ACTIVE)),  # not reported
        ({"status": "active", "state": {"state": 5}}, StatusAnswer(ACTIVE)),  # malformed
        ({"status": "active", "state": "idle"}, StatusAnswer(ACTIVE)),
        ({"status": "inactive", "state": {"state": "idle"}}, StatusAnswer(INACTIVE)),
    ],
)
def test_read_status_keeps_a_well_formed_v2_state_of_an_active_session(
    result: Any, expected: StatusAnswer
) -> None:
    assert read_status(_result(result), "s1") == expected
    assert read_status(_error(-32002), "s1") == StatusAnswer(NOT_FOUND)


# -- LocationCache ---------------------------------------------------------------------------------


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_cache_remembers_until_the_ttl() -> None:
    clock = FakeClock()
    cache = LocationCache(maxsize=10, ttl=30.0, clock=clock)
    cache.put("s1", "a")
    assert cache.get("s1") == "a"
    clock.now += 29.9
    assert cache.get("s1") == "a"
    clock.now += 0.1
    assert cache.get("s1") is None
    assert len(cache) == 0


def test_cache_put_refreshes_the_ttl_and_the_backend() -> None:
    clock = FakeClock()
    cache = LocationCache(maxsize=10, ttl=30.0, clock=clock)
    cache.put("s1", "a")
    clock.now += 20
    cache.put("s1", "b")
    clock.now += 20
    assert cache.get("s1") == "b"


def test_cache_is_bounded() -> None:
    cache = LocationCache(maxsize=3, ttl=30.0, clock=FakeClock())
    for n in range(10):
        cache.put(f"s{n}", "a")
        assert len(cache) <= 3
    assert len(cache) == 3
    assert [cache.get(f"s{n}") for n in range(10)] == [None] * 7 + ["a"] * 3


def test_cache_evicts_the_least_recently_used() -> None:
    cache = LocationCache(maxsize=2, ttl=30.0, clock=FakeClock())
    cache.put("s1", "a")
    cache.put("s2", "b")
    assert cache.get("s1") == "a"
    cache.put("s3", "c")
    assert cache.get("s1") == "a"
    assert cache.get("s2") is None


def test_hints_to_backends_that_cannot_be_probed_last_longer() -> None:
    clock = FakeClock()
    cache = LocationCache(maxsize=10, ttl=30.0, clock=clock, remember=3600.0)
    cache.put("probed", "a")
    cache.put("blind", "b", lasting=True)
    clock.now += 31
    assert cache.get("probed") is None
    assert cache.get("blind") == "b"
    clock.now += 3600
    assert cache.get("blind") is None


def test_a_hint_is_confirmed_only_for_a_while_after_a_fan_out() -> None:
    clock = FakeClock()
    cache = LocationCache(maxsize=10, ttl=30.0, clock=clock)
    cache.put("never", "a")
    cache.put("fanned", "a", checked=clock.now)
    never, fanned = cache.hint("never"), cache.hint("fanned")
    assert never is not None
    assert fanned is not None
    assert not never.confirmed(clock.now, verify_after=5.0)
    assert fanned.confirmed(clock.now + 4.9, verify_after=5.0)
    assert not fanned.confirmed(clock.now + 5.0, verify_after=5.0)


def test_cache_invalidate() -> None:
    cache = LocationCache(maxsize=10, ttl=30.0, clock=FakeClock())
    cache.put("s1", "a")
    cache.put("s2", "a")
    cache.invalidate("s1")
    cache.invalidate("never-there")
    assert cache.get("s1") is None
    assert cache.get("s2") == "a"


def test_cache_forget_backend() -> None:
    cache = LocationCache(maxsize=10, ttl=30.0, clock=FakeClock())
    for n in range(6):
        cache.put(f"s{n}", "ab"[n % 2])
    cache.forget_backend("a")
    assert [cache.get(f"s{n}") for n in range(6)] == [None, "b"] * 3
    cache.forget_backend("nobody")
    assert len(cache) == 3


@pytest.mark.parametrize("elapsed", [29.0, 30.0, 31.0])
def test_cache_forget_backend_around_expiry(elapsed: float) -> None:
    clock = FakeClock()
    cache = LocationCache(maxsize=10, ttl=30.0, clock=clock)
    cache.put("s1", "a")
    cache.put("s2", "b")
    clock.now += elapsed
    cache.forget_backend("a")
    assert cache.get("s1") is None
    assert cache.get("s2") == ("b" if elapsed < 30 else None)


# -- split brain ended: which copy is the home ------------------------------------------------------


def test_the_home_of_a_split_is_the_attached_copy_then_the_placed_then_the_latest_then_rank() -> (
    None
):
    b = [BackendId(x) for x in "abc"]
    assert judge(b, attached=[b[2]]) == Verdict(b[2], (b[0], b[1]), How.ATTACHED)
    assert judge(b, placed=b[1]) == Verdict(b[1], (b[0], b[2]), How.PLACED)
    # attached on two of them: the placed one among those
    assert judge(b, attached=b[1:], placed=b[2]).home == b[2]
    latest = {b[0]: 10.0, b[1]: 30.0, b[2]: 20.0}
    assert judge(b, activity=latest) == Verdict(b[1], (b[0], b[2]), How.ACTIVITY)
    # a copy with no time, or two copies equally recent: the rank decides
    assert judge(b, activity={b[0]: 10.0, b[1]: 30.0}).how is How.RANK
    assert judge(b, activity={b[0]: 30.0, b[1]: 30.0, b[2]: 1.0}) == Verdict(
        b[0], (b[1], b[2]), How.RANK
    )


def test_a_fresh_replica_keeps_the_copy_that_did_something_last() -> None:
    """Nothing attached, nothing placed (a replica that just started): the backends' own
    lastActivity decides, so every replica keeps the same copy, whatever its ranking."""
    round_ = _round(_snapshot(_up("a"), _up("b"), _up("c")))
    assert round_.start() == Ask((BackendId("a"), BackendId("b"), BackendId("c")))
    located = round_.hear(
        {BackendId("a"): ACTIVE, BackendId("b"): ACTIVE, BackendId("c"): NOT_FOUND},
        {BackendId("a"): 1_000.0, BackendId("b"): 2_000.0},
    )
    assert isinstance(located, Located)
    assert located.backend == "b"
    assert located.verdict == Verdict(BackendId("b"), (BackendId("a"),), How.ACTIVITY)


def test_a_copy_known_stale_is_not_a_home_and_its_hint_is_not_trusted() -> None:
    hint = Hint(BackendId("a"), checked=99.0)  # confirmed lately: trusted, were it not stale
    snapshot = replace(_snapshot(_up("a"), _up("b"), hint=hint), stale={BackendId("a"): None})
    round_ = _round(snapshot)
    assert round_.start() == Ask((BackendId("a"), BackendId("b")))  # no hint trusted
    located = round_.hear({BackendId("a"): ACTIVE, BackendId("b"): ACTIVE})
    assert located == Located("b", Outcome.ACTIVE)


def test_a_status_answer_says_when_the_session_last_did_anything() -> None:
    answer = Response(1, {"status": "active", "_meta": {"lastActivity": 1234}}, None, "")
    assert read_status(answer, "s").last_activity == 1234.0
    for odd in ("x", True, None, float("nan"), [1]):
        bad = Response(1, {"status": "active", "_meta": {"lastActivity": odd}}, None, "")
        assert read_status(bad, "s").last_activity is None
    inactive = Response(1, {"status": "inactive", "_meta": {"lastActivity": 5}}, None, "")
    assert read_status(inactive, "s").last_activity is None
