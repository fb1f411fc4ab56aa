"""Epochs, the fencing token every replica reads from the agents (issue 32): the home of a
split, the epoch a resume carries, the fencing rule, the check of attached sessions,
and reading an epoch off a ``session/status`` answer."""

from __future__ import annotations

from typing import Any

import pytest

from router.core.fencing import FenceRound, Fencing
from router.core.health import Health
from router.core.hints import Hint
from router.core.locate import Ask, Candidate, Located, LocateRound, Outcome, Snapshot
from router.core.split_brain import (
    Checked,
    How,
    SplitBrainPolicy,
    Verdict,
    check_attached,
    fence,
    judge,
    next_epoch,
    resume_epoch,
    still_stale,
)
from router.protocol.acp import (
    EPOCH_META_KEY,
    MAX_EPOCH,
    ProbeResult,
    StatusAnswer,
    epoch_of,
    read_status,
)
from router.protocol.errors import LocateInconclusive
from router.protocol.ids import BackendId, SessionId
from router.protocol.jsonrpc import Response

A, B, C = BackendId("a"), BackendId("b"), BackendId("c")
ORDER = (A, B, C)


def _active(epoch: int | None = None, activity: float | None = None) -> StatusAnswer:
    return StatusAnswer(ProbeResult.ACTIVE, last_activity=activity, epoch=epoch)


def _inactive(epoch: int | None = None) -> StatusAnswer:
    return StatusAnswer(ProbeResult.INACTIVE, epoch=epoch)


# -- the home of a split --------------------------------------------------------------------------


def test_the_highest_epoch_is_the_home_whatever_this_replica_is_attached_to() -> None:
    """The bug: each replica kept the copy its own client was attached to, and closed the
    other's. With epochs, an attachment here does not outweigh a newer copy."""
    verdict = judge([A, B, C], attached=[A], placed=A, epochs={A: 5, B: 9, C: 7})
    assert verdict == Verdict(B, (A, C), How.EPOCH)
    # the other replica, attached to the other copy, keeps the same one
    assert judge([A, B, C], attached=[C], placed=C, epochs={A: 5, B: 9, C: 7}).home == B


def test_equal_epochs_go_to_the_best_ranked_copy() -> None:
    assert judge([A, B], epochs={A: 3, B: 3}) == Verdict(A, (B,), How.EPOCH)


def test_a_copy_that_reports_no_epoch_leaves_the_rules_without_epochs() -> None:
    """A third-party agent keeps no epoch: the earlier rules decide, the attached copy
    first (replicas may then disagree, which docs/routing.md says)."""
    assert judge([A, B], attached=[B], epochs={A: 9}) == Verdict(B, (A,), How.ATTACHED)


def test_a_resume_carries_an_epoch_above_every_copy_and_at_least_the_wall_clock() -> None:
    assert next_epoch(None, 1_000) == 1_000
    assert next_epoch(5, 1_000) == 1_000
    assert next_epoch(2_000, 1_000) == 2_001  # a clock behind the copies still goes above
    assert next_epoch(MAX_EPOCH, 1_000) == MAX_EPOCH  # bounded: never past what JSON holds


def test_a_resume_found_on_the_hint_alone_does_not_outrank_copies_it_did_not_hear() -> None:
    """The soak's split (two replicas): a replica whose hint named a copy left active
    behind a partition trusted that copy's ``active`` alone and resumed it with the wall
    clock's epoch, above the home another replica had failed over to, so that copy
    became the home for every replica. Found alone, a resume keeps its copy's epoch."""
    snapshot = Snapshot(
        SessionId("s"),
        (Candidate(A, Health.UP), Candidate(B, Health.UP)),
        Hint(A, checked=99.0),
    )
    round_ = LocateRound(snapshot, now=100.0, verify_after=5.0)
    assert round_.start() == Ask((A,))  # the hinted backend alone
    located = round_.heard({A: _active(4)})
    assert isinstance(located, Located)
    assert (located.backend, located.alone, located.highest_epoch) == (A, True, 4)
    assert resume_epoch(located.highest_epoch, 1_000, alone=located.alone) == 4
    # the home another replica resumed meanwhile (epoch 900) stays the home for everyone
    assert judge([A, B], attached=[A], placed=A, epochs={A: 4, B: 900}).home == B
    # heard from the whole pool, a resume goes above everything, at least the wall clock
    assert resume_epoch(4, 1_000, alone=False) == 1_000
    # a copy that reports no epoch: the wall clock, as ever
    assert resume_epoch(None, 1_000, alone=True) == 1_000


def test_a_stale_mark_holds_only_for_the_epoch_it_judged() -> None:
    """The soak's other split: a replica that once judged the copy on A stale kept it
    out of every resume for the mark's lifetime, also after another replica resumed the
    session there (a higher epoch: the home now), and moved the session elsewhere."""
    marks = {A: 4, C: None}
    assert still_stale(marks, {A: 4, B: 2, C: 9}) == {A, C}
    assert still_stale(marks, {A: 900, B: 2}) == {C}  # resumed on A since: the home
    snapshot = Snapshot(SessionId("s"), (Candidate(A, Health.UP), Candidate(B, Health.UP)))
    marked = Snapshot(snapshot.session_id, snapshot.candidates, stale={A: 4})
    assert _locate(marked, {A: _active(900), B: _inactive(2)}).backend == A
    assert _locate(marked, {A: _active(4), B: _inactive(2)}).backend == B


# -- reading an epoch -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "read"),
    [(7, 7), (0, 0), (True, None), (-1, None), (1.5, None), ("7", None), (MAX_EPOCH + 1, None)],
)
def test_an_epoch_is_a_whole_number_in_range(value: Any, read: int | None) -> None:
    assert epoch_of({EPOCH_META_KEY: value}) == read


def test_a_status_answer_reports_its_copys_epoch_active_or_inactive() -> None:
    for status in ("active", "inactive"):
        answer = Response(1, {"status": status, "_meta": {EPOCH_META_KEY: 12}}, None, "")
        assert read_status(answer, "s").epoch == 12
    assert read_status(Response(1, {"status": "active"}, None, ""), "s").epoch is None
    assert read_status(Response(1, {"status": "active", "_meta": []}, None, ""), "s").epoch is None


# -- a locate -------------------------------------------------------------------------------------


def _snapshot(*candidates: Candidate, unreachable: tuple[BackendId, ...] = ()) -> Snapshot:
    more = tuple(Candidate(b, Health.UNKNOWN) for b in unreachable)
    return Snapshot(SessionId("s"), (*candidates, *more))


def _locate(snapshot: Snapshot, answers: dict[BackendId, StatusAnswer]) -> Located:
    round_ = LocateRound(snapshot, now=100.0, verify_after=5.0)
    round_.start()
    located = round_.heard(answers)
    assert isinstance(located, Located)
    return located


def test_a_locate_keeps_the_newest_of_two_active_copies_and_says_how_high_they_go() -> None:
    snapshot = _snapshot(Candidate(A, Health.UP, attached=True), Candidate(B, Health.UP))
    located = _locate(snapshot, {A: _active(4), B: _active(8)})
    assert located.backend == B
    assert located.verdict == Verdict(B, (A,), How.EPOCH)
    assert located.highest_epoch == 8


def test_an_active_copy_older_than_a_stored_one_is_stale_and_the_stored_one_resumed() -> None:
    """A copy left in memory behind a partition, while the session was resumed elsewhere
    and has since gone idle there: the newest history is in that store."""
    snapshot = _snapshot(Candidate(A, Health.UP), Candidate(B, Health.UP), Candidate(C, Health.UP))
    located = _locate(snapshot, {A: _active(4), B: _inactive(9), C: _inactive(0)})
    assert (located.backend, located.outcome) == (B, Outcome.INACTIVE)
    assert located.verdict == Verdict(B, (A,), How.EPOCH)
    assert located.highest_epoch == 9


def test_of_stored_copies_the_newest_is_resumed() -> None:
    snapshot = _snapshot(Candidate(A, Health.UP), Candidate(B, Health.UP), Candidate(C, Health.UP))
    located = _locate(snapshot, {A: _inactive(2), B: _inactive(0), C: _inactive(5)})
    assert (located.backend, located.outcome, located.verdict) == (C, Outcome.INACTIVE, None)
    # without epochs, the rank, as before
    located = _locate(snapshot, {A: _inactive(), B: _inactive(), C: _inactive()})
    assert located.backend == A


def test_a_superseded_copy_does_not_lift_the_fail_closed_rule() -> None:
    snapshot = _snapshot(Candidate(A, Health.UP), Candidate(B, Health.UP), unreachable=(C,))
    round_ = LocateRound(snapshot, now=100.0, verify_after=5.0)
    round_.start()
    with pytest.raises(LocateInconclusive):
        round_.heard({A: _active(4), B: _inactive(9)})


# -- fencing a backend back after it was given up ----------------------------------------------------


def test_a_returning_copy_older_than_an_active_one_is_stale() -> None:
    answers = {A: _active(3), B: _active(7)}
    assert fence(A, answers, order=ORDER) == (A,)


def test_a_returning_copy_that_another_replica_resumed_is_the_home() -> None:
    """This replica gave ``a`` up and moved the session to ``b``; meanwhile another
    replica, which never gave ``a`` up, resumed it on ``a`` later: ``b``'s copy is the
    stale one, whatever this replica's hint and attachment say."""
    answers = {A: _active(9), B: _active(7)}
    assert fence(A, answers, order=ORDER, attached=[B], hinted=B) == (B,)
    # alone in memory, with an epoch: nothing to fence, wherever the hint points
    assert fence(A, {A: _active(9), B: _inactive(7)}, order=ORDER, hinted=B) == ()


def test_without_epochs_a_returning_copy_is_stale_where_the_session_lives_elsewhere() -> None:
    assert fence(A, {A: _active()}, order=ORDER, hinted=B) == (A,)
    assert fence(A, {A: _active()}, order=ORDER, attached=[B]) == (A,)
    assert fence(A, {A: _active(), B: _active()}, order=ORDER) == (A,)
    assert fence(A, {A: _active()}, order=ORDER, hinted=A) == ()
    assert fence(A, {A: _inactive()}, order=ORDER, hinted=B) == ()  # nothing in memory


def test_a_fence_asks_the_rest_of_the_pool_only_where_the_returning_copy_is_active() -> None:
    round_ = FenceRound(A, [A, B, C], order=ORDER, hinted=B)
    assert round_.start() == Ask((A,))
    assert round_.hear({A: _inactive()}) == Fencing((), {})  # nothing in memory: no probes
    round_ = FenceRound(A, [A, B, C], order=ORDER)
    round_.start()
    assert round_.hear({A: _active(3)}) == Ask((B, C))
    assert round_.hear({B: _active(7), C: _inactive()}) == Fencing((A,), {A: 3})


def test_a_fence_with_nobody_else_up_rules_on_what_this_replica_knows() -> None:
    round_ = FenceRound(A, [A], order=ORDER, attached=[B])
    round_.start()
    assert round_.hear({A: _active()}) == Fencing((A,), {A: None})


# -- the check of attached sessions ------------------------------------------------------------------


def test_an_attached_copy_another_replica_moved_away_from_is_stale() -> None:
    checked = check_attached({A: _active(3), B: _active(8)}, order=ORDER, attached=[A])
    assert checked == Checked(stale=(A,), how=How.EPOCH)


def test_an_attached_copy_its_agent_no_longer_has_is_denied() -> None:
    checked = check_attached({A: _inactive(3), B: _active(8)}, order=ORDER, attached=[A])
    assert checked == Checked(denied=(A,))
    gone = check_attached({A: StatusAnswer(ProbeResult.NOT_FOUND)}, order=ORDER, attached=[A])
    assert gone == Checked(denied=(A,))


def test_a_mixed_backend_or_one_that_does_not_answer_denies_nothing() -> None:
    inactive = {A: _inactive(3)}
    assert check_attached(inactive, order=ORDER, attached=[A], mixed=[A]) == Checked()
    unknown = {A: StatusAnswer(ProbeResult.UNKNOWN), B: _active(8)}
    # no answer from the attached copy: its live link says active there, with no epoch:
    # the rules without epochs keep the attached one
    assert check_attached(unknown, order=ORDER, attached=[A]) == Checked(
        stale=(B,), how=How.ATTACHED
    )


def test_a_clean_check_finds_nothing() -> None:
    answers = {A: _active(3), B: _inactive(2), C: StatusAnswer(ProbeResult.NOT_FOUND)}
    assert check_attached(answers, order=ORDER, attached=[A]) == Checked()


def test_report_only_acts_on_no_stale_copy_and_close_stale_on_them() -> None:
    assert SplitBrainPolicy.CLOSE_STALE.acts
    assert not SplitBrainPolicy.REPORT.acts
