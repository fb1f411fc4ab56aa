"""What this router replica knows about where sessions are: the attachments of its
client connections, its location hints, the links its connections hold, and the
placement load those make (:class:`router.core.placement.Spread`).

The pool reads it to build a locate's snapshot (:meth:`Directory.attached_to`,
:meth:`Directory.hint`) and to place new sessions; client connections write to it what
their routing core reported (attached, detached, created, closed, learned).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable

from cachetools import TTLCache

from router.core.effects import Attach, Change
from router.core.hints import Absences, Hint, LocationCache
from router.core.placement import Node, Spread
from router.protocol.acp import StatusAnswer
from router.protocol.ids import BackendId, SessionId
from router.server.config import Settings
from router.server.metrics import Metrics


class Directory:
    def __init__(
        self, settings: Settings, metrics: Metrics, clock: Callable[[], float], salt: str
    ) -> None:
        self._metrics = metrics
        self._clock = clock
        self.hints = LocationCache(
            settings.cache.max_entries,
            settings.cache.ttl_seconds,
            clock,
            remember=settings.cache.remember_seconds,
        )
        #: sessions an audit found active on two backends: their locates ask everyone
        #: (no hint trusted) for a while, so every replica picks the same copy
        self.suspects: TTLCache[SessionId, None] = TTLCache(
            settings.cache.max_entries, settings.cache.ttl_seconds, timer=clock
        )
        self.absences = Absences(settings.cache.max_entries, settings.cache.negative_seconds, clock)
        self.spread = Spread(
            settings.placement.decay_seconds, salt=salt, max_sessions=settings.cache.max_entries
        )
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
            settings.cache.max_entries, settings.cache.remember_seconds, timer=clock
        )
        #: pulsed whenever ``attached`` changes
        self.attached_changed = asyncio.Event()
        #: pulsed whenever ``pinned`` changes
        self.pinned_changed = asyncio.Event()
        metrics.watch_cache(self.hints.__len__)

    # -- attachments -------------------------------------------------------------------------------

    def record(self, changes: Iterable[Change]) -> None:
        """Sessions attached to or detached from backends on some connection: a session
        counts once per backend, however many connections have it attached there."""
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
                self._count(change.backend, 1)
                self.spread.attached(change.session_id, now)
            elif before > 0 and after <= 0:
                self._count(change.backend, -1)
                self.spread.detached(change.session_id, change.backend, now)
        self.attached_changed.set()
        self.attached_changed.clear()

    def _count(self, backend: BackendId, delta: int) -> None:
        count = self.attached[backend] = self.attached.get(backend, 0) + delta
        if count <= 0 and backend in self._left:
            # it left the pool, and now its last session here has ended
            self._left.discard(backend)
            del self.attached[backend]
            self._metrics.attached_sessions.remove(backend)
        else:
            self._metrics.attached_sessions.labels(backend).set(count)

    def attached_to(self, session_id: SessionId) -> set[BackendId]:
        """The backends ``session_id`` is attached to on some connection of this router
        (each through a link that is alive: a link that ends detaches its sessions)."""
        return set(self.attachments.get(session_id, ()))

    def released(self, session_id: SessionId) -> None:
        """``session_id`` was closed through this router: it weighs on no backend now."""
        self.spread.released(session_id, self._clock())

    def forget_backend(self, backend: BackendId, *, member: bool) -> None:
        """``backend`` lost its memory or left the pool: its hints name nothing. One that
        left the pool (``member`` false) carries no placement load either, and its gauge
        goes once no session is attached to it here."""
        self.hints.forget_backend(backend)
        if member:
            return
        self.spread.forget_backend(backend)
        if self.attached.get(backend):
            self._left.add(backend)
        else:
            self.attached.pop(backend, None)
            self._metrics.attached_sessions.remove(backend)

    def joined(self, backend: BackendId) -> None:
        """``backend`` is (again) a member of the pool."""
        self._left.discard(backend)
        self._metrics.attached_sessions.labels(backend).set(self.attached.get(backend, 0))

    # -- links ---------------------------------------------------------------------------------------

    def pin(self, backend: BackendId, delta: int) -> None:
        """A client connection opened (+1) or ended (-1) its link to ``backend``."""
        count = self.pinned[backend] = self.pinned.get(backend, 0) + delta
        if count <= 0:
            del self.pinned[backend]
        self.pinned_changed.set()
        self.pinned_changed.clear()

    def hear(self, session_id: SessionId, answers: dict[BackendId, StatusAnswer]) -> None:
        """Keep what a probe round heard about ``session_id`` (for the admin page)."""
        if answers:
            now = self._clock()
            seen = self.heard.get(session_id) or {}
            self.heard[session_id] = {**seen, **{b: (a, now) for b, a in answers.items()}}

    # -- hints ---------------------------------------------------------------------------------------

    def hint(self, session_id: SessionId) -> Hint | None:
        return self.hints.hint(session_id)

    def remember(
        self, session_id: SessionId, backend: BackendId, checked: float | None, *, lasting: bool
    ) -> None:
        self.hints.put(session_id, backend, checked=checked, lasting=lasting)

    def forget(self, session_id: SessionId) -> None:
        self.hints.invalidate(session_id)

    # -- placement -----------------------------------------------------------------------------------

    def place(self, candidates: list[Node]) -> BackendId | None:
        """A backend for a new session, by the distinct sessions each carries."""
        return self.spread.place(candidates, self.attached, self._clock())

    def created(self, backend: BackendId) -> None:
        """A placement on ``backend`` created its session (now attached, and counted so)."""
        self.spread.created(backend, self._clock())
