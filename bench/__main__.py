"""``python -m bench``: every benchmark, as ratios against same-run baselines.

In-process benchmarks (envelope, placement) run first; then three reference agents
and two router subprocesses start (one router in front of agent-1 alone for
forwarding, one in front of all three for locate) and the wire benchmarks run.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Sequence
from pathlib import Path

from bench import envelope, forwarding, locate, placement
from bench.fleet import start_fleet
from bench.ratios import Budget, Row
from bench.report import table, write_json

BENCHES = ("envelope", "placement", "forwarding", "locate")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="smaller batches, 5 rounds (~20 s)")
    parser.add_argument("--rounds", type=int, metavar="N", help="interleaved rounds (default 9)")
    parser.add_argument("--only", choices=BENCHES, action="append", help="run only these")
    parser.add_argument("--json", type=Path, metavar="FILE", help="also write results here")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    rounds = args.rounds or (5 if args.quick else 9)
    if rounds < 1:
        raise SystemExit("--rounds must be at least 1")
    budget = Budget(rounds, args.quick)
    chosen = set(args.only or BENCHES)
    started = time.perf_counter()
    rows = _in_process(chosen, budget) + asyncio.run(_on_the_wire(chosen, budget))
    seconds = time.perf_counter() - started
    print(table(rows, budget, seconds))
    if args.json is not None:
        write_json(args.json, rows, budget, seconds)
    return 0


def _in_process(chosen: set[str], budget: Budget) -> list[Row]:
    rows = []
    if "envelope" in chosen:
        rows += envelope.run(budget)
    if "placement" in chosen:
        rows += placement.run(budget)
    return rows


async def _on_the_wire(chosen: set[str], budget: Budget) -> list[Row]:
    if not chosen & {"forwarding", "locate"}:
        return []
    rows = []
    async with start_fleet(3) as fleet:
        agent = fleet.agents[0]
        if "forwarding" in chosen:
            async with fleet.router("router-forwarding", [agent]) as router:
                rows += await forwarding.run(fleet, agent, router, budget)
        if "locate" in chosen:
            async with fleet.router("router-locate", fleet.agents) as router:
                rows += await locate.run(fleet, router, budget)
    return rows


if __name__ == "__main__":
    raise SystemExit(main())
