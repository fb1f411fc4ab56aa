"""What this router replica knows about where sessions are, sans-I/O: the attachments
of its client connections, its location hints and absences, the links its connections
hold, and the placement load those make (:class:`router.core.placement.Spread`).

The pool reads it to build a locate's snapshot (:meth:`Directory.attached_to`,
:meth:`Directory.hint`) and to place new sessions; client connections write to it what
their routing core reported (attached, detached, created, closed, learned). The tables
are bounded and their clock is injected (cachetools' timer): nothing here reads one of
its own. What changes a gauge is returned to the shell, which sets it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from cachetools import TTLCache

from router.core import defaults
from router.core.effects import Attach, Change
from router.core.fleet import Heard
from router.core.hints import Absences, Hint, LocationCache
from router.core.locate import (
    Candidate,
    Located,
    LocateRound,
    Snapshot,
    UnknownPolicy,
    hint_after,
    hint_after_answer,
    lasting,
    moved_from,
)
from router.core.placement import Asked, Node, Spread
from router.core.split_brain import StaleMarks
from router.protocol.acp import ProbeResult, StatusAnswer
from router.protocol.ids import BackendId, SessionId


@dataclass(frozen=True, slots=True)
class Bounds:
    """How much the directory keeps, and for how long (the ``[cache]`` and
    ``[placement]`` settings, in seconds; the defaults: :mod:`router.core.defaults`,
    the config's too)."""

    max_entries: int = defaults.CACHE_MAX_ENTRIES
    ttl: float = defaults.CACHE_TTL_SECONDS
    remember: float = defaults.CACHE_REMEMBER_SECONDS
    negative: float = defaults.CACHE_NEGATIVE_SECONDS
    decay: float = defaults.PLACEMENT_DECAY_SECONDS


class Directory:
    def __init__(self, bounds: Bounds, clock: Callable[[], float], salt: str) -> None:
        self._clock = clock
        self.hints = LocationCache(bounds.max_entries, bounds.ttl, clock, remember=bounds.remember)
        #: sessions an audit found active on two backends: their locates ask everyone
        #: (no hint trusted) for a while, so every replica picks the same copy
        self.suspects: TTLCache[SessionId, None] = TTLCache(
            bounds.max_entries, bounds.ttl, timer=clock
        )
        self.absences = Absences(bounds.max_entries, bounds.negative, clock)
        #: backend given up -> the sessions it held as far as this replica knows (hinted
        #: or attached there when it was given up, or moved away from it since): what a
        #: fence asks it about if it comes back as the same process
        self.given_up: dict[BackendId, set[SessionId]] = {}
        self._max_given_up = bounds.max_entries
        self._given_up_count = 0
        #: sessions whose copies on these backends are known to be stale (a split brain
        #: judged, or a fenced backend's): no resume goes there while the entry lives
        self.stale: TTLCache[SessionId, StaleMarks] = TTLCache(
            bounds.max_entries, bounds.ttl, timer=clock
        )
        self.spread = Spread(bounds.decay, salt=salt, max_sessions=bounds.max_entries)
        #: session -> backend -> how many connections of this router have it attached there
        self.attachments: dict[SessionId, dict[BackendId, int]] = {}
        #: backend -> distinct sessions attached to it through this router
        self.attached: dict[BackendId, int] = {}
        #: backend -> how many client connections of this router hold a link to it
        self.pinned: dict[BackendId, int] = {}
        #: backends that left the pool while sessions were attached to them here
        self._left: set[BackendId] = set()
        #: the last answer each session's probes got, per backend, and when (seconds on
        #: the clock): what the admin page shows, so that a refresh costs no probe
        self.heard: TTLCache[SessionId, dict[BackendId, tuple[StatusAnswer, float]]] = TTLCache(
            bounds.max_entries, bounds.remember, timer=clock
        )

    # -- attachments -------------------------------------------------------------------------------

    def record(self, changes: Iterable[Change]) -> dict[BackendId, int | None]:
        """Sessions attached to or detached from backends on some connection: a session
        counts once per backend, however many connections have it attached there. The
        backends whose count changed, and their count now (None: the backend left the
        pool and its last session here has ended: its gauge goes)."""
        counts: dict[BackendId, int | None] = {}
        now = self._clock()
        for change in changes:
            where = self.attachments.setdefault(change.session_id, {})
            before = where.get(change.backend, 0)
            after = before + (1 if isinstance(change, Attach) else -1)
            if after > 0:
                where[change.backend] = after
            else:
                where.pop(change.backend, None)
            if not where:
                del self.attachments[change.session_id]
            if before == 0 and after > 0:
                counts[change.backend] = self._count(change.backend, 1)
                self.spread.attached(change.session_id, now)
            elif before > 0 and after <= 0:
                counts[change.backend] = self._count(change.backend, -1)
                self.spread.detached(change.session_id, change.backend, now)
        return counts

    def _count(self, backend: BackendId, delta: int) -> int | None:
        count = self.attached[backend] = self.attached.get(backend, 0) + delta
        if count <= 0 and backend in self._left:
            # it left the pool, and now its last session here has ended
            self._left.discard(backend)
            del self.attached[backend]
            return None
        return count

    def attached_to(self, session_id: SessionId) -> set[BackendId]:
        """The backends ``session_id`` is attached to on some connection of this router
        (each through a link that is alive: a link that ends detaches its sessions)."""
        return set(self.attachments.get(session_id, ()))

    def attached_count(self, session_id: SessionId, backend: BackendId) -> int:
        """How many client connections of this router have ``session_id`` attached on
        ``backend`` (:data:`router.core.calls.AttachedCount`)."""
        return self.attachments.get(session_id, {}).get(backend, 0)

    def released(self, session_id: SessionId) -> None:
        """``session_id`` was closed through this router: it weighs on no backend now."""
        self.spread.released(session_id, self._clock())

    def forget_backend(self, backend: BackendId, *, member: bool) -> bool:
        """``backend`` lost its memory or left the pool: its hints name nothing. One that
        left the pool (``member`` false) carries no placement load either, and its gauge
        goes once no session is attached to it here: True when it goes now."""
        self.hints.forget_backend(backend)
        if member:
            return False
        self.spread.forget_backend(backend)
        if self.attached.get(backend):
            self._left.add(backend)
            return False
        self.attached.pop(backend, None)
        return True

    def joined(self, backend: BackendId) -> int:
        """``backend`` is (again) a member of the pool: the sessions attached to it here."""
        self._left.discard(backend)
        return self.attached.get(backend, 0)

    # -- links ---------------------------------------------------------------------------------------

    def pin(self, backend: BackendId, delta: int) -> None:
        """A client connection opened (+1) or ended (-1) its link to ``backend``."""
        count = self.pinned[backend] = self.pinned.get(backend, 0) + delta
        if count <= 0:
            del self.pinned[backend]

    def hear(self, session_id: SessionId, answers: dict[BackendId, StatusAnswer]) -> None:
        """Keep what a probe round heard about ``session_id`` (for the admin page)."""
        if answers:
            now = self._clock()
            seen = self.heard.get(session_id) or {}
            self.heard[session_id] = {**seen, **{b: (a, now) for b, a in answers.items()}}

    # -- what a locate starts from, and what answers teach -------------------------------------------

    def snapshot(
        self,
        session_id: SessionId,
        candidates: tuple[Candidate, ...],
        *,
        policy: UnknownPolicy,
        tried: tuple[BackendId, ...] = (),
        ask_all: bool = False,
        claimed: BackendId | None = None,
    ) -> Snapshot:
        """What a locate of ``session_id`` starts from (:class:`router.core.locate.Snapshot`),
        over ``candidates`` (the pool as the fleet sees it): the backends that answered a
        resume of it ``-32002`` lately count as tried; those a probe found without it are
        absent; its stale copies; the whole pool is asked for an audit (``ask_all``) and
        for a suspect (seen split, or on a backend that just stopped answering); a client's
        claim (``claimed``, the home its hinted id named) counts only if it names one of
        the candidates."""
        refused = self.absences.resumed(session_id)
        members = {c.id for c in candidates}
        return Snapshot(
            session_id,
            candidates,
            self.hint(session_id),
            policy,
            (*tried, *(b for b in sorted(refused) if b not in tried)),
            self.absences.probed(session_id),
            self.stale.get(session_id, {}),
            ask_all or session_id in self.suspects,
            claimed if claimed in members else None,
        )

    def learned(
        self, session_id: SessionId, backend: BackendId, *, created: bool, has_status: bool
    ) -> None:
        """A backend's answer shows ``session_id`` living on ``backend`` (a member of the
        pool): nothing is absent any more, the hint points there
        (:func:`router.core.locate.hint_after_answer`), and the admin page shows it
        ``active`` there until a probe says more."""
        self.absences.forget(session_id)
        checked = hint_after_answer(self.hint(session_id), backend, created, self._clock())
        self.remember(session_id, backend, checked, lasting=lasting(has_status=has_status))
        self.hear(session_id, {backend: StatusAnswer(ProbeResult.ACTIVE)})

    # -- hints ---------------------------------------------------------------------------------------

    def hint(self, session_id: SessionId) -> Hint | None:
        return self.hints.hint(session_id)

    def located(
        self,
        round_: LocateRound,
        located: Located | None,
        *,
        member: bool = True,
        has_status: bool = True,
    ) -> None:
        """What a locate round taught this replica (``located``: what it found; None: it
        failed): the backends that answered ``-32002`` in it (not those it remembered);
        and, when it found the session, the backend it moved from (a fence asks that one
        first) and the hint it leaves (:func:`~router.core.locate.hint_after`), on
        ``located.backend`` while that is a ``member`` (``has_status``: it can be probed,
        so the hint is a guess a probe checks, not the only memory)."""
        snapshot = round_.snapshot
        session_id = snapshot.session_id
        heard = [
            b
            for b, answer in round_.answers.items()
            if answer is ProbeResult.NOT_FOUND and b not in snapshot.absent
        ]
        self.absences.add(session_id, probed=heard)
        if located is None:
            return
        moved = moved_from(snapshot, located)
        if moved is not None:
            self.moved_away(moved, [session_id])
        checked = hint_after(round_, located)
        if checked is not False and member:
            self.remember(
                session_id, located.backend, checked, lasting=lasting(has_status=has_status)
            )

    def not_there(self, session_id: SessionId, backend: BackendId) -> None:
        """``backend`` answered a resume of ``session_id`` ``-32002``: the hint is wrong,
        and ``backend`` counts as tried for its next resumes a while."""
        self.forget(session_id)
        self.absences.add(session_id, resumed=[backend])

    def remember(
        self, session_id: SessionId, backend: BackendId, checked: float | None, *, lasting: bool
    ) -> None:
        self.hints.put(session_id, backend, checked=checked, lasting=lasting)

    def health_heard(self, backend: BackendId, heard: Heard) -> None:
        """What a health event of ``backend`` (:class:`router.core.fleet.Heard`) means for
        what this replica knows of its sessions: in doubt when it stopped answering; kept
        for a fence when it was given up; its hints forgotten when it lost its memory."""
        if heard.faulted:
            self.doubt(backend)
        if heard.gave_up:
            self.give_up(backend)
        if heard.step.lost_memory:
            self.forget_backend(backend, member=True)

    def audited(self, session_id: SessionId, audit: Located) -> None:
        """An audit of ``session_id`` (a locate of the whole pool, off the request path)
        found ``audit``: where it saw a split brain, the session is a suspect for a while,
        so its resumes ask everyone and take the copy every replica takes."""
        if audit.split_brain:
            self.suspects[session_id] = None

    def doubt(self, backend: BackendId) -> None:
        """``backend`` stopped answering (:attr:`router.core.fleet.Heard.faulted`): the
        sessions hinted or attached there are suspects for a while, so their next locate
        asks the whole pool, not the hint alone: another replica that saw the fault
        longer may have resumed them elsewhere, and of two copies the epochs tell the
        home (:mod:`router.core.split_brain`)."""
        for session_id, hint in self.hints.items():
            if hint.backend == backend:
                self.suspects[session_id] = None
        for session_id, where in self.attachments.items():
            if backend in where:
                self.suspects[session_id] = None

    def give_up(self, backend: BackendId) -> None:
        """``backend`` is given up (gone): keep the sessions hinted or attached there, for
        a fence should it come back as the same process."""
        held = {s for s, h in self.hints.items() if h.backend == backend}
        held |= {s for s, where in self.attachments.items() if backend in where}
        self.moved_away(backend, held)

    def moved_away(self, backend: BackendId, sessions: Iterable[SessionId]) -> None:
        """``sessions`` left ``backend`` (given up) for another: a fence asks about them."""
        kept = self.given_up.setdefault(backend, set())
        for session_id in sessions:
            if self._given_up_count >= self._max_given_up:
                return  # bounded: a split brain missed here is still found by a locate
            if session_id not in kept:
                kept.add(session_id)
                self._given_up_count += 1

    def to_fence(self, backend: BackendId) -> list[SessionId]:
        """The sessions a fence of ``backend`` asks about (handed out once). Those hinted or
        attached there are suspects again (:meth:`doubt`): while it was given up another
        replica may have resumed them elsewhere, so their next locate asks everyone."""
        self.doubt(backend)
        sessions = self.given_up.pop(backend, set())
        self._given_up_count -= len(sessions)
        return sorted(sessions)

    def mark_stale(self, session_id: SessionId, marks: StaleMarks) -> None:
        """The copies of ``session_id`` in ``marks`` are stale (another is its home), up to
        the epoch each had (:func:`router.core.split_brain.still_stale`)."""
        self.stale[session_id] = {**self.stale.get(session_id, {}), **marks}

    def forget(self, session_id: SessionId) -> None:
        self.hints.invalidate(session_id)

    # -- placement -----------------------------------------------------------------------------------

    def place(self, candidates: list[Node], asked: Asked | None = None) -> BackendId | None:
        """A backend for a new session (``asked``: what its request says), by the distinct
        sessions each carries (:meth:`router.core.placement.Spread.place`)."""
        return self.spread.place(candidates, self.attached, self._clock(), asked)

    def created(self, backend: BackendId) -> None:
        """A placement on ``backend`` created its session (now attached, and counted so)."""
        self.spread.created(backend, self._clock())
