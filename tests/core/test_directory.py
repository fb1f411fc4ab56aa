"""router.core.directory: what a finished locate round teaches this replica (the
absences it heard, the hint it leaves, the backend the session moved from)."""

from __future__ import annotations

from router.core.directory import Bounds, Directory
from router.core.health import Health
from router.core.locate import Ask, Candidate, Located, LocateRound, Outcome, UnknownPolicy
from router.protocol.acp import ProbeResult, StatusAnswer
from router.protocol.ids import BackendId, SessionId

A, B, C = BackendId("a"), BackendId("b"), BackendId("c")
S = SessionId("s")


def _directory() -> Directory:
    return Directory(Bounds(), clock=lambda: 10.0, salt="test")


def _round(directory: Directory, *gone: BackendId) -> LocateRound:
    candidates = tuple(Candidate(b, Health.GONE if b in gone else Health.UP) for b in (A, B, C))
    snapshot = directory.snapshot(S, candidates, policy=UnknownPolicy.FAIL_CLOSED)
    return LocateRound(snapshot, now=10.0, verify_after=60.0)


def _found_on_b(round_: LocateRound) -> Located:
    step = round_.start()
    while isinstance(step, Ask):
        answers = {
            b: StatusAnswer(ProbeResult.ACTIVE if b == B else ProbeResult.NOT_FOUND)
            for b in step.backends
        }
        step = round_.heard(answers)
    return step


def test_a_found_session_leaves_a_hint_and_its_absences() -> None:
    directory = _directory()
    round_ = _round(directory)
    located = _found_on_b(round_)
    directory.located(round_, located)
    hint = directory.hint(S)
    assert hint is not None
    assert hint.backend == B
    assert _round(directory).snapshot.absent == {A, C}  # not asked again for a while


def test_a_backend_that_left_the_pool_meanwhile_gets_no_hint() -> None:
    directory = _directory()
    round_ = _round(directory)
    directory.located(round_, _found_on_b(round_), member=False)
    assert directory.hint(S) is None


def test_a_failed_round_still_teaches_what_it_heard() -> None:
    directory = _directory()
    round_ = _round(directory)
    step = round_.start()
    assert isinstance(step, Ask)
    round_.heard({b: StatusAnswer(ProbeResult.NOT_FOUND) for b in step.backends if b != B})
    directory.located(round_, None)
    assert directory.hint(S) is None
    assert _round(directory).snapshot.absent == {A, C}


def test_a_session_found_away_from_a_given_up_home_is_asked_about_at_its_fence() -> None:
    directory = _directory()
    directory.remember(S, A, None, lasting=False)
    round_ = _round(directory, A)
    directory.located(round_, _found_on_b(round_))
    assert S in directory.to_fence(A)


def test_an_audit_that_saw_a_split_makes_the_session_a_suspect_its_resumes_ask_everyone() -> None:
    directory = _directory()
    directory.audited(S, Located(B, Outcome.ACTIVE))
    assert not _round(directory).snapshot.ask_all  # a clean audit: nothing changes
    directory.audited(S, Located(B, Outcome.ACTIVE, split_brain=(A,)))
    assert _round(directory).snapshot.ask_all


def test_a_resume_answered_not_there_forgets_the_hint_and_counts_that_backend_tried() -> None:
    directory = _directory()
    directory.remember(S, A, None, lasting=False)
    directory.not_there(S, A)
    assert directory.hint(S) is None
    assert _round(directory).snapshot.tried == (A,)
