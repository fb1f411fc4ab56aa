"""Placement: :meth:`router.core.placement.Ranking.rank` for N backends, in process.

The baseline is the one hash every ranking starts with, ``blake2b`` of the session
id (8-byte digest), so the ratio is the cost of scoring and sorting N backends in
units of one key hash: it should grow linearly-ish with N.
"""

from __future__ import annotations

import hashlib
from functools import partial

from bench.ratios import Budget, Row, micro, row
from bench.timing import interleaved
from router.core.placement import Node, Ranking
from router.protocol.ids import BackendId

BENCH = "placement"
BASELINE = "blake2b(key)"
SIZES = (3, 10, 100)
#: session ids cycled through by every timing
KEYS = [f"sess_{hashlib.sha256(str(n).encode()).hexdigest()[:32]}" for n in range(64)]


def _rank_all(ranking: Ranking) -> None:
    for key in KEYS:
        ranking.rank(key)


def _hash_all() -> None:
    for key in KEYS:
        hashlib.blake2b(key.encode(), digest_size=8).digest()


def run(budget: Budget) -> list[Row]:
    target = budget.size(0.02, 0.008)
    rows = []
    for n in SIZES:
        ranking = Ranking(Node(BackendId(f"agent-{i}")) for i in range(1, n + 1))
        pairs = interleaved(partial(_rank_all, ranking), _hash_all, budget.rounds, target)
        per_key = micro([(s / len(KEYS), b / len(KEYS)) for s, b in pairs])
        rows.append(row(BENCH, f"Ranking.rank, N={n}", BASELINE, per_key, "us"))
    return rows
