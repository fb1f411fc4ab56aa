"""Locate: ``session/resume`` through a router in front of 1, 10, 100 and 1,000
scripted backends, all served by one process (:mod:`bench.scripted`).

A session's id names the backend it lives on, so no session is ever created and
the router has no hint for one it has not seen. Each resume comes from a fresh
client connection (connect and ``initialize`` untimed; the resume timed from the
request sent to its response read), so it includes opening that connection's link
to the backend: connect, upgrade, the replayed ``initialize``. Per round, in
rotating order:

* cold: sessions the router has never seen: a probe to every backend, then the
  link and the forwarded resume;
* hinted: the sessions resumed cold the round before, which the router's location
  cache holds: one probe to the hinted backend, then the link and the resume;
* the baseline: one ``session/status`` round trip straight to a backend;
* at N=1 also: a resume on a connection whose link is already open (locate plus
  forward, no link opening), and a direct connect + ``initialize`` to the backend
  (the least a link's opening costs): where the time of a fresh resume goes.

Around the cold and hinted phases the bench reads the router's CPU time
(``/proc/<pid>/stat``) and ``acp_router_probes_total`` from its ``/metrics``: probes
per locate, and the router CPU each extra probe costs (cold minus hinted, over
the probes cold sent beyond hinted).
"""

from __future__ import annotations

import contextlib
import itertools
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial

from bench.fleet import Child, Fleet, Scripted
from bench.observe import cpu_seconds, metric_sum
from bench.ratios import Budget, Figure, Result, Target, micro, percentile, rotated, row
from bench.wire import AcpSocket, resume_params

BENCH = "locate"
BASELINE = "session/status direct"
POOLS = (1, 10, 100, 1000)
PROBES = "acp_router_probes_total"
FRESH = Target("resume from a fresh connection <= 5x a direct status round trip (N=1)", 5.0)
#: a fan-out to 1,000 backends on a busy 2-core machine can outlast the default 500 ms
#: probe timeout (every probe then counts as unknown, and the resume fails closed);
#: the bench measures cost, so it gives probes time
PROBE_SETTINGS = {"timeout_ms": 10_000}
COLD_CPU = Target("cold locate at 1,000 backends <= 20 ms of router CPU", 20.0)


def hint_target(pool: int) -> Target:
    return Target(f"a hinted locate sends one probe (N={pool})", 1.0)


@dataclass(frozen=True, slots=True)
class Phase:
    """One timed batch: its median seconds, and (for router phases) CPU and probes."""

    p50: float
    cpu: float = 0.0
    probes: float = 0.0


@dataclass(slots=True)
class Totals:
    """CPU seconds, probes and resumes of one phase kind, summed over the rounds."""

    cpu: float = 0.0
    probes: float = 0.0
    resumes: int = 0


@dataclass(slots=True)
class Pool:
    """What the bench holds for one router: its sockets and running counters."""

    fleet: Fleet
    router: Child
    size: int
    direct: AcpSocket
    warm: AcpSocket
    names: itertools.count[int] = field(default_factory=itertools.count)
    probes: float = 0.0

    def sessions(self, count: int, rng: random.Random) -> list[str]:
        return [f"b{rng.randrange(self.size)}-{next(self.names)}" for _ in range(count)]


def samples_per_round(pool: int, budget: Budget) -> int:
    full = {1: 20, 10: 20, 100: 10, 1000: 4}
    quick = {1: 8, 10: 8, 100: 4, 1000: 2}
    return budget.size(full[pool], quick[pool])


def rounds(pool: int, budget: Budget) -> int:
    """Fewer rounds where each is long (a cold locate at 1,000 backends is ~0.2 s)."""
    return min(budget.rounds, 3 if budget.quick else 9 if pool <= 10 else 6)


async def run(fleet: Fleet, backends: Scripted, budget: Budget) -> list[Result]:
    results: list[Result] = []
    for size in POOLS:
        name, pool = f"router-locate-{size}", backends.backends(size)
        async with fleet.router(name, pool, probe=PROBE_SETTINGS) as router:
            results += await _pool(fleet, router, backends, size, budget)
    return results


async def _pool(
    fleet: Fleet, router: Child, backends: Scripted, size: int, budget: Budget
) -> list[Result]:
    count = samples_per_round(size, budget)
    rng = random.Random(size)
    async with (
        AcpSocket.connect(fleet.http, backends.urls[0]) as direct,
        AcpSocket.connect(fleet.http, router.url) as warm,
    ):
        pool = Pool(fleet, router, size, direct, warm)
        pool.probes = await metric_sum(fleet.http, router.url, PROBES)
        hinted = pool.sessions(count, rng)
        await _fresh(pool, hinted)  # warm-up, untimed: code paths hot, hints in the cache
        if size == 1:
            await _warm(pool, pool.sessions(1, rng))  # opens the warm connection's link
        pairs: dict[str, list[tuple[float, float]]] = {}
        totals = {"cold": Totals(), "hinted": Totals()}
        for index in range(rounds(size, budget)):
            cold = pool.sessions(count, rng)
            phases: dict[str, Callable[[], Awaitable[Phase]]] = {
                "status": partial(_status, pool, count),
                "cold": partial(_fresh, pool, cold),
                "hinted": partial(_fresh, pool, hinted),
            }
            if size == 1:
                phases["warm"] = partial(_warm, pool, pool.sessions(count, rng))
                phases["open"] = partial(_open_direct, pool, backends.urls[0], count)
            timed = {name: await phases[name]() for name in rotated(list(phases), index)}
            for name, phase in timed.items():
                pairs.setdefault(name, []).append((phase.p50, timed["status"].p50))
                if name in totals:
                    totals[name].cpu += phase.cpu
                    totals[name].probes += phase.probes
                    totals[name].resumes += count
            hinted = cold
    return _results(size, pairs, totals)


def _results(
    size: int, pairs: dict[str, list[tuple[float, float]]], totals: dict[str, Totals]
) -> list[Result]:
    measures = {
        "cold": f"resume p50, fresh connection, cold, N={size}",
        "hinted": f"resume p50, fresh connection, hinted, N={size}",
        "warm": "resume p50, connection with its link open, N=1",
        "open": "connect + initialize direct (a link's opening)",
    }
    results: list[Result] = [
        row(
            BENCH,
            measure,
            BASELINE,
            micro(pairs[name]),
            "us",
            FRESH if (name, size) == ("cold", 1) else None,
        )
        for name, measure in measures.items()
        if name in pairs
    ]
    cold, hinted = totals["cold"], totals["hinted"]
    per_cold = cold.probes / cold.resumes
    per_hinted = hinted.probes / hinted.resumes
    results += [
        Figure(BENCH, f"probes per cold locate, N={size}", per_cold, "probes"),
        Figure(
            BENCH, f"probes per hinted locate, N={size}", per_hinted, "probes", hint_target(size)
        ),
        Figure(
            BENCH,
            f"router CPU per fresh-connection resume, hinted, N={size}",
            hinted.cpu / hinted.resumes * 1e3,
            "ms",
        ),
    ]
    extra = per_cold - per_hinted
    if extra >= 1:
        per_probe = (cold.cpu / cold.resumes - hinted.cpu / hinted.resumes) / extra
        results += [
            Figure(BENCH, f"router CPU per probe, N={size}", per_probe * 1e6, "us"),
            Figure(
                BENCH,
                f"router CPU per cold locate (per probe x probes), N={size}",
                per_probe * per_cold * 1e3,
                "ms",
                COLD_CPU if size == 1000 else None,
            ),
        ]
    return results


async def _status(pool: Pool, count: int) -> Phase:
    samples = []
    params = {"sessionId": "b0-status"}
    for _ in range(count):
        started = time.perf_counter()
        await pool.direct.call("session/status", params)
        samples.append(time.perf_counter() - started)
    return Phase(percentile(samples, 50))


async def _fresh(pool: Pool, sessions: list[str]) -> Phase:
    """Each session resumed from a new connection; the connections close after."""
    cpu = cpu_seconds(pool.router.pid)
    samples = []
    async with contextlib.AsyncExitStack() as stack:
        for session_id in sessions:
            socket = await stack.enter_async_context(
                AcpSocket.connect(pool.fleet.http, pool.router.url)
            )
            started = time.perf_counter()
            await socket.call("session/resume", resume_params(session_id))
            samples.append(time.perf_counter() - started)
        cpu = cpu_seconds(pool.router.pid) - cpu
    probes = await metric_sum(pool.fleet.http, pool.router.url, PROBES)
    sent, pool.probes = probes - pool.probes, probes
    return Phase(percentile(samples, 50), cpu, sent)


async def _warm(pool: Pool, sessions: list[str]) -> Phase:
    samples = []
    for session_id in sessions:
        started = time.perf_counter()
        await pool.warm.call("session/resume", resume_params(session_id))
        samples.append(time.perf_counter() - started)
    pool.probes = await metric_sum(pool.fleet.http, pool.router.url, PROBES)  # not counted
    return Phase(percentile(samples, 50))


async def _open_direct(pool: Pool, url: str, count: int) -> Phase:
    samples = []
    for _ in range(count):
        started = time.perf_counter()
        async with AcpSocket.connect(pool.fleet.http, url):
            samples.append(time.perf_counter() - started)
    return Phase(percentile(samples, 50))
