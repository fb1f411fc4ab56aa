"""Where this router last placed or found each session, sans-I/O: location hints.

A hint to a backend that can be probed is only a guess: a locate probes it first and
asks the rest of the pool when it does not say ``active`` (:mod:`router.core.locate`).
A hint to a backend that cannot be probed is the router's only memory of where the
session is, so it lives longer. The table is bounded, and the clock is injected.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from cachetools import TLRUCache, TTLCache

from router.protocol.ids import BackendId, SessionId


@dataclass(frozen=True, slots=True)
class Hint:
    """Where this router last placed or found a session."""

    backend: BackendId
    #: when a fan-out over the whole pool last confirmed it (the shell's clock); None: never
    checked: float | None = None
    #: the backend cannot be probed, so this is the router's only memory of the session
    lasting: bool = False

    def confirmed(self, now: float, verify_after: float) -> bool:
        """Whether an ``active`` answer from the hinted backend alone may be trusted.

        Past ``verify_after`` seconds since the last fan-out, the next locate asks the
        whole pool again even when the hint says ``active``, so a second ``active``
        instance (split brain) is seen and counted instead of hidden behind the hint.
        """
        return self.checked is not None and now - self.checked < verify_after


class Absences:
    """Bounded session → the backends that said lately they do not have it, each entry
    for ``ttl`` seconds; the clock is injected.

    ``probed``: they answered a probe ``-32002``; ``resumed``: they answered a forwarded
    resume ``-32002`` (tried, as far as a resume is concerned). A locate does not ask them
    again while the entry lives, so an id nobody knows costs one fan-out, not one per try.
    """

    def __init__(self, maxsize: int, ttl: float, clock: Callable[[], float]) -> None:
        self._probed: TTLCache[SessionId, frozenset[BackendId]]
        self._probed = TTLCache(maxsize=maxsize, ttl=ttl, timer=clock)
        self._resumed: TTLCache[SessionId, frozenset[BackendId]]
        self._resumed = TTLCache(maxsize=maxsize, ttl=ttl, timer=clock)
        self._enabled = ttl > 0

    def probed(self, session_id: SessionId) -> frozenset[BackendId]:
        return self._probed.get(session_id, frozenset())

    def resumed(self, session_id: SessionId) -> frozenset[BackendId]:
        return self._resumed.get(session_id, frozenset())

    def add(
        self,
        session_id: SessionId,
        *,
        probed: Iterable[BackendId] = (),
        resumed: Iterable[BackendId] = (),
    ) -> None:
        """Backends just heard saying they do not have ``session_id``."""
        if not self._enabled:
            return
        for table, heard in (
            (self._probed, frozenset(probed)),
            (self._resumed, frozenset(resumed)),
        ):
            if heard:
                table[session_id] = table.get(session_id, frozenset()) | heard

    def forget(self, session_id: SessionId) -> None:
        """``session_id`` was found after all: nothing is absent."""
        self._probed.pop(session_id, None)
        self._resumed.pop(session_id, None)

    def __len__(self) -> int:
        return len(self._probed) + len(self._resumed)


class LocationCache:
    """Bounded session → :class:`Hint`, each with a TTL; the clock is injected.

    A hint to a backend that can be probed is only a guess: the caller probes it
    first and fans out when it does not say ``active``; it lives ``ttl`` seconds. A
    hint to a backend that cannot be probed (``lasting``) is the only memory of
    where the session is, so it lives ``remember`` seconds (longer); both are bounded
    by ``maxsize`` (least recently used first out).
    """

    def __init__(
        self,
        maxsize: int,
        ttl: float,
        clock: Callable[[], float],
        *,
        remember: float | None = None,
    ) -> None:
        lasting_ttl = ttl if remember is None else remember

        def expires(_: SessionId, hint: Hint, now: float) -> float:
            return now + (lasting_ttl if hint.lasting else ttl)

        self._cache: TLRUCache[SessionId, Hint] = TLRUCache(
            maxsize=maxsize, ttu=expires, timer=clock
        )

    def get(self, session_id: SessionId) -> BackendId | None:
        """The hinted backend, or None (never seen, expired or evicted)."""
        hint = self._cache.get(session_id)
        return None if hint is None else hint.backend

    def hint(self, session_id: SessionId) -> Hint | None:
        """The whole hint, with when it was last confirmed, or None."""
        return self._cache.get(session_id)

    def put(
        self,
        session_id: SessionId,
        backend: BackendId,
        *,
        checked: float | None = None,
        lasting: bool = False,
    ) -> None:
        """Remember that ``session_id`` was last seen on ``backend``."""
        self._cache[session_id] = Hint(backend, checked, lasting)

    def invalidate(self, session_id: SessionId) -> None:
        """Forget the hint for ``session_id`` (its backend did not know it)."""
        self._cache.pop(session_id, None)

    def forget_backend(self, backend: BackendId) -> None:
        """Forget every hint that points at ``backend``."""
        for session_id in [s for s, h in self._cache.items() if h.backend == backend]:
            self._cache.pop(session_id, None)

    def items(self) -> list[tuple[SessionId, Hint]]:
        return list(self._cache.items())

    def __len__(self) -> int:
        return len(self._cache)
