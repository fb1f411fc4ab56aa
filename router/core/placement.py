"""Where sessions go: weighted rendezvous hashing for sessions nobody has, and a
spreading choice for new sessions (:class:`Spread`), sans-I/O.

Every backend gets a score for a session id; the highest score wins, and the full
order is the session's *ranking* (docs/routing.md, "Placement"). Scores depend only on the
session id, the backend's stable configured id and its weight, so every router
replica computes the same ranking with no shared state, and adding, removing or
reweighting one backend only moves the sessions that backend wins or loses.

Health never changes the hashed set: a backend that is down is skipped in the
ranking, so a flapping backend does not reshuffle anyone else.
"""

from __future__ import annotations

import hashlib
import math
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from router.core import defaults
from router.protocol.ids import BackendId, SessionId
from router.protocol.jsonrpc import Request


@dataclass(frozen=True, slots=True)
class Asked:
    """What a placement rule may look at of the request it places: its method
    (``session/new``, or a first ``authenticate``, which goes where a new session would)
    and the new session's ``cwd``. The rule of :meth:`Spread.place` looks at the pool's
    load only; a rule that places by the request (a backend per project, say) changes
    that one method."""

    method: str
    cwd: str | None = None

    @classmethod
    def of(cls, request: Request) -> Asked:
        cwd = request.param("cwd")
        return cls(request.method, cwd if isinstance(cwd, str) else None)


_M64 = (1 << 64) - 1
#: the largest float below 1: (x + 0.5) / 2**64 rounds up to 1.0 for the top ~1000 hashes
_BELOW_ONE = math.nextafter(1.0, 0.0)


def _hash64(text: str) -> int:
    # Not hash(): it is salted per process, and replicas must agree.
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


def _mix(x: int) -> int:
    # splitmix64 finaliser: spreads (key ^ node) over all 64 bits.
    x = (x * 0x9E3779B97F4A7C15) & _M64
    x ^= x >> 31
    x = (x * 0xBF58476D1CE4E5B9) & _M64
    x ^= x >> 27
    x = (x * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


@dataclass(frozen=True, slots=True)
class Node:
    """A backend as placement sees it: a stable id and a finite weight > 0."""

    id: BackendId
    weight: float = 1.0

    @property
    def seed(self) -> int:
        """The node's hash, mixed with each key's hash to score it."""
        return _hash64(self.id)


class Ranking:
    """Weighted rendezvous ranking over a fixed set of nodes."""

    def __init__(self, nodes: Iterable[Node]) -> None:
        self._nodes = tuple(nodes)
        if len({node.id for node in self._nodes}) != len(self._nodes):
            raise ValueError("node ids must be unique")
        if any(not 0 < node.weight < math.inf for node in self._nodes):
            raise ValueError("node weights must be positive and finite")
        self._seeds = tuple((node.id, node.seed, node.weight) for node in self._nodes)
        # With equal weights, -w/ln(U) orders nodes exactly as U does: skip the floats.
        self._uniform = len({node.weight for node in self._nodes}) <= 1

    @property
    def nodes(self) -> tuple[Node, ...]:
        """The ranked nodes, in configuration order."""
        return self._nodes

    def rank(self, key: str) -> list[BackendId]:
        """All node ids, best first, for ``key``."""
        key_hash = _hash64(key)
        if self._uniform:
            scored = sorted(self._seeds, key=lambda s: _mix(key_hash ^ s[1]), reverse=True)
        else:
            scored = sorted(self._seeds, key=lambda s: _score(key_hash, s[1], s[2]), reverse=True)
        return [node_id for node_id, _, _ in scored]


def _score(key_hash: int, seed: int, weight: float) -> float:
    # Weighted HRW, log form (Schindelhauer & Schomaker): -w / ln(U), U in (0, 1).
    u = min((_mix(key_hash ^ seed) + 0.5) / 2.0**64, _BELOW_ONE)
    return -weight / math.log(u)


class Spread:
    """Where new sessions go: the candidate with the least load for its weight.

    A backend's load counts each session this replica knows to be on it once, however
    many times it was placed, resumed or attached:

    * a session attached to it through this replica counts 1 (the caller passes how many
      distinct sessions are attached to each backend);
    * a session that was attached and no longer is (its client left; the agent keeps it
      in memory for a while) counts 1, fading with a half-life of ``half_life`` seconds
      from when it was let go (:meth:`detached`), until it is attached again anywhere
      (:meth:`attached`), or closed (:meth:`released`);
    * a placement whose ``session/new`` has not answered yet counts 1, fading the same
      way, until the session it created attaches (:meth:`created`).

    The attached count alone forgets a session as soon as its client leaves, although
    the agent keeps it (12 one-session clients in a row all landed on one backend); the
    fading count remembers it for a while. Equal loads (a fresh pool) are broken by a
    rendezvous hash of ``salt`` and the number of placements made so far, so equal
    backends alternate and two replicas with different salts do not start on the same
    backend. The shell passes ``now`` (a monotonic clock, in seconds); this class reads
    no clock. Its tables hold one sum per backend (:meth:`forget_backend` drops one that
    left the pool) and at most ``max_sessions`` let-go sessions (the oldest fade out
    first).
    """

    def __init__(
        self, half_life: float, salt: str = "", *, max_sessions: int = defaults.CACHE_MAX_ENTRIES
    ) -> None:
        if not 0 < half_life < math.inf:
            raise ValueError("the half-life must be positive and finite")
        self._half_life = half_life
        self._salt = salt
        self._max_sessions = max_sessions
        self._fading: dict[BackendId, tuple[float, float]] = {}  # backend -> (sum, as of)
        #: sessions let go, each still fading on its backend: session -> (backend, since)
        self._let_go: OrderedDict[SessionId, tuple[BackendId, float]] = OrderedDict()
        self._placements = 0

    def recent(self, backend: BackendId, now: float) -> float:
        """The fading part of ``backend``'s load at ``now``."""
        total, as_of = self._fading.get(backend, (0.0, now))
        return total * self._decay(now - as_of)

    def _decay(self, elapsed: float) -> float:
        decay: float = 0.5 ** (max(elapsed, 0.0) / self._half_life)
        return decay

    def _add(self, backend: BackendId, weight: float, now: float) -> None:
        total = max(self.recent(backend, now) + weight, 0.0)
        self._fading[backend] = (total, now)

    def place(
        self,
        candidates: Sequence[Node],
        attached: Mapping[BackendId, int],
        now: float,
        asked: Asked | None = None,
    ) -> BackendId | None:
        """Choose a backend for one new session (``asked``: what its request says, which
        this rule does not look at) and count it as placed there; None when there is no
        candidate."""
        if not candidates:
            return None
        load = {
            n.id: (attached.get(n.id, 0) + self.recent(n.id, now)) / n.weight for n in candidates
        }
        least = min(load.values())
        tied = [
            n for n in candidates if math.isclose(load[n.id], least, rel_tol=1e-9, abs_tol=1e-12)
        ]
        backend = _first(f"{self._salt}#{self._placements}", tied)
        self._placements += 1
        self._add(backend, 1.0, now)
        return backend

    def created(self, backend: BackendId, now: float) -> None:
        """A placement on ``backend`` created its session, which is attached now and
        counted as such: the placement stops counting."""
        self._add(backend, -1.0, now)

    def attached(self, session_id: SessionId, now: float) -> None:
        """``session_id`` is attached through this replica again: it counts as attached."""
        let_go = self._let_go.pop(session_id, None)
        if let_go is not None:
            backend, since = let_go
            self._add(backend, -self._decay(now - since), now)

    def detached(self, session_id: SessionId, backend: BackendId, now: float) -> None:
        """``session_id`` is no longer attached to ``backend`` anywhere here: it keeps
        counting there, fading from now."""
        self.attached(session_id, now)  # once, wherever it was let go before
        self._let_go[session_id] = (backend, now)
        self._add(backend, 1.0, now)
        while len(self._let_go) > self._max_sessions:
            _, (where, since) = self._let_go.popitem(last=False)
            self._add(where, -self._decay(now - since), now)

    def released(self, session_id: SessionId, now: float) -> None:
        """``session_id`` was closed: it counts nowhere."""
        self.attached(session_id, now)

    def forget_backend(self, backend: BackendId) -> None:
        """``backend`` left the pool: drop what it carried."""
        self._fading.pop(backend, None)
        for session_id in [s for s, (b, _) in self._let_go.items() if b == backend]:
            del self._let_go[session_id]


def _first(key: str, nodes: Sequence[Node]) -> BackendId:
    """The rendezvous winner for ``key`` among ``nodes`` (weights play no part: they tied)."""
    key_hash = _hash64(key)
    return max(nodes, key=lambda n: _mix(key_hash ^ n.seed)).id
