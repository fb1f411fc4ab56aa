"""The router's aiohttp application: the ACP front door at ``/acp``, the operator
endpoints (:mod:`router.server.operator.operator_endpoints`) and ``/admin/``
(:mod:`router.server.operator.admin`), with the pool and the Streamable HTTP connections running
for the application's life; its state is under the keys of :mod:`router.server.door.app_keys`
(docs/architecture.md, "Every rule and its file").

``/acp`` speaks both profiles of ACP's transport RFD: a ``GET`` with ``Upgrade:
websocket`` is a WebSocket client (:mod:`router.server.door.upgrade`); ``POST``, any other
``GET`` and ``DELETE`` are Streamable HTTP (:mod:`router.server.door.streamable_http`). The
door's checks on both are :mod:`router.server.door.admission`'s.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import aiohttp
from aiohttp import hdrs, web

from router.core.frontdoor import DoorPolicy
from router.core.ownership import SessionSeal
from router.core.quotas import ClientPlaces, ConnectionCounts
from router.server.config import Settings
from router.server.connection.gate import Gatekeeper
from router.server.door.accepting import WEBSOCKET, ConnectionGuard
from router.server.door.admission import HttpDoor, revoke
from router.server.door.app_keys import (
    ADMIN_TOKENS,
    CLIENTS,
    CONFIG_PATH,
    DOOR,
    DRAINING,
    EXPOSITION,
    GATEKEEPER,
    GUARD,
    HTTP_FRONT,
    METRICS,
    PLACES,
    POOL,
    SETTINGS,
    TOKENS,
    TRACER,
    UPSTREAM,
    Draining,
    OpenClients,
)
from router.server.door.auth import TokenSource, session_secret
from router.server.door.streamable_http import HttpFront
from router.server.door.upgrade import upgrade_held, websocket_entry
from router.server.links.tls import backend_context
from router.server.observability.metrics import Metrics
from router.server.observability.tracers import tracer_for
from router.server.observability.tracing import Tracer
from router.server.operator.admin import Admin
from router.server.operator.operator_endpoints import exposition_of, healthz, metrics_page, readyz
from router.server.operator.reload import Reloader
from router.server.pool.discoveries import Discoveries
from router.server.pool.upstream import Upstream
from router.server.process.shutdown import close_spread
from router.tasks import cancel_all_and_wait

#: the one way to reload the configuration: SIGHUP and POST /admin/reload call it
RELOADER = web.AppKey("reloader", Reloader)


def create_app(
    settings: Settings,
    metrics: Metrics | None = None,
    *,
    clock: Callable[[], float] = time.monotonic,
    config_path: Path | None = None,
    tracer: Tracer | None = None,
) -> web.Application:
    """The router's application; ``clock`` paces the new-session limits; ``config_path``
    is the file a reload reads (without one, a reload is refused); ``tracer`` makes the
    spans of traced requests (default: as ``router.tracing`` and the ``OTEL_*``
    environment say, made when the application starts).

    Raises:
        ConfigError: a token source, the session secret or a TLS file named in the
            settings is unusable.
    """
    metrics = metrics or Metrics()
    per_address = ConnectionCounts(settings.router.max_connections_per_address)
    guard = ConnectionGuard(settings.router, metrics, per_address)
    # a POSTed frame may be as large as a WebSocket one
    app = web.Application(
        middlewares=[guard.middleware], client_max_size=settings.router.max_message_bytes + 1
    )
    app[SETTINGS] = settings
    app[METRICS] = metrics
    app[METRICS].max_connections.set(settings.router.max_connections)
    app[EXPOSITION] = exposition_of(metrics)
    app[CLIENTS] = OpenClients()
    app[DRAINING] = Draining()
    app[DOOR] = DoorPolicy.of(settings.router.allowed_origins)
    app[TOKENS] = TokenSource(settings.auth)
    app[GUARD] = guard
    secret = session_secret(settings.auth) if settings.auth is not None else None
    app[GATEKEEPER] = Gatekeeper(settings.router, clock, SessionSeal(secret) if secret else None)
    for backend in settings.backends:
        backend_context(backend)  # read the TLS files now: a bad one stops the start
    if config_path is not None:
        app[CONFIG_PATH] = config_path
    app[PLACES] = ClientPlaces(
        settings.router.max_connections_per_principal,
        settings.router.max_connections_per_address,
        settings.router.max_connections,
    )
    app[HTTP_FRONT] = HttpFront(settings.router, app[METRICS], HttpDoor(app))
    app[WEBSOCKET] = websocket_entry(app)
    if tracer is not None:
        app[TRACER] = tracer
    app.cleanup_ctx.append(_tracer_context)  # first: it sends the spans the rest made
    app.cleanup_ctx.append(_pool_context)
    app.cleanup_ctx.append(_http_context)  # after the pool: its connections end first
    app.on_shutdown.append(_close_clients)
    app.router.add_get("/acp", _acp, allow_head=False)  # a HEAD would be a stream with no body
    app.router.add_post("/acp", _acp_post)
    app.router.add_delete("/acp", _acp_delete)
    if settings.router.metrics_listen is None:
        app.router.add_get("/metrics", metrics_page)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    if settings.admin is not None:
        app[ADMIN_TOKENS] = TokenSource(settings.admin, key="admin")
        Admin(app[ADMIN_TOKENS], lambda: app[POOL], lambda: app[RELOADER]).add_routes(app)
    return app


async def _pool_context(app: web.Application) -> AsyncIterator[None]:
    # limit=0: every client connection holds its own backend links; aiohttp's default
    # connector would cap all of them together at 100 sockets.
    connect = app[SETTINGS].router.connect_timeout_ms / 1000
    timeout = aiohttp.ClientTimeout(total=None, connect=connect, sock_connect=connect)
    async with aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0), timeout=timeout
    ) as http:
        upstream = Upstream.of(app[SETTINGS], app[METRICS], http, app[TRACER])
        app[UPSTREAM] = upstream
        app[POOL] = pool = upstream.pool
        pool.on_stale = app[CLIENTS].stale_copies
        discoveries = Discoveries(pool, app[METRICS])
        app[RELOADER] = Reloader(
            app.get(CONFIG_PATH),
            app[SETTINGS],
            pool,
            app[TOKENS],
            app[METRICS],
            discoveries,
            admin_tokens=app.get(ADMIN_TOKENS),
            revoke=lambda credentials: revoke(app, credentials),
        )
        async with upstream.running(), discoveries.running(app[SETTINGS].discovery):
            yield


async def _tracer_context(app: web.Application) -> AsyncIterator[None]:
    """The tracer, unless one was given: made as the application starts (an exporter's
    thread with it), and closed last, sending the spans left (off the loop: it blocks)."""
    if TRACER in app:
        yield
        return
    app[TRACER] = tracer = tracer_for(app[SETTINGS].router.tracing)
    try:
        yield
    finally:
        await asyncio.to_thread(tracer.close)


async def _http_context(app: web.Application) -> AsyncIterator[None]:
    async with app[HTTP_FRONT].running():
        yield


async def _close_clients(app: web.Application) -> None:
    # Whoever is still connected at cleanup (the stop sequence closed the others).
    open_clients: OpenClients = app[CLIENTS]
    await close_spread(list(open_clients), 0.0, asyncio.Event())
    await cancel_all_and_wait(*open_clients.closes)


async def _acp(request: web.Request) -> web.StreamResponse:
    """``GET /acp``: an event stream, or a WebSocket upgrade that came on a connection
    aiohttp holds (one kept alive after an earlier request; a connection that opens with
    the upgrade never reaches aiohttp: :func:`~router.server.door.upgrade.websocket_entry`)."""
    if request.headers.get(hdrs.UPGRADE, "").lower() != "websocket":
        return await request.app[HTTP_FRONT].stream(request)
    return await upgrade_held(request)


async def _acp_post(request: web.Request) -> web.StreamResponse:
    return await request.app[HTTP_FRONT].post(request)


async def _acp_delete(request: web.Request) -> web.StreamResponse:
    return await request.app[HTTP_FRONT].delete(request)


def sibling_app(app: web.Application) -> web.Application:
    """What the other workers of a router ask this one, on its Unix socket
    (:mod:`router.server.process.workers`): its own registry at ``/metrics``, and the Streamable
    HTTP requests of its connections that reached another worker. Those go to this
    worker's HTTP front and its door (origin and token checked again); their TCP
    connections were counted by the worker they came to."""
    siblings = web.Application(client_max_size=app[SETTINGS].router.max_message_bytes + 1)
    # what the handlers below read, the door's checks included
    siblings[METRICS] = app[METRICS]
    siblings[DOOR] = app[DOOR]
    siblings[TOKENS] = app[TOKENS]
    siblings[HTTP_FRONT] = app[HTTP_FRONT]
    siblings[EXPOSITION] = exposition_of(app[METRICS])
    siblings.router.add_get("/metrics", metrics_page)
    siblings.router.add_get("/acp", _acp_stream, allow_head=False)
    siblings.router.add_post("/acp", _acp_post)
    siblings.router.add_delete("/acp", _acp_delete)
    return siblings


async def _acp_stream(request: web.Request) -> web.StreamResponse:
    return await request.app[HTTP_FRONT].stream(request)
