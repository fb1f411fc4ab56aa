"""Locating a session from its probe answers, sans-I/O.

The rules (design.md, "Routing"), applied to the answers of the backends that are
up, in the session's rendezvous order:

1. Exactly one ``active`` → that backend. Several → the best-ranked of them, and
   the caller is told (split brain).
2. No ``active`` and some backend *unknown* (up but silent, or an error, or down
   but not gone: :mod:`router.core.health`) → fail closed with a retryable error,
   unless the policy is ``place_anyway``: that backend may hold the session in
   memory, and resuming elsewhere could run it twice.
3. No ``active``, some ``inactive`` → the best-ranked backend that knows it.
4. Nothing known by any backend that can be asked → the backends that cannot be
   asked (no ``session/status``): the one this router remembers placing or finding
   the session on, else the best-ranked of them; each answers ``-32002`` at most
   once per resume (``tried``), then the next is tried.
5. No backend left to try → the best-ranked backend (the rendezvous default) on the
   first try, ``-32002`` after that.

Backends that do not advertise ``session/status`` are never probed.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cachetools import TLRUCache

from router.protocol.acp import ProbeResult
from router.protocol.errors import LocateInconclusive, NoBackendAvailable, SessionNotFound
from router.protocol.ids import BackendId, SessionId


class UnknownPolicy(enum.Enum):
    """What to do when no backend says ``active`` and some backend gave no answer."""

    FAIL_CLOSED = "fail_closed"
    PLACE_ANYWAY = "place_anyway"


class AdminState(enum.Enum):
    """What an operator set a backend to (``POST /admin/backends/{id}/<state>``), with
    HAProxy's meaning (see :func:`decide`)."""

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
    unreachable: Sequence[BackendId] = (),
    remembered: BackendId | None = None,
    tried: Collection[BackendId] = (),
    draining: Collection[BackendId] = (),
    maintenance: Collection[BackendId] = (),
) -> Located:
    """Choose a backend for ``session_id``.

    ``order`` is every backend that is up, best-ranked first; ``answers`` holds the
    probe answer of each backend that was probed (and ``active`` for a backend the
    session is attached to through this router). ``unreachable`` are the backends that
    are down but not gone (:mod:`router.core.health`): they count as unknown.
    ``remembered`` is where this router last placed or found the session, and
    ``tried`` the backends that already answered ``-32002`` to this resume.

    An operator may take backends out (``POST /admin/backends/{id}/...``), as HAProxy
    does: a *draining* backend still takes the sessions located there (active there,
    or known only there), and nothing else; one in *maintenance* takes nothing, and a
    session it holds in memory (or may hold: it is where this router remembers
    placing it) gets the retryable ``-32012`` rather than a second life elsewhere.

    Raises :class:`NoBackendAvailable` when no backend may take the session,
    :class:`LocateInconclusive` under rule 2 or for a session held in maintenance, and
    :class:`SessionNotFound` when every backend that might know the session has been
    tried.
    """
    if not order:
        raise NoBackendAvailable(None, {"sessionId": session_id})
    active = tuple(b for b in order if answers.get(b) is ProbeResult.ACTIVE)
    if active:
        if active[0] in maintenance:
            raise _held_in_maintenance(session_id, active[0])
        return Located(active[0], Outcome.ACTIVE, active if len(active) > 1 else ())
    silent = [b for b in order if answers.get(b) is ProbeResult.UNKNOWN]
    silent += [b for b in unreachable if b not in silent]
    if silent and policy is UnknownPolicy.FAIL_CLOSED:
        raise LocateInconclusive(None, {"sessionId": session_id, "backends": silent})
    serving = [b for b in order if b not in maintenance and b not in draining]
    serving += [b for b in order if b in draining and b not in maintenance]
    known = [b for b in serving if answers.get(b) is ProbeResult.INACTIVE and b not in tried]
    if known:
        return Located(known[0], Outcome.INACTIVE)
    # nobody that can be asked knows it: try the backends that cannot be asked
    blind = [b for b in order if b not in answers and b not in tried]
    if remembered is not None and remembered in blind:
        if remembered in maintenance:
            raise _held_in_maintenance(session_id, remembered)
        return Located(remembered, Outcome.REMEMBERED)
    blind = [b for b in serving if b in blind and b not in draining]
    if blind:
        return Located(blind[0], Outcome.DEFAULT)
    if tried:
        raise SessionNotFound(session_id)
    fresh = [b for b in serving if b not in draining]
    if not fresh:
        raise NoBackendAvailable(None, {"sessionId": session_id})
    return Located(fresh[0], Outcome.DEFAULT)


def _held_in_maintenance(session_id: str, backend: BackendId) -> LocateInconclusive:
    return LocateInconclusive(
        "The agent backend that holds this session is in maintenance; retry later",
        {"sessionId": session_id, "backends": [backend], "maintenance": True},
    )


def pool_status(
    answers: Mapping[BackendId, ProbeResult],
    *,
    session_id: str,
    states: Mapping[BackendId, Mapping[str, Any]] | None = None,
) -> dict[str, Any]:
    """The router's own ``session/status`` result from the pool's answers.

    ``active`` if any backend has it in memory; ``inactive`` if any knows it; the
    RFD's ``-32002`` when every backend answered and none knows it. When none knows
    it but some did not answer, nobody can say it is unknown: retryable error.
    An active answer carries the v2 foreground ``state`` one of the backends that
    has it in memory reported (``states``), and none when none did: a state that was
    not reported is never made up.
    """
    values = set(answers.values())
    if ProbeResult.ACTIVE in values:
        reported = states or {}
        state = next(
            (reported[b] for b, r in answers.items() if r is ProbeResult.ACTIVE and b in reported),
            None,
        )
        return {"status": "active"} if state is None else {"status": "active", "state": state}
    if ProbeResult.INACTIVE in values:
        return {"status": "inactive"}
    if ProbeResult.UNKNOWN in values:
        unknown = sorted(b for b, r in answers.items() if r is ProbeResult.UNKNOWN)
        raise LocateInconclusive(None, {"sessionId": session_id, "backends": unknown})
    raise SessionNotFound(session_id)


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

    def __len__(self) -> int:
        return len(self._cache)
