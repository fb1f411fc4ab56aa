"""DNS discovery, the I/O shell: look up each ``[[discovery]]`` name on its interval and
hand the pool what was found (:meth:`router.server.pool.Pool.set_discovered`).

What an answer means is :mod:`router.core.discovery`'s; what a vanished backend means
is the pool's (it is *leaving*: no new sessions, still probed and resumed on until it is
gone). A lookup that fails (a timeout, the server failing) changes nothing: the last
answer stands, so a DNS outage never empties the pool. An answer that the name does not
exist or has no address is an answer: every backend it held starts leaving.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Sequence

import dns.asyncresolver
import dns.exception
import dns.resolver

from router.core.discovery import Found, discovered
from router.server.config import BackendSection, DiscoverySection
from router.server.observability.metrics import Metrics
from router.server.pool.backends import Pool

logger = logging.getLogger(__name__)


def source_of(spec: DiscoverySection) -> str:
    """How the pool and the log name a discovery table."""
    return f"{spec.dns}:{spec.port}{spec.path}"


class Lookup:
    """Asks one ``[[discovery]]`` table's name: A records, then each address's PTR."""

    def __init__(self, spec: DiscoverySection) -> None:
        self.spec = spec

    def _resolver(self) -> dns.asyncresolver.Resolver:
        address = self.spec.nameserver_address
        resolver = dns.asyncresolver.Resolver(configure=address is None)
        if address is not None:
            resolver.nameservers = [address[0]]
            resolver.port = address[1]
        resolver.lifetime = self.spec.timeout_ms / 1000
        return resolver

    async def found(self) -> list[Found]:
        """The addresses the name has now (empty: it has none, or does not exist).

        Raises:
            dns.exception.DNSException: no answer (a timeout, no server answered).
        """
        resolver = self._resolver()
        try:
            answer = await resolver.resolve(self.spec.dns, "A", search=False)
        except (dns.resolver.NXDOMAIN, dns.resolver.NoAnswer):
            return []
        addresses = sorted({record.to_text() for record in answer})
        names = await asyncio.gather(*(self._name(resolver, a) for a in addresses))
        return [Found(a, n) for a, n in zip(addresses, names, strict=True)]

    async def _name(self, resolver: dns.asyncresolver.Resolver, address: str) -> str | None:
        try:
            answer = await resolver.resolve_address(address)
        except dns.exception.DNSException:
            return None  # no reverse name: the address is the id
        names = sorted(record.to_text() for record in answer)
        return names[0].rstrip(".") if names else None


class Discoveries:
    """The running lookups, one task per ``[[discovery]]`` table; a reload changes the set."""

    def __init__(self, pool: Pool, metrics: Metrics) -> None:
        self._pool = pool
        self._metrics = metrics
        self._tasks: dict[DiscoverySection, asyncio.Task[None]] = {}
        self._group: asyncio.TaskGroup | None = None

    @contextlib.asynccontextmanager
    async def running(self, specs: Sequence[DiscoverySection]) -> AsyncIterator[Discoveries]:
        async with asyncio.TaskGroup() as group:
            self._group = group
            self.apply(specs)
            try:
                yield self
            finally:
                self._group = None
                for task in self._tasks.values():
                    task.cancel()

    def apply(self, specs: Sequence[DiscoverySection]) -> None:
        """Run exactly ``specs``: stop the lookups no longer named (their backends start
        leaving), start the new ones."""
        for spec in [s for s in self._tasks if s not in specs]:
            self._tasks.pop(spec).cancel()
            self._pool.set_discovered(source_of(spec), ())
        for spec in specs:
            if spec not in self._tasks and self._group is not None:
                task = self._group.create_task(self._run(spec), name=f"discovery-{spec.dns}")
                self._tasks[spec] = task

    async def _run(self, spec: DiscoverySection) -> None:
        lookup = Lookup(spec)
        source = source_of(spec)
        seen: tuple[str, ...] | None = None
        while True:
            try:
                found = await lookup.found()
            except dns.exception.DNSException as exc:
                logger.warning(
                    "discovery %s: lookup failed, keeping the last answer: %s", source, exc
                )
                self._metrics.discovery_lookups.labels(spec.dns, "failed").inc()
            except Exception:  # the lookup task's boundary: the router keeps running
                logger.exception("discovery %s: lookup failed inside the router", source)
                self._metrics.discovery_lookups.labels(spec.dns, "failed").inc()
            else:
                self._metrics.discovery_lookups.labels(spec.dns, "ok" if found else "empty").inc()
                backends = discovered(found, scheme=spec.scheme, port=spec.port, path=spec.path)
                ids = tuple(b.id for b in backends)
                if ids != seen:
                    logger.info("discovery %s: found %s", source, ", ".join(ids) or "nothing")
                    seen = ids
                change = self._pool.set_discovered(
                    source,
                    [BackendSection(id=b.id, url=b.url, weight=spec.weight) for b in backends],
                )
                if not change.empty:
                    logger.info("discovery %s: %s", source, change.summary())
            await asyncio.sleep(spec.interval_seconds)  # the interval itself
