"""Ratios against a baseline measured in the same run, round by round.

A benchmark runs its baseline and its subject(s) in alternating order, several
rounds, and hands each round's pair of figures (subject, baseline) to :func:`row`.
A :class:`Row` keeps the per-round ratios; its headline is their median, and the
spread is their minimum and maximum. The raw medians ride along for the JSON file
only: on a shared, noisy machine an absolute figure says little on its own.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

T = TypeVar("T")
N = TypeVar("N", int, float)


@dataclass(frozen=True, slots=True)
class Budget:
    """How long a run may take: rounds, and full or quick batch sizes."""

    rounds: int
    quick: bool = False

    def size(self, full: N, quick: N) -> N:
        return quick if self.quick else full


@dataclass(frozen=True, slots=True)
class Target:
    """A bound from an issue (12, 17, 19) that a figure is held to: ``value <= limit`` (or ``>=``)."""

    text: str
    limit: float
    at_most: bool = True

    def holds(self, value: float) -> bool:
        return value <= self.limit if self.at_most else value >= self.limit

    def verdict(self, value: float) -> str:
        """ "holds" or "misses", and by how much (value / limit)."""
        word = "holds" if self.holds(value) else "misses"
        return f"{word} ({value / self.limit:.2f}x the bound)" if self.limit else word

    def to_json(self) -> dict[str, Any]:
        return {"text": self.text, "limit": self.limit, "at_most": self.at_most}


@dataclass(frozen=True, slots=True)
class Row:
    bench: str
    measure: str
    baseline: str
    #: subject / baseline, one per round
    ratios: tuple[float, ...]
    #: medians over rounds of the raw figures, in ``unit`` (context only)
    subject_median: float
    baseline_median: float
    unit: str
    target: Target | None = None

    @property
    def median(self) -> float:
        return statistics.median(self.ratios)

    @property
    def low(self) -> float:
        return min(self.ratios)

    @property
    def high(self) -> float:
        return max(self.ratios)

    def to_json(self) -> dict[str, Any]:
        return {
            "bench": self.bench,
            "measure": self.measure,
            "baseline": self.baseline,
            "ratio_median": self.median,
            "ratio_min": self.low,
            "ratio_max": self.high,
            "ratios": list(self.ratios),
            "subject_median": self.subject_median,
            "baseline_median": self.baseline_median,
            "unit": self.unit,
            "target": self.target.to_json() if self.target else None,
        }


@dataclass(frozen=True, slots=True)
class Figure:
    """A quantity with no baseline to divide by (a count, a size, CPU time), from this run."""

    bench: str
    measure: str
    value: float
    unit: str
    target: Target | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "bench": self.bench,
            "measure": self.measure,
            "value": self.value,
            "unit": self.unit,
            "target": self.target.to_json() if self.target else None,
        }


Result = Row | Figure


def row(
    bench: str,
    measure: str,
    baseline: str,
    pairs: Sequence[tuple[float, float]],
    unit: str,
    target: Target | None = None,
) -> Row:
    """A row from one ``(subject, baseline)`` pair per round."""
    return Row(
        bench,
        measure,
        baseline,
        tuple(subject / base for subject, base in pairs),
        statistics.median(subject for subject, _ in pairs),
        statistics.median(base for _, base in pairs),
        unit,
        target,
    )


def micro(pairs: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """Pairs of seconds as pairs of microseconds."""
    return [(subject * 1e6, base * 1e6) for subject, base in pairs]


def rotated(items: Sequence[T], round_index: int) -> list[T]:
    """``items`` starting at a different one each round (two items simply alternate)."""
    k = round_index % len(items)
    return [*items[k:], *items[:k]]


def shuffled(items: Sequence[T], round_index: int) -> list[T]:
    """``items`` in an order drawn for the round (the same for the same round): unlike
    :func:`rotated`, which keeps the cycle, each item follows a different one from round
    to round, so what one side leaves behind (a busy core, a cold cache) does not always
    land on the same next side."""
    order = list(items)
    random.Random(round_index).shuffle(order)
    return order


def percentile(samples: Sequence[float], q: float) -> float:
    """Nearest-rank percentile, ``q`` in (0, 100]."""
    ordered = sorted(samples)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]
