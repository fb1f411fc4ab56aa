"""The router application's state, each part under a typed key (aiohttp's ``AppKey``):
the settings, metrics, pool and door its handlers read, and what the application keeps
of its own: the client connections open now, and whether it is draining
(docs/architecture.md, "Every rule and its file").
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any

from aiohttp import web

from router.core.frontdoor import DoorPolicy
from router.core.quotas import ClientPlaces
from router.protocol.ids import BackendId, SessionId
from router.server.config import Settings
from router.server.connection.client import ClientConnection
from router.server.connection.gate import Gatekeeper
from router.server.door.accepting import ConnectionGuard
from router.server.door.auth import TokenSource
from router.server.door.streamable_http import HttpFront
from router.server.observability.metrics import Metrics
from router.server.observability.tracing import Tracer
from router.server.pool.backends import Pool
from router.server.pool.upstream import Upstream

SETTINGS = web.AppKey("settings", Settings)
METRICS = web.AppKey("metrics", Metrics)
POOL = web.AppKey("pool", Pool)
UPSTREAM = web.AppKey("upstream", Upstream)


class OpenClients(set[ClientConnection]):
    """The client connections open now, on any transport (closed with 1012 on shutdown),
    and the tasks closing some of them (a revoked token's, one past its initialize
    deadline)."""

    def __init__(self) -> None:
        super().__init__()
        self.closes: set[asyncio.Task[None]] = set()
        #: pulsed whenever a connection is counted in or out
        self.changed = asyncio.Event()

    def add(self, connection: ClientConnection) -> None:
        super().add(connection)
        self._pulse()

    def discard(self, connection: object) -> None:
        super().discard(connection)
        self._pulse()

    def _pulse(self) -> None:
        self.changed.set()
        self.changed.clear()

    def stale_copies(self, session_id: SessionId, backends: frozenset[BackendId]) -> None:
        """Copies of ``session_id`` on ``backends`` were found stale: each connection
        attached to one of them detaches it (:meth:`ClientConnection.stale_copies`)."""
        for connection in self:
            connection.stale_copies(session_id, backends)

    def closing(self, close: Coroutine[Any, Any, None]) -> None:
        """Run ``close`` in a task held here until it ends."""
        task = asyncio.create_task(close, name="close-client")
        self.closes.add(task)
        task.add_done_callback(self.closes.discard)


class Draining(asyncio.Event):
    """Set once the router is stopping: /readyz says 503 and new clients are refused."""


CLIENTS = web.AppKey("clients", OpenClients)
DRAINING = web.AppKey("draining", Draining)
DOOR = web.AppKey("door", DoorPolicy)
#: the client tokens, re-readable
TOKENS = web.AppKey("tokens", TokenSource)
GATEKEEPER = web.AppKey("gatekeeper", Gatekeeper)
CONFIG_PATH = web.AppKey("config_path", Path)
#: limits and the handshake deadline of every TCP connection (router.server.door.accepting)
GUARD = web.AppKey("guard", ConnectionGuard)
#: the Streamable HTTP connections
HTTP_FRONT = web.AppKey("http_front", HttpFront)
#: client connections (WebSocket or Streamable HTTP) open per token (or address) and in
#: all: an HTTP connection holds no TCP connection of its own, so the TCP counts miss it
PLACES = web.AppKey("places", ClientPlaces)
ADMIN_TOKENS = web.AppKey("admin_tokens", TokenSource)
#: what ``GET /metrics`` answers: this router's registry, or, in a worker, every worker's
EXPOSITION: web.AppKey[Callable[[], Awaitable[bytes]]] = web.AppKey("exposition")
#: where the spans of traced requests come from (router.tracing)
TRACER: web.AppKey[Tracer] = web.AppKey("tracer")
