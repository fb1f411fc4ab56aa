"""``python -m bench``: every benchmark, as ratios against same-run baselines.

In-process benchmarks (envelope, placement) run first; then the wire benchmarks
start their processes: a reference agent, the bare forwarder, HAProxy (when
installed) and a router in front of the agent for forwarding; one process serving
1,000 scripted backends, and routers in front of 1 to 1,000 of them, for locate,
memory and the storm.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from bench import (
    budget as budget_bench,
    envelope,
    forwarding,
    hop,
    hostile,
    locate,
    memory,
    placement,
    restart,
    storm,
    workers,
)
from bench.fleet import start_fleet
from bench.observe import raise_open_files
from bench.ratios import Budget, Result
from bench.report import table, write_json

BENCHES = (
    "envelope",
    "placement",
    "hostile",
    "hop",
    "forwarding",
    "locate",
    "memory",
    "storm",
    "restart",
    "budget",
    "workers",
)
SCRIPTED = {
    "hop": 1,
    "locate": max(locate.POOLS),
    "memory": 1,
    "storm": storm.BACKENDS,
    "restart": restart.BACKENDS,
    "budget": budget_bench.SWAPS + 1,
    "workers": 1,
}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="smaller batches, 5 rounds (~1 min)")
    parser.add_argument("--rounds", type=int, metavar="N", help="interleaved rounds (default 9)")
    parser.add_argument("--only", choices=BENCHES, action="append", help="run only these")
    parser.add_argument("--json", type=Path, metavar="FILE", help="also write results here")
    parser.add_argument(
        "--profile",
        type=Path,
        metavar="DIR",
        help="run each router under pyinstrument (on its Python sources) and save its profile in DIR"
        " (render one with: pyinstrument --load DIR/router-....pyisession)",
    )
    parser.add_argument(
        "--before",
        type=Path,
        action="append",
        default=[],
        metavar="DIR",
        help="also run the hop and memory benches against the router package in DIR"
        " (e.g. `git archive COMMIT router | tar -x -C DIR`), in the same rounds; repeatable",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    rounds = args.rounds or (5 if args.quick else 9)
    if rounds < 1:
        raise SystemExit("--rounds must be at least 1")
    budget = Budget(rounds, args.quick)
    chosen = set(args.only or BENCHES)
    notes: list[str] = []
    raise_open_files()
    started = time.perf_counter()
    if args.profile is not None:
        args.profile.mkdir(parents=True, exist_ok=True)
        notes.append(f"routers ran under pyinstrument (profiles in {args.profile}): slower")
    wire = _on_the_wire(chosen, budget, notes, args.profile, args.before)
    results = _in_process(chosen, budget) + asyncio.run(wire)
    seconds = time.perf_counter() - started
    print(table(results, budget, seconds, notes))
    if args.json is not None:
        write_json(args.json, results, budget, seconds, notes)
    return 0


def _in_process(chosen: set[str], budget: Budget) -> list[Result]:
    results: list[Result] = []
    if "envelope" in chosen:
        with _progress("envelope"):
            results += envelope.run(budget)
    if "placement" in chosen:
        with _progress("placement"):
            results += placement.run(budget)
    if "hostile" in chosen:
        with _progress("hostile"):
            results += asyncio.run(hostile.run(budget))
    return results


async def _on_the_wire(
    chosen: set[str],
    budget: Budget,
    notes: list[str],
    profile: Path | None,
    before: list[Path],
) -> list[Result]:
    results: list[Result] = []
    async with start_fleet(1 if "forwarding" in chosen else 0, profile) as fleet:
        if "forwarding" in chosen:
            agent = fleet.agents[0]
            with _progress("forwarding"):
                # compression on, for the deflate client; a plain client never negotiates it
                on = {"compression": True}
                async with fleet.router("router-forwarding", [agent.backend], router=on) as router:
                    results += await forwarding.run(fleet, agent, router, budget, notes)
        scripted = max((SCRIPTED[name] for name in chosen if name in SCRIPTED), default=0)
        if scripted:
            async with fleet.scripted(scripted) as backends:
                if "hop" in chosen:
                    with _progress("hop"):
                        results += await hop.run(fleet, backends, budget, notes, before)
                if "locate" in chosen:
                    with _progress("locate"):
                        results += await locate.run(fleet, backends, budget)
                if "storm" in chosen:
                    with _progress("storm"):
                        results += await storm.run(fleet, backends, budget)
                if "budget" in chosen:
                    with _progress("budget"):
                        results += await budget_bench.run(fleet, backends, budget)
                if "restart" in chosen:
                    with _progress("restart"):
                        results += await restart.run(fleet, backends, budget)
                if "memory" in chosen:
                    with _progress("memory"):
                        results += await memory.run(fleet, backends, budget, notes, before)
                if "workers" in chosen:
                    with _progress("workers"):
                        results += await workers.run(fleet, backends, budget)
    return results


@contextlib.contextmanager
def _progress(name: str) -> Iterator[None]:
    """One line on stderr per bench, so a long run shows where it is."""
    started = time.perf_counter()
    print(f"bench: {name} ...", file=sys.stderr, flush=True)
    yield
    print(f"bench: {name} done in {time.perf_counter() - started:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    raise SystemExit(main())
