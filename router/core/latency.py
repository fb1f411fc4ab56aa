"""Smoothing probe latencies: an exponentially weighted moving average (sans-I/O).

The admin API shows a backend's last probe time and this average, so one slow answer
stands out against the usual without hiding it."""

from __future__ import annotations

#: the weight of the newest sample (0.2: about the last ten samples count)
WEIGHT = 0.2


def smoothed(previous: float | None, sample: float, weight: float = WEIGHT) -> float:
    """The average after ``sample``; the first sample is taken as it is."""
    if not 0.0 < weight <= 1.0:
        raise ValueError(f"weight must be in (0, 1], not {weight}")
    if previous is None:
        return sample
    return previous + weight * (sample - previous)
