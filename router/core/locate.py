"""Where a session lives, sans-I/O: one decision, fed by one snapshot of the pool.

A :class:`Snapshot` holds, for every backend in the session's rendezvous order, what
the router knows without asking anyone (:class:`Candidate`: health, what an operator
set, whether it can be probed, whether the session is attached to it through this
router on a link that is alive), and the session's location :class:`~router.core.hints.Hint`.
A :class:`LocateRound` says whom to probe, first the hinted backend and then the rest,
and decides once it has heard enough; the shell only sends the probes and waits.

The evidence about one backend (:func:`evidence`):

* where the backend answered ``session/status``, its answer wins (but a backend whose
  URL was seen to reach more than one process, *mixed*, speaks for its control link's
  process only: there, a session attached to it through this router on a live link is
  ``active`` whatever the control link says);
* where it could not (no ``session/status``, its control link down, the probe timed
  out), a session attached to it through this router on a live link is ``active``
  there: that link proves the process alive, and the session in its memory;
* otherwise a backend that is down but not gone (:mod:`router.core.health`), or that
  did not answer its probe, is *unknown*; one that is up but cannot be asked is blind.

The rules (docs/routing.md, "Locate"), over that evidence, in rendezvous order:

1. Exactly one ``active`` → that backend. Several (split brain) → the home
   :mod:`router.core.split_brain` chooses, and the caller is told which copies are
   stale. A copy the directory already knows is stale counts as not there.
2. No ``active`` and some backend unknown → fail closed with a retryable error, unless
   the policy is ``place_anyway``: that backend may hold the session in memory, and
   resuming elsewhere could run it twice.
3. No ``active``, some ``inactive`` → the best-ranked backend that knows it.
4. Nothing known by any backend that can be asked → the backends that cannot be asked:
   the one this router remembers placing or finding the session on, else the one the
   client's hinted id names, else the best-ranked of them; each answers ``-32002`` at
   most once per resume (``tried``), then the next is tried.
5. No backend left to try → the best-ranked backend (the rendezvous default) on the
   first try, ``-32002`` after that.

Backends that do not advertise ``session/status`` are never probed; gone ones are not
in the pool.

A client's hinted id names a home (:mod:`router.core.hinted_ids`): anyone can make one,
so it is a *claim*, worth what a backend confirms. Where this router has no hint of its
own, the claim is asked first, as an unconfirmed hint is; but it is no evidence (not
where the router placed the session, for split brain), and a locate leaves a hint only
where a probe found the session (:func:`hint_after`): a forged claim plants nothing.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from router.core.health import Health
from router.core.hints import Hint
from router.core.split_brain import How, StaleMarks, Verdict, judge, still_stale
from router.protocol.acp import ProbeResult, StatusAnswer
from router.protocol.errors import LocateInconclusive, NoBackendAvailable, SessionNotFound
from router.protocol.ids import BackendId, SessionId


class UnknownPolicy(enum.Enum):
    """What to do when no backend says ``active`` and some backend gave no answer."""

    FAIL_CLOSED = "fail_closed"
    PLACE_ANYWAY = "place_anyway"


class AdminState(enum.Enum):
    """What an operator set a backend to (``POST /admin/backends/{id}/<state>``), with
    HAProxy's meaning: a *draining* backend still takes the sessions located there
    (active there, or known only there), and nothing else; one in *maintenance* takes
    nothing, and a session it holds in memory (or may hold: it is where this router
    remembers placing it) gets the retryable ``-32012`` rather than a second life
    elsewhere."""

    READY = "ready"
    DRAIN = "drain"
    MAINT = "maint"


class Outcome(enum.Enum):
    """How a backend was chosen; also the ``outcome`` label of the locate metrics."""

    ACTIVE = "active"
    INACTIVE = "inactive"
    DEFAULT = "default"
    #: a backend that cannot be probed, where this router placed or found the session
    REMEMBERED = "remembered"


class Stage(enum.Enum):
    """How the hint served a locate (the ``result`` label of the hint-lookup metric)."""

    HIT = "hit"  # the hinted backend said active, and a fan-out confirmed it lately
    #: it said active, not confirmed lately: trusted, and a background audit asks the rest
    AUDIT = "audit"
    #: it said active, but this router sees the session elsewhere too: the pool is asked
    VERIFY = "verify"
    STALE = "stale"  # it did not say active
    MISS = "miss"  # no hint that can be probed


@dataclass(frozen=True, slots=True)
class Candidate:
    """One backend in the pool, as a locate of one session sees it before asking."""

    id: BackendId
    health: Health
    #: it advertises ``session/status``: it can be asked while it is up
    has_status: bool = True
    admin: AdminState = AdminState.READY
    #: found by DNS once, gone from it since: takes no new sessions, like a drained one
    leaving: bool = False
    #: the session is attached to it through this router, on a link that is alive
    attached: bool = False
    #: its client links reached another process than its control link
    #: (:mod:`router.core.health`): its answers speak for one of its processes only
    mixed: bool = False

    @property
    def probeable(self) -> bool:
        return self.has_status and self.health is Health.UP

    @property
    def draining(self) -> bool:
        return self.admin is AdminState.DRAIN or self.leaving


@dataclass(frozen=True, slots=True)
class Snapshot:
    """What a locate of ``session_id`` starts from."""

    session_id: SessionId
    #: every backend of the pool, in the session's rendezvous order (best first)
    candidates: tuple[Candidate, ...]
    hint: Hint | None = None
    policy: UnknownPolicy = UnknownPolicy.FAIL_CLOSED
    #: backends that already answered ``-32002`` to this resume (or to one lately)
    tried: tuple[BackendId, ...] = ()
    #: backends that answered a probe ``-32002`` lately (:class:`~router.core.hints.Absences`):
    #: not asked again, they count as not knowing the session
    absent: frozenset[BackendId] = frozenset()
    #: backends whose copy of the session is known to be stale (:mod:`router.core.split_brain`),
    #: each with the epoch it had then: their ``active`` is not believed, and no resume
    #: goes there, unless the copy reports a higher epoch now (resumed there since)
    stale: StaleMarks = field(default_factory=dict)
    #: ask the whole pool, whatever the hint says (an audit; a session seen split lately)
    ask_all: bool = False
    #: the home the client's hinted id named, for this locate only (a claim, above)
    claimed: BackendId | None = None

    @property
    def first_guess(self) -> Hint | None:
        return first_guess(self.hint, self.claimed)


def first_guess(hint: Hint | None, claimed: BackendId | None) -> Hint | None:
    """What a locate asks first: this router's own hint, else the client's claim (never
    confirmed: an ``active`` from it is trusted with an audit to follow)."""
    return hint if hint is not None or claimed is None else Hint(claimed)


@dataclass(frozen=True, slots=True)
class Located:
    """Where a session goes, and why."""

    backend: BackendId
    outcome: Outcome
    #: every backend that said ``active``, best-ranked first, when more than one did
    split_brain: tuple[BackendId, ...] = ()
    #: then: which copy is the home, which are stale, and by which rule
    verdict: Verdict | None = None
    #: trusted on the hinted backend's word alone: the rest of the pool is to be asked
    #: off the request path (an audit), so a second ``active`` copy is still seen
    audit: bool = False
    #: the probes the locate sent and what each backend answered, in order (the shell
    #: fills it in, for the span of the request that waited on it)
    probes: tuple[tuple[BackendId, ProbeResult], ...] = ()
    #: the highest epoch a copy of the session reported in the round (None: none did);
    #: the resume carries one above it (:func:`router.core.split_brain.next_epoch`), or,
    #: heard from the hinted backend ``alone``, that copy's own
    highest_epoch: int | None = None
    #: found on the hinted backend's word alone (a hit, or an audit to follow): the rest
    #: of the pool was not heard, so the resume may not outrank copies there
    alone: bool = False


@dataclass(frozen=True, slots=True)
class Ask:
    """Probe these backends, then hand their answers to the round."""

    backends: tuple[BackendId, ...]


def evidence(candidate: Candidate, answer: ProbeResult | None) -> ProbeResult | None:
    """What the router may believe about the session on ``candidate``; None: nothing
    (up, but it cannot be asked)."""
    if answer in (ProbeResult.ACTIVE, ProbeResult.INACTIVE, ProbeResult.NOT_FOUND):
        # a mixed backend's answer is its control link's process's, not the link's here
        return ProbeResult.ACTIVE if candidate.mixed and candidate.attached else answer
    if candidate.attached and candidate.health is not Health.GONE:
        return ProbeResult.ACTIVE
    if answer is ProbeResult.UNKNOWN or candidate.health is Health.UNKNOWN:
        return ProbeResult.UNKNOWN
    return None


class LocateRound:
    """One locate: :meth:`start`, then :meth:`hear` the answers of each :class:`Ask`,
    until a :class:`Located` (or an error) comes out.

    The hinted backend is asked alone first, and its ``active`` is trusted: within
    ``verify_after`` seconds of a fan-out that confirmed it as it is (a hit), and past
    that with an audit to follow (:attr:`Located.audit`: the rest of the pool is asked
    off the request path, so a second ``active`` instance, split brain, is still seen,
    without every resume after a restart paying for a fan-out). When the hinted backend
    does not say ``active``, or this router sees the session on another backend too (an
    attachment here), the rest of the pool is asked now and :func:`decide` rules over
    everything heard.
    """

    def __init__(self, snapshot: Snapshot, *, now: float, verify_after: float) -> None:
        self.snapshot = snapshot
        self._now = now
        self._verify_after = verify_after
        self._by_id = {c.id: c for c in snapshot.candidates}
        self.answers: dict[BackendId, ProbeResult] = dict.fromkeys(
            (c.id for c in snapshot.candidates if c.id in snapshot.absent), ProbeResult.NOT_FOUND
        )
        #: backends asked in this round so far
        self.probes = 0
        #: whether it asked more than the hinted backend (a fan-out)
        self.fanned_out = False
        self._hinted: Hint | None = None
        self.stage = Stage.MISS
        #: when a fan-out last confirmed the result (for the hint to remember); None:
        #: nothing confirmed it
        self.checked: float | None = None
        #: when each backend that said ``active`` last saw the session do anything
        self.activity: dict[BackendId, float] = {}
        #: the epoch each backend's copy reported
        self.epochs: dict[BackendId, int] = {}

    def start(self) -> Ask | Located:
        hint = self.snapshot.first_guess
        hinted = self._by_id.get(hint.backend) if hint is not None else None
        if (
            hint is not None
            and hinted is not None
            and hinted.probeable
            and hinted.admin is not AdminState.MAINT
            and hint.backend not in self.answers
            and hint.backend not in self.snapshot.stale
            and not self.snapshot.ask_all
        ):
            self._hinted = hint
            return self._ask((hint.backend,))
        return self._ask_the_rest()

    def _ask(self, backends: tuple[BackendId, ...]) -> Ask:
        self.probes += len(backends)
        return Ask(backends)

    def hear(
        self,
        answers: Mapping[BackendId, ProbeResult],
        activity: Mapping[BackendId, float] | None = None,
        epochs: Mapping[BackendId, int] | None = None,
    ) -> Ask | Located:
        """Take the answers to the last :class:`Ask` (and the ``lastActivity`` the active
        ones reported, and the epochs of the copies that reported one)."""
        self.answers.update(answers)
        if activity:
            self.activity.update(activity)
        if epochs:
            self.epochs.update(epochs)
        hint, self._hinted = self._hinted, None
        if hint is None:
            return self._decided()
        if self.answers.get(hint.backend) is not ProbeResult.ACTIVE:
            self.stage = Stage.STALE
        elif hint.confirmed(self._now, self._verify_after):
            self.stage, self.checked = Stage.HIT, hint.checked
            return Located(hint.backend, Outcome.ACTIVE, highest_epoch=self._highest(), alone=True)
        elif not any(c.attached and c.id != hint.backend for c in self.snapshot.candidates):
            self.stage = Stage.AUDIT
            return Located(
                hint.backend,
                Outcome.ACTIVE,
                audit=True,
                highest_epoch=self._highest(),
                alone=True,
            )
        else:
            self.stage = Stage.VERIFY
        return self._ask_the_rest()

    def heard(self, answers: Mapping[BackendId, StatusAnswer]) -> Ask | Located:
        """:meth:`hear` the answers to the last :class:`Ask` as the probes read them."""
        return self.hear(
            {b: a.result for b, a in answers.items()},
            {b: a.last_activity for b, a in answers.items() if a.last_activity is not None},
            {b: a.epoch for b, a in answers.items() if a.epoch is not None},
        )

    def _ask_the_rest(self) -> Ask | Located:
        rest = tuple(
            c.id for c in self.snapshot.candidates if c.probeable and c.id not in self.answers
        )
        if not rest:
            return self._decided()
        self.fanned_out = True
        return self._ask(rest)

    def _decided(self) -> Located:
        located = decide(self.snapshot, self.answers, self.activity, self.epochs)
        if located.outcome is Outcome.ACTIVE:
            self.checked = self._now
        highest = self._highest()
        return located if highest is None else replace(located, highest_epoch=highest)

    def _highest(self) -> int | None:
        return max(self.epochs.values()) if self.epochs else None


def decide(
    snapshot: Snapshot,
    answers: Mapping[BackendId, ProbeResult],
    activity: Mapping[BackendId, float] | None = None,
    epochs: Mapping[BackendId, int] | None = None,
) -> Located:
    """Choose a backend for the session, from every answer heard (rules 1 to 5 above).

    Raises :class:`NoBackendAvailable` when no backend may take the session,
    :class:`LocateInconclusive` under rule 2 or for a session held in maintenance, and
    :class:`SessionNotFound` when every backend that might know the session has been
    tried.
    """
    session_id = snapshot.session_id
    epochs = epochs or {}
    pool = [c for c in snapshot.candidates if c.health is not Health.GONE]
    seen = {c.id: evidence(c, answers.get(c.id)) for c in pool}
    stale = still_stale(snapshot.stale, epochs)
    active = [c for c in pool if seen[c.id] is ProbeResult.ACTIVE and c.id not in stale]
    superseded = _superseded(active, epochs)
    if superseded:
        located = _not_active(snapshot, pool, seen, epochs)
        verdict = Verdict(located.backend, superseded, How.EPOCH)
        return replace(located, split_brain=superseded, verdict=verdict)
    if len(active) > 1:
        return _split(snapshot, active, activity or {}, epochs)
    if active:
        if active[0].admin is AdminState.MAINT:
            raise _held_in_maintenance(session_id, active[0].id)
        return Located(active[0].id, Outcome.ACTIVE)
    return _not_active(snapshot, pool, seen, epochs)


def _superseded(active: list[Candidate], epochs: Mapping[BackendId, int]) -> tuple[BackendId, ...]:
    """The active copies a copy that is not active outranks: where every active copy
    reports an epoch and another copy (inactive: in a store, not in memory) reports a
    higher one, every active copy is stale (the session was resumed there since, and
    its newest history is there), and the session goes to the newest copy."""
    if not active or not all(c.id in epochs for c in active) or not epochs:
        return ()
    if max(epochs[c.id] for c in active) >= max(epochs.values()):
        return ()
    return tuple(c.id for c in active)


def _not_active(
    snapshot: Snapshot,
    pool: list[Candidate],
    seen: Mapping[BackendId, ProbeResult | None],
    epochs: Mapping[BackendId, int],
) -> Located:
    """Rules 2 to 5: no copy is active (or none that is not stale)."""
    session_id, tried = snapshot.session_id, snapshot.tried
    up = [c for c in pool if c.health is Health.UP]
    if not up:
        raise NoBackendAvailable(None, {"sessionId": session_id})
    silent = [c.id for c in pool if seen[c.id] is ProbeResult.UNKNOWN]
    if silent and snapshot.policy is UnknownPolicy.FAIL_CLOSED:
        raise LocateInconclusive(None, {"sessionId": session_id, "backends": silent})
    serving = [c for c in up if c.admin is not AdminState.MAINT]
    serving = [c for c in serving if not c.draining] + [c for c in serving if c.draining]
    known = [c for c in serving if seen[c.id] is ProbeResult.INACTIVE and c.id not in tried]
    if known:
        # the newest copy first (its epoch), then the rank (a stable sort)
        known.sort(key=lambda c: -epochs.get(c.id, -1))
        return Located(known[0].id, Outcome.INACTIVE)
    # nobody that can be asked knows it: try the backends that cannot be asked
    blind = [c for c in up if seen[c.id] is None and c.id not in tried]
    remembered = snapshot.hint.backend if snapshot.hint is not None else None
    for candidate in blind:
        if candidate.id == remembered:
            if candidate.admin is AdminState.MAINT:
                raise _held_in_maintenance(session_id, candidate.id)
            return Located(candidate.id, Outcome.REMEMBERED)
    fresh = [c for c in serving if not c.draining]
    # the client's claim first (a stable sort keeps the rank order of the rest)
    blind_fresh = sorted((c for c in fresh if c in blind), key=lambda c: c.id != snapshot.claimed)
    if blind_fresh:
        return Located(blind_fresh[0].id, Outcome.DEFAULT)
    if tried:
        raise SessionNotFound(session_id)
    if not fresh:
        raise NoBackendAvailable(None, {"sessionId": session_id})
    return Located(fresh[0].id, Outcome.DEFAULT)


def _split(
    snapshot: Snapshot,
    active: list[Candidate],
    activity: Mapping[BackendId, float],
    epochs: Mapping[BackendId, int],
) -> Located:
    """Several copies are active: the home by :func:`router.core.split_brain.judge`."""
    verdict = judge(
        [c.id for c in active],
        attached=[c.id for c in active if c.attached],
        placed=snapshot.hint.backend if snapshot.hint is not None else None,
        activity=activity,
        epochs=epochs,
    )
    home = next(c for c in active if c.id == verdict.home)
    if home.admin is AdminState.MAINT:
        raise _held_in_maintenance(snapshot.session_id, home.id)
    return Located(home.id, Outcome.ACTIVE, tuple(c.id for c in active), verdict)


def _held_in_maintenance(session_id: str, backend: BackendId) -> LocateInconclusive:
    return LocateInconclusive(
        "The agent backend that holds this session is in maintenance; retry later",
        {"sessionId": session_id, "backends": [backend], "maintenance": True},
    )


# -- hints: what a locate, or an answer, leaves for the next one -----------------------------------


def hint_after(round_: LocateRound, located: Located) -> float | bool | None:
    """Whether a locate leaves a hint at ``located.backend``, and when a fan-out last
    confirmed it there: the confirmation time (None: never confirmed), or False when
    the hint table stays as it was: a hit on a recent confirmation changes nothing, and
    a backend chosen on nobody's word (the rendezvous default, one that cannot be asked,
    the client's claim) is left to the resume's answer to confirm (a hint then,
    :func:`hint_after_answer`) or deny."""
    if located.outcome not in (Outcome.ACTIVE, Outcome.INACTIVE):
        return False
    if round_.stage is Stage.HIT and round_.checked is None:
        return False
    return round_.checked


def hint_after_answer(
    previous: Hint | None, backend: BackendId, created: bool, now: float
) -> float | None:
    """When the hint a backend's answer leaves (the session lives on ``backend``) counts
    as confirmed: a session it just ``created`` lives nowhere else (its id is new),
    which is as good as a fan-out at ``now``; otherwise it keeps the confirmation the
    previous hint had, if that named the same backend."""
    if created:
        return now
    return previous.checked if previous is not None and previous.backend == backend else None


def moved_from(snapshot: Snapshot, located: Located) -> BackendId | None:
    """The backend the session was hinted at, when it is given up (gone) and the locate
    found the session elsewhere: should that backend come back as the same process, a
    fence asks it about this session first (:mod:`router.core.health`)."""
    hint = snapshot.hint
    if hint is None or hint.backend == located.backend:
        return None
    gone = any(c.id == hint.backend and c.health is Health.GONE for c in snapshot.candidates)
    return hint.backend if gone or hint.backend not in {c.id for c in snapshot.candidates} else None


def lasting(*, has_status: bool) -> bool:
    """A hint to a backend that cannot be probed is the router's only memory of where the
    session is, so it lasts (``cache.remember_seconds``); others are guesses that a
    probe checks (``cache.ttl_seconds``)."""
    return not has_status
