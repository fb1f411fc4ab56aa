"""Locating a session from its probe answers, sans-I/O.

The rules (design.md, "Routing"), applied to the answers of the backends that are
up, in the session's rendezvous order:

1. Exactly one ``active`` → that backend. Several → the best-ranked of them, and
   the caller is told (split brain).
2. No ``active`` and some backend *unknown* (up but silent, or an error) → fail
   closed with a retryable error, unless the policy is ``place_anyway``: that
   backend may hold the session in memory, and resuming elsewhere could run it
   twice.
3. No ``active``, some ``inactive`` → the best-ranked backend that knows it.
4. Nothing known anywhere → the best-ranked backend (the rendezvous default).

Backends that do not advertise ``session/status`` are never probed and count as
not knowing the session.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from cachetools import TTLCache

from router.protocol.acp import ProbeResult
from router.protocol.errors import LocateInconclusive, NoBackendAvailable, SessionNotFound
from router.protocol.ids import BackendId, SessionId


class UnknownPolicy(enum.Enum):
    """What to do when no backend says ``active`` and some backend gave no answer."""

    FAIL_CLOSED = "fail_closed"
    PLACE_ANYWAY = "place_anyway"


class Outcome(enum.Enum):
    """How a backend was chosen; also the ``outcome`` label of the locate metrics."""

    ACTIVE = "active"
    INACTIVE = "inactive"
    DEFAULT = "default"


@dataclass(frozen=True, slots=True)
class Located:
    """Where a session goes, and why."""

    backend: BackendId
    outcome: Outcome
    #: every backend that said ``active``, best-ranked first, when more than one did
    split_brain: tuple[BackendId, ...] = ()


def decide(
    order: Sequence[BackendId],
    answers: Mapping[BackendId, ProbeResult],
    policy: UnknownPolicy = UnknownPolicy.FAIL_CLOSED,
    *,
    session_id: str,
) -> Located:
    """Choose a backend for ``session_id``.

    ``order`` is every backend that is up, best-ranked first; ``answers`` holds the
    probe answer of each backend that was probed. Raises :class:`NoBackendAvailable`
    when ``order`` is empty and :class:`LocateInconclusive` under rule 2.
    """
    if not order:
        raise NoBackendAvailable(None, {"sessionId": session_id})
    active = tuple(b for b in order if answers.get(b) is ProbeResult.ACTIVE)
    if active:
        return Located(active[0], Outcome.ACTIVE, active if len(active) > 1 else ())
    unknown = [b for b in order if answers.get(b) is ProbeResult.UNKNOWN]
    if unknown and policy is UnknownPolicy.FAIL_CLOSED:
        raise LocateInconclusive(None, {"sessionId": session_id, "backends": unknown})
    known = [b for b in order if answers.get(b) is ProbeResult.INACTIVE]
    if known:
        return Located(known[0], Outcome.INACTIVE)
    return Located(order[0], Outcome.DEFAULT)


def pool_status(answers: Mapping[BackendId, ProbeResult], *, session_id: str) -> str:
    """The router's own ``session/status`` answer from the pool's answers.

    ``active`` if any backend has it in memory; ``inactive`` if any knows it; the
    RFD's ``-32002`` when every backend answered and none knows it. When none knows
    it but some did not answer, nobody can say it is unknown: retryable error.
    """
    values = set(answers.values())
    if ProbeResult.ACTIVE in values:
        return "active"
    if ProbeResult.INACTIVE in values:
        return "inactive"
    if ProbeResult.UNKNOWN in values:
        unknown = sorted(b for b, r in answers.items() if r is ProbeResult.UNKNOWN)
        raise LocateInconclusive(None, {"sessionId": session_id, "backends": unknown})
    raise SessionNotFound(session_id)


class LocationCache:
    """Bounded session → backend hints with a TTL; the clock is injected.

    A hint is only ever a guess: the caller probes the hinted backend first and
    fans out when it does not say ``active``.
    """

    def __init__(self, maxsize: int, ttl: float, clock: Callable[[], float]) -> None:
        self._cache: TTLCache[SessionId, BackendId] = TTLCache(
            maxsize=maxsize, ttl=ttl, timer=clock
        )

    def get(self, session_id: SessionId) -> BackendId | None:
        """The hinted backend, or None (never seen, expired or evicted)."""
        return self._cache.get(session_id)

    def put(self, session_id: SessionId, backend: BackendId) -> None:
        """Remember that ``session_id`` was last seen on ``backend``."""
        self._cache[session_id] = backend

    def invalidate(self, session_id: SessionId) -> None:
        """Forget the hint for ``session_id`` (its backend did not know it)."""
        self._cache.pop(session_id, None)

    def forget_backend(self, backend: BackendId) -> None:
        """Forget every hint that points at ``backend``."""
        for session_id in [s for s, b in self._cache.items() if b == backend]:
            self._cache.pop(session_id, None)

    def __len__(self) -> int:
        return len(self._cache)
