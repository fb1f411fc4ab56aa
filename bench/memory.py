"""Memory: the router's resident memory per idle client connection, at 3,000 and
10,000 connections, with and without permessage-deflate.

Each connection initializes and resumes one session (on one scripted backend), so
it holds its backend link as well, then idles (a reader answers pings). The figure
is the router's RSS growth (``/proc/<pid>/status``) from ``WARM`` connections to N,
divided by the connections added: what one more idle client costs, the link
included. Clients always offer compression; the router's ``router.compression``
decides whether it is used.

10,000 connections hold about 20,000 sockets in the router (client side and link)
and 10,000 in this process: the bench raises RLIMIT_NOFILE (children inherit it).
With ``--before DIR`` (repeatable) a router run from the package in DIR (an older
commit) is measured the same way, compression off, in the same run.
"""

from __future__ import annotations

import resource
from collections.abc import Sequence
from pathlib import Path

from bench.clients import Crowd
from bench.fleet import Fleet, Scripted
from bench.hop import before_name
from bench.locate import PROBE_SETTINGS
from bench.observe import rss_bytes
from bench.ratios import Budget, Figure, Result, Target
from router.server.door.accepting import FD_REFUSE_FRACTION

BENCH = "memory"
WARM = 100
TARGET = Target("idle client connection <= 16 KiB RSS, link included, at 3,000 and 10,000", 16.0)


#: file descriptors a router needs besides two per connection (listener, control links, ...)
SPARE_FILES = 200


def largest(open_files: int) -> int:
    """10,000, or as many connections as the router's open-file limit allows: two
    descriptors each, below the share of the limit where it refuses new clients."""
    return min(10_000, (int(open_files * FD_REFUSE_FRACTION) - SPARE_FILES) // 2)


async def run(
    fleet: Fleet,
    backends: Scripted,
    budget: Budget,
    notes: list[str],
    before: Sequence[Path] = (),
) -> list[Result]:
    most = largest(resource.getrlimit(resource.RLIMIT_NOFILE)[0])
    if most < 10_000 and not budget.quick:
        notes.append(
            f"memory: {most:,} connections, not 10,000: the router holds two sockets per"
            f" connection, refuses clients past {FD_REFUSE_FRACTION:.0%} of RLIMIT_NOFILE, and"
            f" that is {resource.getrlimit(resource.RLIMIT_NOFILE)[0]:,} here (its hard limit"
            " could not be raised)"
        )
    sizes = (500,) if budget.quick else (3000, most)
    results: list[Result] = []
    runs: list[tuple[bool, Path | None]] = [(True, None), (False, None)]
    runs += [(False, source) for source in before]
    for compression, source in runs:
        name = f"router-memory-{'deflate' if compression else 'plain'}"
        name += "" if source is None else f"-{source.name}"
        options: dict[str, bool | int] = {
            "compression": compression,
            "max_connections": sizes[-1] + WARM + 100,
            "max_connections_per_address": sizes[-1] + WARM + 100,  # all from 127.0.0.1
            "locates_per_minute_per_address": 1_000_000,  # every resume is a locate
        }
        pool = backends.backends(1)
        starting = fleet.router(name, pool, source=source, router=options, probe=PROBE_SETTINGS)
        async with starting as router:
            crowd = Crowd(fleet.http, compress=True)
            try:
                await crowd.grow(WARM, router.url, _session)
                base = rss_bytes(router.pid)
                for size in sizes:
                    await crowd.grow(size - len(crowd.sockets), router.url, _session)
                    per = (rss_bytes(router.pid) - base) / (size - WARM) / 1024
                    label = "compression on" if compression else "compression off (default)"
                    if source is not None:
                        label += f", {before_name(source)}"
                    # not --quick, and not the router before
                    target = TARGET if size >= 3000 and not compression and not source else None
                    measure = f"RSS per idle connection, {size:,} connections, {label}"
                    results.append(Figure(BENCH, measure, per, "KiB", target))
            finally:
                await crowd.close()
    return results


def _session(n: int) -> str:
    return f"b0-idle-{n % 100}"
