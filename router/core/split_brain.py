"""Split brain found is split brain ended, sans-I/O: when one session is ``active`` on
more than one backend, which copy is its home and which are stale.

The home, by the first rule that tells the copies apart:

0. **epoch**: where every active copy reports its epoch (``_meta`` of its
   ``session/status`` answer, :data:`router.protocol.acp.EPOCH_META_KEY`), the copy with
   the highest; of equal epochs, the best-ranked. The epoch is a fencing token the
   router writes into every resume it locates (:func:`next_epoch`: above any epoch a
   copy reported, and at least the wall clock's milliseconds, so a later resume wins),
   and it lives on the agents: every replica reads the same epochs and keeps the same
   copy, whatever it saw of the fault. For agents that keep no epoch, the rules below;
1. **attached**: the copy a client of this router is attached to (a live link proves it
   is where that client's turns run);
2. **placed**: where this router last placed or found the session (its hint);
3. **activity**: the copy that did something last, by the backends' own
   ``_meta.lastActivity`` in their ``session/status`` answers;
4. **rank**: the best-ranked backend (the rendezvous order, the same on every replica).

Rules 1 and 2 are this replica's own knowledge: two replicas that each have a client on
another copy keep a copy each, which is why the epoch comes first where agents keep one.

The others are stale: with ``router.split_brain = "close_stale"`` (the default) the
router closes them (``session/close`` on the backend's control link), and until that is
done no resume is sent to them; with ``"report"`` it only counts and logs them.
A backend given up after its grace and back as the same process is *fenced* by the same
rule before it takes traffic (:mod:`router.core.health`): its copies of sessions that
live elsewhere now are stale.
"""

from __future__ import annotations

import enum
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from router.protocol.acp import MAX_EPOCH, ProbeResult, StatusAnswer
from router.protocol.ids import BackendId


class SplitBrainPolicy(enum.Enum):
    """What the router does with the stale copies of a session (``router.split_brain``)."""

    CLOSE_STALE = "close_stale"
    REPORT = "report"

    @property
    def acts(self) -> bool:
        """Whether the router acts on stale copies (keeps resumes off them, closes them,
        detaches its clients from them), or only reports them."""
        return self is SplitBrainPolicy.CLOSE_STALE


class How(enum.Enum):
    """Which rule chose the home (the ``how`` label of the resolved-split metric)."""

    EPOCH = "epoch"
    ATTACHED = "attached"
    PLACED = "placed"
    ACTIVITY = "activity"
    RANK = "rank"
    #: a backend back after it was given up: its copy is stale where one lives elsewhere
    FENCED = "fenced"
    #: a session a backend made by its late answer to a ``session/new`` the router had
    #: placed elsewhere when that backend left it unanswered: nobody's
    UNANSWERED = "unanswered"


@dataclass(frozen=True, slots=True)
class Verdict:
    home: BackendId
    stale: tuple[BackendId, ...]
    how: How


def judge(
    active: Sequence[BackendId],
    *,
    attached: Collection[BackendId] = (),
    placed: BackendId | None = None,
    activity: Mapping[BackendId, float] | None = None,
    epochs: Mapping[BackendId, int] | None = None,
) -> Verdict:
    """The home among the backends that said ``active`` (``active``, best-ranked first,
    at least two), by the rules above."""
    assert len(active) > 1
    epochs = epochs or {}
    if all(b in epochs for b in active):
        highest = max(epochs[b] for b in active)
        home = next(b for b in active if epochs[b] == highest)
        return Verdict(home, tuple(b for b in active if b != home), How.EPOCH)
    home, how = _home(active, attached, placed, activity or {})
    return Verdict(home, tuple(b for b in active if b != home), how)


#: the copies of one session known to be stale: backend -> the epoch its copy reported
#: when it was found stale (None: it reports none)
StaleMarks = Mapping[BackendId, int | None]


def mark(stale: Collection[BackendId], answers: Mapping[BackendId, StatusAnswer]) -> StaleMarks:
    """The marks of ``stale`` copies, each with the epoch it reported in ``answers``."""
    return {b: answers[b].epoch if b in answers else None for b in stale}


def still_stale(marks: StaleMarks, epochs: Mapping[BackendId, int]) -> frozenset[BackendId]:
    """The marked copies that are stale still, given the ``epochs`` they report now: a
    copy resumed since it was marked (an epoch above its mark: another replica made it
    the home) is stale no more, for a mark is evidence only about the copy it judged. A
    copy that reported no epoch stays marked whatever it says."""
    return frozenset(
        b for b, marked in marks.items() if marked is None or b not in epochs or epochs[b] <= marked
    )


def resume_epoch(highest: int | None, wall_ms: int, *, alone: bool) -> int:
    """The epoch a located resume carries: :func:`next_epoch`, unless the session was
    found on the hinted backend's word ``alone`` with the epoch ``highest`` there. That
    resume goes on with the copy it found at that copy's own epoch: it heard no other
    copy, so it may not outrank one (a copy another replica resumed elsewhere since
    stays the home, and the audit, or any replica's next fan-out, closes this one)."""
    if alone and highest is not None:
        return highest
    return next_epoch(highest, wall_ms)


def next_epoch(highest: int | None, wall_ms: int) -> int:
    """The epoch a resume carries: above ``highest`` (the highest any copy of the session
    reported, if any did), and at least ``wall_ms`` (the shell's wall clock, in
    milliseconds since the Unix epoch), so of two resumes that saw different copies, the
    later one wins on every replica (replicas' clocks agree to far less than the time
    between two resumes of one session through a fault). Bounded by
    :data:`~router.protocol.acp.MAX_EPOCH`."""
    floor = -1 if highest is None else highest
    return min(max(floor + 1, wall_ms), MAX_EPOCH)


def _home(
    active: Sequence[BackendId],
    attached: Collection[BackendId],
    placed: BackendId | None,
    activity: Mapping[BackendId, float],
) -> tuple[BackendId, How]:
    held = [b for b in active if b in attached]
    if len(held) == 1:
        return held[0], How.ATTACHED
    candidates = held or list(active)
    if placed in candidates:
        return placed, How.PLACED
    times = {b: activity[b] for b in candidates if b in activity}
    if times:
        latest = max(times.values())
        recent = [b for b in candidates if times.get(b) == latest]
        if len(recent) == 1 and len(times) == len(candidates):
            return recent[0], How.ACTIVITY
    return candidates[0], How.RANK


def fence(
    returning: BackendId,
    answers: Mapping[BackendId, StatusAnswer],
    *,
    order: Sequence[BackendId],
    attached: Collection[BackendId] = (),
    hinted: BackendId | None = None,
) -> tuple[BackendId, ...]:
    """The fencing rule: which copies of a session are stale when ``returning``, given up
    and back as the same process, is asked about it (``answers``: what it and the other
    backends said; ``order``: the session's rendezvous order; ``attached``: the backends
    it is attached to through this router, on live links; ``hinted``: where this router
    last placed or found it).

    Nothing, unless the returning copy is active. Where every active copy reports an
    epoch, the copies below the highest (:func:`judge`): a returning copy that another
    replica resumed since it was given up here is the home, and this replica's own
    copies are the stale ones. Otherwise the returning copy is stale when the session
    lives elsewhere now: active on another backend, or attached or placed elsewhere
    through this router."""
    here = answers.get(returning)
    if here is None or here.result is not ProbeResult.ACTIVE:
        return ()
    active = [
        b
        for b in order
        if b == returning
        or (b in answers and answers[b].result is ProbeResult.ACTIVE)
        or (b in attached and b not in answers)  # a live link here: active there
    ]
    epochs = {b: a.epoch for b, a in answers.items() if a.epoch is not None}
    if all(b in epochs for b in active):
        if len(active) == 1:
            return ()
        return judge(active, epochs=epochs).stale
    elsewhere = (
        len(active) > 1 or any(b != returning for b in attached) or hinted not in (None, returning)
    )
    return (returning,) if elsewhere else ()


@dataclass(frozen=True, slots=True)
class Checked:
    """What a check of a session attached through this router found
    (:func:`check_attached`)."""

    #: copies that are not the home (a split brain judged): closed, and detached here
    stale: tuple[BackendId, ...] = ()
    #: the rule that chose the home among them
    how: How | None = None
    #: backends it is attached to here whose agent no longer has it in memory (closed or
    #: taken there, by another replica or client): detached here, nothing to close
    denied: tuple[BackendId, ...] = ()


def check_attached(
    answers: Mapping[BackendId, StatusAnswer],
    *,
    order: Sequence[BackendId],
    attached: Collection[BackendId],
    mixed: Collection[BackendId] = (),
    placed: BackendId | None = None,
) -> Checked:
    """The check of a session attached through this router on ``attached``, from what
    the pool said of it (``answers``; ``order``: its rendezvous order): a replica
    attached to a copy the fleet has moved away from finds out here, not at its next
    resume (docs/routing.md, "Split brain found is split brain ended").

    A backend it is attached to that answers ``inactive`` or ``-32002`` no longer has it
    (unless it is *mixed*: its control link speaks for another process than the link
    the session is attached on); one that gives no answer counts as active there (its
    live link proves it). Two active copies or more: the home by :func:`judge`."""
    denied = tuple(
        b
        for b in order
        if b in attached
        and b not in mixed
        and b in answers
        and answers[b].result in (ProbeResult.INACTIVE, ProbeResult.NOT_FOUND)
    )
    active = [
        b
        for b in order
        if b not in denied
        and (
            (b in answers and answers[b].result is ProbeResult.ACTIVE)
            or (b in attached and (b in mixed or b not in answers or _unknown(answers[b])))
        )
    ]
    if len(active) < 2:
        return Checked(denied=denied)
    verdict = judge(
        active,
        attached=[b for b in active if b in attached],
        placed=placed,
        activity={b: a.last_activity for b, a in answers.items() if a.last_activity is not None},
        epochs={b: a.epoch for b, a in answers.items() if a.epoch is not None and b in active},
    )
    return Checked(verdict.stale, verdict.how, denied)


def _unknown(answer: StatusAnswer) -> bool:
    return answer.result is ProbeResult.UNKNOWN
