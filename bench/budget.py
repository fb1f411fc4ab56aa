"""What the router keeps, and what an unknown id costs it (issue 17, items 5 and 6).

The router runs in this process, in front of scripted backends (:mod:`bench.scripted`,
one process serving many ports):

* **series after backend swaps**: ``/metrics`` series and the pool's tables after 200
  backends replaced one by one (what DNS discovery with pod addresses does all day),
  against the series with one backend that served a resume;
* **probes per repeated unknown resume**: one client resumes an id no backend knows, 100
  times, through three backends; against the same with the negative memory off
  (``cache.negative_seconds = 0``: every resume a fan-out, and another for the retry
  after the default's ``-32002``), in the same run.
"""

from __future__ import annotations

from bench.fleet import Fleet, Scripted
from bench.in_process import in_process_router, up
from bench.ratios import Budget, Figure, Result, Target
from bench.wire import AcpSocket, resume_params
from router.server.observability.metrics import Metrics

BENCH = "budget"
SWAPS = 200
REPEATS = 100
#: a session no scripted backend has (its owner prefix names none of them)
UNKNOWN = "nobody-here"
FLAT = Target("series after 200 backend swaps <= the series with one backend", 1.0)
ONE_FAN_OUT = Target("probes per repeated unknown resume <= 0.1 (one fan-out in all)", 0.1)


async def run(fleet: Fleet, backends: Scripted, budget: Budget) -> list[Result]:
    return [*await _swaps(fleet, backends), *await _repeats(fleet, backends)]


def _series(metrics: Metrics) -> int:
    return sum(len(family.samples) for family in metrics.registry.collect())


async def _swaps(fleet: Fleet, backends: Scripted) -> list[Result]:
    first = backends.backends(1)
    async with in_process_router(first) as router:
        pool, metrics = router.pool, router.metrics
        async with AcpSocket.connect(fleet.http, router.url) as socket:
            await socket.call("session/resume", resume_params("b0-swapped"))
        baseline = _series(metrics)
        for n in range(1, SWAPS + 1):
            backend_id, backend_url = backends.backends(n + 1)[n]
            settings = pool.settings.model_copy(
                update={"backends": [pool.settings.backends[0].model_copy(
                    update={"id": backend_id, "url": backend_url}
                )]}
            )  # fmt: skip
            pool.set_static(settings)
            await up(pool, 1)
        after = _series(metrics)
        tables = (
            len(pool.fleet.states) + len(pool.directory.spread._fading) + len(pool.prober.seconds)
        )
    return [
        Figure(BENCH, f"/metrics series after {SWAPS} backend swaps / with one backend", after / baseline, "x", FLAT),
        Figure(BENCH, "/metrics series with one backend (before the swaps)", baseline, "series"),
        Figure(BENCH, f"entries in the pool's per-backend tables after {SWAPS} swaps", tables, "entries"),
    ]  # fmt: skip


async def _repeats(fleet: Fleet, backends: Scripted) -> list[Result]:
    results: list[Result] = []
    figures: dict[str, float] = {}
    for label, negative in (("memory on", 5.0), ("memory off", 0.0)):
        memory = {"negative_seconds": negative}
        async with in_process_router(backends.backends(3), cache=memory) as router:
            metrics = router.metrics
            async with AcpSocket.connect(fleet.http, router.url) as socket:
                for _ in range(REPEATS):
                    request_id = await socket.send("session/resume", resume_params(UNKNOWN))
                    reply = await socket.receive()
                    if reply.get("id") != request_id or "error" not in reply:
                        raise RuntimeError(f"expected -32002, got {reply}")
            probes = sum(
                sample.value
                for family in metrics.registry.collect()
                if family.name == "acp_router_probes"
                for sample in family.samples
                if sample.name.endswith("_total")
            )
            figures[label] = probes / REPEATS
    results.append(
        Figure(BENCH, f"probes per repeated unknown resume ({REPEATS} tries, 3 backends)", figures["memory on"], "probes", ONE_FAN_OUT)
    )  # fmt: skip
    results.append(
        Figure(BENCH, "the same with cache.negative_seconds = 0 (before this work: every try fans out)", figures["memory off"], "probes")
    )  # fmt: skip
    return results
