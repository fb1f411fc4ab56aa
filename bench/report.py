"""The results: a plain-text table for people, a JSON file for tools."""

from __future__ import annotations

import json
import os
import platform
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.ratios import Budget, Row

HEADER = ("bench", "measure", "baseline", "ratio", "spread (min-max)")


def table(rows: Sequence[Row], budget: Budget, seconds: float) -> str:
    cells = [HEADER, *(_cells(r) for r in rows)]
    widths = [max(len(line[i]) for line in cells) for i in range(len(HEADER))]
    lines = [
        "  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True))
        for line in cells
    ]
    lines.insert(1, "  ".join("-" * width for width in widths))
    title = (
        f"acp-router bench: subject/baseline, median of {budget.rounds} interleaved rounds"
        f" ({'quick' if budget.quick else 'full'}, {_machine()}, {seconds:.0f} s)"
    )
    legend = (
        "ratio = subject / baseline, median over rounds: a time above 1x is slower than"
        " the baseline; a rate (/s) below 1x is."
    )
    return "\n".join([title, "", *(line.rstrip() for line in lines), "", legend])


def _cells(r: Row) -> tuple[str, str, str, str, str]:
    return (r.bench, r.measure, r.baseline, f"{r.median:.2f}x", f"{r.low:.2f}-{r.high:.2f}")


def _machine() -> str:
    return f"Python {platform.python_version()}, {os.cpu_count()} CPUs"


def write_json(path: Path, rows: Sequence[Row], budget: Budget, seconds: float) -> None:
    document: dict[str, Any] = {
        "rounds": budget.rounds,
        "quick": budget.quick,
        "seconds": seconds,
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "results": [r.to_json() for r in rows],
    }
    path.write_text(json.dumps(document, indent=2) + "\n")
