"""In-process timings with :mod:`timeit`, a subject against a baseline, interleaved.

Both callables get the same repetition count, calibrated once so the slower of the
two takes about ``target`` seconds. Each round times them alternately ``repeat``
times and keeps each one's best (timeit's advice: slower timings are other
processes getting in the way, not the code), so a round's ratio is best vs. best.
"""

from __future__ import annotations

import timeit
from collections.abc import Callable

from bench.ratios import rotated

Work = Callable[[], object]


def calibrate(work: Work, target: float) -> int:
    """Repetitions of ``work`` that take about ``target`` seconds."""
    number = 1
    while True:
        took = timeit.timeit(work, number=number)
        if took >= target / 8:
            return max(1, round(number * target / took))
        number *= 4


def per_call(work: Work, number: int) -> float:
    return timeit.timeit(work, number=number) / number


def interleaved(
    subject: Work, baseline: Work, rounds: int, target: float, repeat: int = 3
) -> list[tuple[float, float]]:
    """``(subject, baseline)`` best seconds per call, one pair per round."""
    number = min(calibrate(subject, target), calibrate(baseline, target))
    pairs = []
    for index in range(rounds):
        best = {"subject": float("inf"), "baseline": float("inf")}
        for turn in range(repeat):
            for name in rotated(["subject", "baseline"], index + turn):
                work = subject if name == "subject" else baseline
                best[name] = min(best[name], per_call(work, number))
        pairs.append((best["subject"], best["baseline"]))
    return pairs
