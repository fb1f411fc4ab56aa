"""Everything behind the front door that a client connection uses: the pool, its
locator (with the split-brain audit), its pool-wide queries, its healer (stale copies
closed, returning backends fenced) and the tracer its requests' spans come from; run together for the application's life."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass

import aiohttp

from router.server.config import Settings
from router.server.observability.metrics import Metrics
from router.server.observability.tracing import Tracer
from router.server.pool.backends import Pool
from router.server.pool.healing import Healer
from router.server.pool.locator import Locator
from router.server.pool.queries import Queries
from router.server.pool.sweep import Sweep
from router.server.pool.whereabouts import Whereabouts


@dataclass(frozen=True, slots=True)
class Upstream:
    pool: Pool
    #: where this replica believes sessions are
    where: Whereabouts
    locator: Locator
    queries: Queries
    healer: Healer
    #: the check of attached sessions, every heartbeat
    sweep: Sweep
    #: where the spans of the requests it traces come from (router.tracing)
    tracer: Tracer

    @classmethod
    def of(
        cls,
        settings: Settings,
        metrics: Metrics,
        http: aiohttp.ClientSession,
        tracer: Tracer,
    ) -> Upstream:
        pool = Pool(settings, metrics, http)
        where = Whereabouts(pool)
        healer = Healer(pool)
        locator, sweep = Locator(where, healer), Sweep(pool, healer)
        return cls(pool, where, locator, Queries(where), healer, sweep, tracer)

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[Upstream]:
        """The control links, the audit and the check of attached sessions, for the
        duration of the context."""
        async with self.pool.running():
            audit = self.pool.spawn(self.locator.audit.run(), "audit")
            sweep = self.pool.spawn(self.sweep.run(), "sweep")
            try:
                yield self
            finally:
                for task in (audit, sweep):
                    if task is not None:
                        task.cancel()
                self.locator.cancel()
