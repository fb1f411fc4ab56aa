"""Backends found in DNS, sans-I/O: what a lookup's answer means for the pool.

A ``[[discovery]]`` table names a DNS name (a Kubernetes headless Service). Each of its
A records is one backend at ``scheme://ADDRESS:PORT/PATH``. Its id must stay the same
while the instance lives, across lookups and router replicas, because it is hashed for
placement and labels the metrics: it is the first label of the address's reverse
(PTR) name, which for a StatefulSet's pod is its ordinal host name (``agent-0`` from
``agent-0.agents.acp.svc.cluster.local``), so a fleet moved from a static list to
discovery keeps its ids; an address without a PTR name is its own id.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from router.protocol.ids import BackendId


@dataclass(frozen=True, slots=True)
class Found:
    """One A (or AAAA) record, with the reverse name of its address, if any."""

    address: str
    #: the PTR name, without its final dot; None when there is none
    name: str | None = None


@dataclass(frozen=True, slots=True)
class Discovered:
    """A backend that a lookup found."""

    id: BackendId
    url: str


def backend_id(found: Found) -> BackendId:
    """The first label of the reverse name, else the address."""
    if found.name:
        label = found.name.rstrip(".").split(".", 1)[0]
        if label:
            return BackendId(label)
    return BackendId(found.address)


def discovered(
    answer: Iterable[Found], *, scheme: str, port: int, path: str
) -> tuple[Discovered, ...]:
    """The backends of one lookup's answer, by id; of two addresses with one id, the
    first by address keeps it and the other is known by its address."""
    backends: dict[BackendId, Discovered] = {}
    for found in sorted(set(answer), key=lambda f: f.address):
        host = f"[{found.address}]" if ":" in found.address else found.address
        url = f"{scheme}://{host}:{port}{path}"
        backend = backend_id(found)
        if backend in backends:
            backend = BackendId(found.address)
        backends.setdefault(backend, Discovered(backend, url))
    return tuple(sorted(backends.values(), key=lambda d: d.id))
