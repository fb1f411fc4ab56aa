"""Split brain found is split brain ended, sans-I/O: when one session is ``active`` on
more than one backend, which copy is its home and which are stale.

The home, by the first rule that tells the copies apart:

1. **attached**: the copy a client of this router is attached to (a live link proves it
   is where that client's turns run);
2. **placed**: where this router last placed or found the session (its hint);
3. **activity**: the copy that did something last, by the backends' own
   ``_meta.lastActivity`` in their ``session/status`` answers (every replica, a fresh one
   included, reads the same times, so every replica keeps the same copy);
4. **rank**: the best-ranked backend (the rendezvous order, the same on every replica).

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

from router.protocol.ids import BackendId


class SplitBrainPolicy(enum.Enum):
    """What the router does with the stale copies of a session (``router.split_brain``)."""

    CLOSE_STALE = "close_stale"
    REPORT = "report"


class How(enum.Enum):
    """Which rule chose the home (the ``how`` label of the resolved-split metric)."""

    ATTACHED = "attached"
    PLACED = "placed"
    ACTIVITY = "activity"
    RANK = "rank"
    #: a backend back after it was given up: its copy is stale where one lives elsewhere
    FENCED = "fenced"


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
) -> Verdict:
    """The home among the backends that said ``active`` (``active``, best-ranked first,
    at least two), by the rules above."""
    assert len(active) > 1
    home, how = _home(active, attached, placed, activity or {})
    return Verdict(home, tuple(b for b in active if b != home), how)


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


def stale_on_return(*, active_here: bool, lives_elsewhere: bool) -> bool:
    """The fencing rule: a backend back after it was given up holds a stale copy of a
    session when it still has it active and the session lives elsewhere now (resumed on
    another backend since, through this router or seen active there)."""
    return active_here and lives_elsewhere
