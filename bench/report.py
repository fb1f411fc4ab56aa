"""The results: a plain-text report for people, a JSON file for tools."""

from __future__ import annotations

import json
import os
import platform
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.ratios import Budget, Figure, Result, Row
from router.server.loops import default_event_loop

RATIO_HEADER = ("bench", "measure", "baseline", "ratio", "spread (min-max)", "subject/baseline")
FIGURE_HEADER = ("bench", "measure", "value")
TARGET_HEADER = ("target (issues 12, 17, 19, 27, 35)", "measured", "verdict")


def table(results: Sequence[Result], budget: Budget, seconds: float, notes: Sequence[str]) -> str:
    rows = [r for r in results if isinstance(r, Row)]
    figures = [f for f in results if isinstance(f, Figure)]
    title = (
        f"acp-router bench: subject/baseline, median of {budget.rounds} interleaved rounds"
        f" ({'quick' if budget.quick else 'full'}, {machine()}, {seconds:.0f} s)"
    )
    legend = (
        "ratio = subject / baseline, median over rounds: a time above 1x is slower than"
        " the baseline; a rate (/s) below 1x is. subject/baseline: medians of the raw figures."
    )
    parts = [title, ""]
    if rows:
        parts += [*_grid(RATIO_HEADER, [_ratio_cells(r) for r in rows]), "", legend, ""]
    if figures:
        parts += [*_grid(FIGURE_HEADER, [_figure_cells(f) for f in figures]), ""]
    targets = [_target_cells(r) for r in results if r.target is not None]
    if targets:
        parts += [*_grid(TARGET_HEADER, targets), ""]
    parts += [f"note: {note}" for note in notes]
    return "\n".join(parts).rstrip() + "\n"


def _grid(header: tuple[str, ...], body: list[tuple[str, ...]]) -> list[str]:
    cells = [header, *body]
    widths = [max(len(line[i]) for line in cells) for i in range(len(header))]
    lines = [
        "  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip()
        for line in cells
    ]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return lines


def _number(value: float) -> str:
    if value >= 100:
        return f"{value:,.0f}"
    return f"{value:.3g}"


def _ratio_cells(r: Row) -> tuple[str, ...]:
    raw = f"{_number(r.subject_median)} / {_number(r.baseline_median)} {r.unit}"
    return (r.bench, r.measure, r.baseline, f"{r.median:.2f}x", f"{r.low:.2f}-{r.high:.2f}", raw)


def _figure_cells(f: Figure) -> tuple[str, ...]:
    return (f.bench, f.measure, f"{_number(f.value)} {f.unit}")


def _target_cells(r: Result) -> tuple[str, ...]:
    assert r.target is not None
    if isinstance(r, Row):
        value, shown = r.median, f"{r.median:.2f}x"
    else:
        value, shown = r.value, f"{_number(r.value)} {r.unit}"
    return (r.target.text, shown, r.target.verdict(value))


def machine() -> str:
    return (
        f"Python {platform.python_version()}, routers on {default_event_loop()},"
        f" {os.cpu_count()} CPUs, {_cpu_model()}"
    )


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def write_json(
    path: Path, results: Sequence[Result], budget: Budget, seconds: float, notes: Sequence[str]
) -> None:
    document: dict[str, Any] = {
        "rounds": budget.rounds,
        "quick": budget.quick,
        "seconds": seconds,
        "python": platform.python_version(),
        "event_loop": default_event_loop(),
        "cpus": os.cpu_count(),
        "cpu_model": _cpu_model(),
        "results": [r.to_json() for r in results],
        "notes": list(notes),
    }
    path.write_text(json.dumps(document, indent=2) + "\n")
