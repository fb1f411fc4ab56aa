"""A reconnect storm: 1,000 clients at once resuming 100 sessions on 10 backends.

Every client connects, initializes and resumes its session (ten clients per
session); the figure is the time until all of them have been answered, against the
same storm straight at the backends (each client to its session's backend), in
rotating order per round. Through the router every round's sessions are new to
it, so each is located cold: single-flight should hold the probes near one fan-out
per session (100 x 10), plus one hinted probe per later client.
"""

from __future__ import annotations

import statistics

from bench.clients import storm
from bench.fleet import Fleet, Scripted
from bench.locate import PROBE_SETTINGS
from bench.observe import metric_sum
from bench.ratios import Budget, Figure, Result, rotated, row
from bench.scripted import owner

BENCH = "storm"
CLIENTS, SESSIONS, BACKENDS = 1000, 100, 10
PROBES = "acp_router_probes_total"


async def run(fleet: Fleet, backends: Scripted, budget: Budget) -> list[Result]:
    rounds = budget.size(3, 1)
    pairs: list[tuple[float, float]] = []
    probes: list[float] = []
    room = {"max_connections_per_address": 2 * CLIENTS}  # every client is 127.0.0.1
    pool = backends.backends(BACKENDS)
    async with fleet.router("router-storm", pool, router=room, probe=PROBE_SETTINGS) as router:
        for index in range(rounds):
            sessions = [f"b{n % BACKENDS}-storm{index}-{n}" for n in range(SESSIONS)]
            clients = [sessions[n % SESSIONS] for n in range(CLIENTS)]
            timed: dict[str, float] = {}
            for side in rotated(["router", "direct"], index):
                if side == "router":
                    before = await metric_sum(fleet.http, router.url, PROBES)
                    timed[side] = await storm(fleet.http, [(router.url, s) for s in clients])
                    probes.append(await metric_sum(fleet.http, router.url, PROBES) - before)
                else:
                    direct = [(backends.urls[int(owner(s)[1:])], s) for s in clients]
                    timed[side] = await storm(fleet.http, direct)
            pairs.append((timed["router"] * 1e3, timed["direct"] * 1e3))
    measure = f"{CLIENTS:,} clients resume {SESSIONS} sessions on {BACKENDS} backends: all answered"
    return [
        row(BENCH, measure, "the same storm straight at the backends", pairs, "ms"),
        Figure(
            BENCH,
            "probes sent per storm (one fan-out per session would be 1,000)",
            statistics.median(probes),
            "probes",
        ),
    ]
