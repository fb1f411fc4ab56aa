"""A reconnect storm against a fresh replica at 1,000 backends: what a rolling deploy
costs the new replica, in probes per resume, with hinted session ids
(``router.hinted_ids``) and without them, in the same run.

Each round starts two fresh routers in front of the same 1,000 scripted backends, one
with hinted ids and one without, and throws the same storm at each (1,000 clients
resuming 100 sessions spread over the pool, all at once). Without hints every session
is located cold: a fan-out over the whole pool each. With them the id names the home: one
probe each, and the split-brain audit asks the rest off the request path within its
budget (one probe per trusted resume, and ``cache.audit_probes_per_second``), counted
here for as long as the storm lasts.
"""

from __future__ import annotations

import statistics

from bench.clients import storm
from bench.fleet import Fleet, Scripted
from bench.locate import PROBE_SETTINGS
from bench.observe import metric_sum
from bench.ratios import Budget, Figure, Result, Target, rotated, row
from router.core.hinted_ids import hinted

BENCH = "restart"
CLIENTS, SESSIONS, BACKENDS = 1000, 100, 1000
PROBES = "acp_router_probes_total"
HINTED, COLD = "hinted ids", "plain ids"
FLAT = Target("storm against a fresh replica at N=1,000: <= 2 probes per resume", 2.0)


async def run(fleet: Fleet, backends: Scripted, budget: Budget) -> list[Result]:
    rounds = budget.size(2, 1)
    room = {"max_connections_per_address": 2 * CLIENTS, "max_connections": 4 * CLIENTS}
    pool = backends.backends(BACKENDS)
    per_resume: dict[str, list[float]] = {HINTED: [], COLD: []}
    seconds: dict[str, list[float]] = {HINTED: [], COLD: []}
    for index in range(rounds):
        # sessions spread over the pool, each known to its backend by its id's prefix
        sessions = [f"b{(n * 7919) % BACKENDS}-restart{index}-{n}" for n in range(SESSIONS)]
        for side in rotated([HINTED, COLD], index):
            settings = {**room, "hinted_ids": side == HINTED}
            name = f"router-restart-{index}-{'hinted' if side == HINTED else 'cold'}"
            async with fleet.router(name, pool, router=settings, probe=PROBE_SETTINGS) as fresh:
                ids = [hinted(s, s.partition("-")[0]) if side == HINTED else s for s in sessions]
                clients = [(fresh.url, ids[n % SESSIONS]) for n in range(CLIENTS)]
                before = await metric_sum(fleet.http, fresh.url, PROBES)
                seconds[side].append(await storm(fleet.http, clients) * 1e3)
                spent = await metric_sum(fleet.http, fresh.url, PROBES) - before
                per_resume[side].append(spent / CLIENTS)
    measure = f"{CLIENTS:,} clients resume {SESSIONS} sessions on a fresh replica, N={BACKENDS:,}"
    pairs = list(zip(seconds[HINTED], seconds[COLD], strict=True))
    return [
        row(BENCH, f"{measure}: all answered (hinted ids)", "the same with plain ids", pairs, "ms"),
        Figure(
            BENCH,
            "probes per resume, hinted ids (the hint, and the audit within its budget)",
            statistics.median(per_resume[HINTED]),
            "probes",
            FLAT,
        ),
        Figure(
            BENCH,
            "probes per resume, plain ids (a fan-out per session, shared by its clients)",
            statistics.median(per_resume[COLD]),
            "probes",
        ),
    ]
