"""Memory: the router's resident memory per idle client connection, at 1,000 and
10,000 connections, with and without permessage-deflate.

Each connection initializes and resumes one session (on one scripted backend), so
it holds its backend link as well, then idles (a reader answers pings). The figure
is the router's RSS growth (``/proc/<pid>/status``) from ``WARM`` connections to N,
divided by the connections added: what one more idle client costs, the link
included. Clients always offer compression; the router's ``router.compression``
decides whether it is used.

10,000 connections hold about 20,000 sockets in the router (client side and link)
and 10,000 in this process: the bench raises RLIMIT_NOFILE (children inherit it).
"""

from __future__ import annotations

import resource

from bench.clients import Crowd
from bench.fleet import Fleet, Scripted
from bench.locate import PROBE_SETTINGS
from bench.observe import rss_bytes
from bench.ratios import Budget, Figure, Result, Target

BENCH = "memory"
WARM = 100
TARGET = Target("idle client connection <= 32 KiB RSS, link included, at 10,000", 32.0)


#: file descriptors a router needs besides two per connection (listener, control links, ...)
SPARE_FILES = 200


def largest(open_files: int) -> int:
    """10,000, or as many connections as the router's open-file limit allows (two each)."""
    return min(10_000, (open_files - SPARE_FILES) // 2)


async def run(fleet: Fleet, backends: Scripted, budget: Budget, notes: list[str]) -> list[Result]:
    most = largest(resource.getrlimit(resource.RLIMIT_NOFILE)[0])
    if most < 10_000 and not budget.quick:
        notes.append(
            f"memory: {most:,} connections, not 10,000: the router holds two sockets per"
            f" connection and RLIMIT_NOFILE is {resource.getrlimit(resource.RLIMIT_NOFILE)[0]:,}"
            " here (its hard limit could not be raised: no CAP_SYS_RESOURCE)"
        )
    sizes = (500,) if budget.quick else (1000, most)
    results: list[Result] = []
    for compression in (True, False):
        name = f"router-memory-{'deflate' if compression else 'plain'}"
        options: dict[str, bool | int] = {
            "compression": compression,
            "max_connections": sizes[-1] + WARM + 100,
            "max_connections_per_address": sizes[-1] + WARM + 100,  # all from 127.0.0.1
        }
        pool = backends.backends(1)
        async with fleet.router(name, pool, router=options, probe=PROBE_SETTINGS) as router:
            crowd = Crowd(fleet.http, compress=True)
            try:
                await crowd.grow(WARM, router.url, _session)
                base = rss_bytes(router.pid)
                for size in sizes:
                    await crowd.grow(size - len(crowd.sockets), router.url, _session)
                    per = (rss_bytes(router.pid) - base) / (size - WARM) / 1024
                    label = "compression on" if compression else "compression off (default)"
                    target = TARGET if size > 1000 and not compression else None  # not --quick
                    measure = f"RSS per idle connection, {size:,} connections, {label}"
                    results.append(Figure(BENCH, measure, per, "KiB", target))
            finally:
                await crowd.close()
    return results


def _session(n: int) -> str:
    return f"b0-idle-{n % 100}"
