"""The router's aiohttp application: the ACP front door at ``/acp`` and the
operator endpoints ``/metrics``, ``/healthz`` and ``/readyz``.

``/acp`` speaks both profiles of ACP's transport RFD: a ``GET`` with ``Upgrade:
websocket`` is a WebSocket client (:mod:`router.server.websocket`); ``POST``, any other
``GET`` and ``DELETE`` are Streamable HTTP (:mod:`router.server.streamable_http`).

Every TCP connection is counted against the connection limits from the moment it is
accepted, and must send its request within ``router.handshake_timeout_ms``
(:mod:`router.server.accepting`: 429 or 503 past a limit, 503 near the open-file limit,
408 past the deadline). Before a client's connection is accepted (the upgrade, or the
POSTed ``initialize``), the door checks, in order: draining (503), the ``Origin`` (403),
the bearer token (401); then every client connection, of either profile, counts
against ``max_connections`` and the limit of its token (of its address without
``[auth]``), however few TCP connections carry it (idle HTTP ones make room), and
every later HTTP request of a connection is checked for origin and token again. The decisions are
:mod:`router.core.frontdoor`'s and :mod:`router.core.quotas`'s; this module answers them
and counts them. An upgraded client must send ``initialize`` within
``router.initialize_timeout_ms`` (else close 1008), and a reload that removes the token
a client came with closes its connection (1008, :func:`revoke`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any, NamedTuple, cast

import aiohttp
from aiohttp import hdrs, web
from aiohttp.log import access_logger
from websockets.extensions.permessage_deflate import ServerPerMessageDeflateFactory
from websockets.http11 import Request as WsRequest
from websockets.protocol import Protocol
from websockets.server import ServerProtocol

from router.core.frontdoor import Admitted, Credentials, DoorPolicy
from router.core.ownership import SessionSeal
from router.core.quotas import Client, ClientPlaces, ConnectionCounts, Place, Taken
from router.protocol import acp
from router.protocol.ids import new_connection_id
from router.server import log_context
from router.server.accepting import (
    WEBSOCKET,
    ConnectionGuard,
    FrontDoor,
    WebSocketEntry,
    answer,
    listen,
    listen_on,
    take_place,
)
from router.server.admin import Admin
from router.server.auth import TokenSource, session_secret
from router.server.client import ClientChannel, ClientConnection
from router.server.config import Settings
from router.server.discovery import Discoveries
from router.server.gate import Gatekeeper
from router.server.metrics import CONTENT_TYPE, Metrics, WorkersExposition
from router.server.pool.backends import Pool
from router.server.pool.upstream import Upstream
from router.server.reload import Reloader
from router.server.shutdown import StopSignals, close_spread, reloading_on_hangup, wait_unless
from router.server.streamable_http import Entry, HttpFront
from router.server.tls import backend_context, server_context
from router.server.tracing import Tracer, tracer_for
from router.server.websocket import FRAMES_LOG, WebSocket, WebSocketChannel, opened
from router.server.workers import (
    Affinity,
    ParentChannel,
    WorkerRole,
    ready_to_serve,
    serving_siblings,
)
from router.tasks import cancel_all_and_wait

logger = logging.getLogger(__name__)

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
#: the one way to reload the configuration: SIGHUP and POST /admin/reload call it
RELOADER = web.AppKey("reloader", Reloader)
CONFIG_PATH = web.AppKey("config_path", Path)
#: limits and the handshake deadline of every TCP connection (router.server.accepting)
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
    app[EXPOSITION] = _exposition_of(metrics)
    app[CLIENTS] = OpenClients()
    app[DRAINING] = Draining()
    app[DOOR] = DoorPolicy.of(settings.router.allowed_origins)
    app[TOKENS] = TokenSource(settings.auth)
    app[GUARD] = guard
    secret = session_secret(settings.auth) if settings.auth is not None else None
    app[GATEKEEPER] = Gatekeeper(
        settings.router, app[METRICS], clock, SessionSeal(secret) if secret else None
    )
    for backend in settings.backends:
        backend_context(backend)  # read the TLS files now: a bad one stops the start
    if config_path is not None:
        app[CONFIG_PATH] = config_path
    app[PLACES] = ClientPlaces(
        settings.router.max_connections_per_principal,
        settings.router.max_connections_per_address,
        settings.router.max_connections,
    )
    app[HTTP_FRONT] = HttpFront(settings.router, app[METRICS], _HttpDoor(app))
    app[WEBSOCKET] = _websocket_entry(app)
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
        app.router.add_get("/metrics", _metrics)
    app.router.add_get("/healthz", _healthz)
    app.router.add_get("/readyz", _readyz)
    if settings.admin is not None:
        app[ADMIN_TOKENS] = TokenSource(settings.admin, key="admin")
        Admin(app[ADMIN_TOKENS], lambda: app[POOL], lambda: app[RELOADER]).add_routes(app)
    return app


def create_metrics_app(exposition: Callable[[], Awaitable[bytes]]) -> web.Application:
    """``/metrics`` alone, for ``router.metrics_listen``."""
    app = web.Application()
    app[EXPOSITION] = exposition
    app.router.add_get("/metrics", _metrics)
    return app


def _exposition_of(metrics: Metrics) -> Callable[[], Awaitable[bytes]]:
    async def exposition() -> bytes:
        return metrics.exposition()

    return exposition


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
    the upgrade never reaches aiohttp: :func:`_websocket_entry`)."""
    if request.headers.get(hdrs.UPGRADE, "").lower() != "websocket":
        return await request.app[HTTP_FRONT].stream(request)
    transport = request.transport
    door = transport.get_protocol() if transport is not None else None
    if transport is None or not isinstance(door, FrontDoor):
        raise web.HTTPServiceUnavailable(text="the connection has gone\n")
    accepted = _upgrade(request.app, transport, _head_of(request))
    if isinstance(accepted, web.Response):
        return accepted
    tail = _Tail()
    request.protocol.set_parser(cast(Any, tail))  # what the client sent after the head
    served = _serve_client(request.app, transport, accepted, following=tail.data)
    door.adopt(served)
    await served.wait_closed()
    return web.Response()  # the connection is gone: nothing is written


class _Tail:
    """What aiohttp read after an upgrade request's head (``set_parser`` hands it over)."""

    def __init__(self) -> None:
        self.data = b""

    def feed_data(self, data: bytes) -> tuple[bool, bytes]:
        self.data += data
        return False, b""

    def feed_eof(self) -> None:
        pass


def _head_of(request: web.Request) -> bytes:
    """The head of a request aiohttp read, as it came (near enough: one line per field)."""
    fields = b"".join(name + b": " + value + b"\r\n" for name, value in request.raw_headers)
    line = f"{request.method} {request.raw_path} HTTP/1.1\r\n".encode()
    return line + fields + b"\r\n"


def _websocket_entry(app: web.Application) -> WebSocketEntry:
    """How a connection that opens with a WebSocket upgrade of ``/acp`` is served (the
    front door hands it over with the bytes read so far): a refusal is answered and the
    connection closed."""

    def entry(transport: asyncio.Transport, data: bytes) -> asyncio.BaseProtocol | None:
        cut = data.find(b"\r\n\r\n") + 4  # the head; frames that follow are read once open
        accepted = _upgrade(app, transport, data[:cut])
        if not isinstance(accepted, web.Response):
            return _serve_client(app, transport, accepted, following=data[cut:])
        answer(transport, accepted.status, accepted.text or "", _extra_headers(accepted))
        return None

    return entry


def _extra_headers(response: web.Response) -> dict[str, str]:
    skip = {hdrs.CONTENT_TYPE, hdrs.CONTENT_LENGTH}
    return {name: value for name, value in response.headers.items() if name not in skip}


class Upgraded(NamedTuple):
    """An accepted WebSocket upgrade, to serve."""

    frames: Protocol  # the connection's protocol, open
    switching: bytes  # the ``101`` to write
    admission: Admitted
    address: str
    #: the client connection's place (given back when the connection ends)
    place: Place


def _upgrade(
    app: web.Application, transport: asyncio.Transport, head: bytes
) -> Upgraded | web.Response:
    """Decide on a WebSocket upgrade of ``/acp`` whose request head is ``head``: the
    connection's protocol (open), the ``101`` to write, the door's admission and the
    client's address (counted against the limits), or the refusal to answer.

    The checks, in order: draining (503), the door's (``Origin``: 403, token: 401), the
    connection limits (429, 503), then the upgrade itself (426 when it is not a valid
    WebSocket handshake).
    """
    settings = app[SETTINGS].router
    extensions = [ServerPerMessageDeflateFactory()] if settings.compression else None
    frames = ServerProtocol(
        max_size=settings.max_message_bytes, extensions=extensions, logger=FRAMES_LOG
    )
    frames.receive_data(head)
    events = frames.events_received()
    if not events or not isinstance(events[0], WsRequest):
        return web.Response(status=400, text="not an HTTP request the router reads\n")
    upgrade = events[0]
    peer = transport.get_extra_info("peername")
    address = str(peer[0]) if peer else "unknown"
    refused = _draining(app)
    if refused is not None:
        return refused
    admission = _admit(app, _field(upgrade, "Origin"), _field(upgrade, "Authorization"), address)
    if not isinstance(admission, Admitted):
        return admission
    place = _take_place(app, admission, address)
    if isinstance(place, web.Response):
        return place
    response = frames.accept(upgrade)
    if response.status_code != 101:
        app[PLACES].give_back(place)
        app[METRICS].connections.labels("not_websocket").inc()
        return web.Response(
            status=426, text="ACP speaks WebSocket here: connect with ws://.../acp\n"
        )
    response.headers[acp.CONNECTION_ID_HEADER] = new_connection_id()  # as the RFD says
    frames.send_response(response)
    return Upgraded(opened(frames), b"".join(frames.data_to_send()), admission, address, place)


def _field(request: WsRequest, name: str) -> str | None:
    """A header's first value (as aiohttp's ``headers.get`` reads it), or None."""
    values = request.headers.get_all(name)
    return values[0] if values else None


def _serve_client(
    app: web.Application, transport: asyncio.Transport, upgraded: Upgraded, *, following: bytes
) -> WebSocket:
    """A client connection on an accepted upgrade, and its WebSocket: closing it ends the
    connection (:func:`_client_gone`). ``following``: what the client sent after its
    request (frames it did not wait to send)."""
    settings = app[SETTINGS].router
    place = upgraded.place
    channel = WebSocketChannel(app[METRICS], lambda gone: _client_gone(app, gone, place))
    ws = WebSocket(upgraded.frames, channel)
    ws.connection_made(transport)
    transport.write(upgraded.switching)
    channel.attach(ws)
    log_context.new_connection()
    connection = channel.connection = _open_client(
        app, channel, upgraded.admission, upgraded.address
    )
    # a timer, not a task: nothing waits on the connection's behalf while it is fine
    channel.deadline = asyncio.get_running_loop().call_later(
        settings.initialize_timeout_ms / 1000,
        _initialize_deadline_passed,
        app,
        connection,
        settings.initialize_timeout_ms,
    )
    if following:
        ws.data_received(following)
    return ws


def _client_gone(app: web.Application, channel: WebSocketChannel, place: Place) -> None:
    """A client's WebSocket is gone: end its connection (in a task the clients' set
    owns: the connection stops its own tasks and links first), and free its place."""
    connection = channel.connection
    if channel.deadline is not None:
        channel.deadline.cancel()
    if connection is None:
        app[PLACES].give_back(place)
        return

    async def end() -> None:
        try:
            await connection.ended()
        finally:
            _close_client(app, connection)
            app[PLACES].give_back(place)

    app[CLIENTS].closing(end())


async def _acp_post(request: web.Request) -> web.StreamResponse:
    return await request.app[HTTP_FRONT].post(request)


async def _acp_delete(request: web.Request) -> web.StreamResponse:
    return await request.app[HTTP_FRONT].delete(request)


def _take_place(app: web.Application, admission: Admitted, address: str) -> Place | web.Response:
    """A place for a new client connection (given back with ``PLACES.give_back``), idle
    Streamable HTTP connections ending to make room; or the refusal: too many for that
    token or address (429), or in all (503)."""
    taken = take_place(app[METRICS], app[PLACES], Client.of(admission.principal, address))
    if not isinstance(taken, Taken):
        return web.Response(status=taken[0], text=taken[1])
    app[HTTP_FRONT].reclaim(taken.reclaimed)
    return taken.place


def _draining(app: web.Application) -> web.Response | None:
    """503 while the router stops: new clients go to another replica."""
    if not app[DRAINING].is_set():
        return None
    app[METRICS].connections.labels("draining").inc()
    return web.Response(status=503, text="draining: connect to another replica\n")


def _admit(
    app: web.Application,
    origin: str | None,
    authorization: str | None,
    address: str,
    *,
    opening: bool = True,
) -> Admitted | web.Response:
    """The door's decision on a request with these ``Origin`` and ``Authorization``
    headers from ``address`` (``opening``: a new connection), counted; a refusal is the
    response to send. A request of an open HTTP connection counts only its refusals,
    under ``acp_router_auth_total``."""
    admission = app[DOOR].admit(origin, authorization, app[TOKENS].credentials)
    metrics = app[METRICS]
    if isinstance(admission, Admitted):
        if opening:
            metrics.auth.labels(admission.auth.value).inc()
        return admission
    if admission.auth is not None:
        metrics.auth.labels(admission.auth.value).inc()
    if opening:
        metrics.connections.labels(admission.reason).inc()
    logger.debug("refused a client from %s: %s", address, admission.reason)
    headers = {hdrs.WWW_AUTHENTICATE: "Bearer"} if admission.status == 401 else None
    return web.Response(status=admission.status, text=admission.text, headers=headers)


def _open_client(
    app: web.Application, channel: ClientChannel, admission: Admitted, address: str
) -> ClientConnection:
    """A client connection on ``channel``, counted among the open ones."""
    metrics = app[METRICS]
    metrics.connections.labels("accepted").inc()
    metrics.active_connections.inc()
    gate = app[GATEKEEPER].gate(address, admission.principal, app[POOL].hint_from_id)
    connection = ClientConnection(channel, app[UPSTREAM], gate, principal=admission.principal)
    app[CLIENTS].add(connection)
    return connection


def _close_client(app: web.Application, connection: ClientConnection) -> None:
    app[CLIENTS].discard(connection)
    app[METRICS].active_connections.dec()


class _HttpDoor:
    """The door's checks and bookkeeping for Streamable HTTP connections
    (:class:`router.server.streamable_http.Door`): the WebSocket upgrade's, with the
    same counts; the origin and token come first, as they do on every HTTP request. An
    HTTP connection holds no TCP connection of its own (its requests and streams come
    and go), so client connections of both profiles are counted against
    ``max_connections`` and the limit per token or address (:func:`_take_place`),
    besides the TCP connections that carry them."""

    def __init__(self, app: web.Application) -> None:
        self.app = app

    def admit(self, request: web.Request) -> Admitted | web.Response:
        origin, authorization = (
            request.headers.get(hdrs.ORIGIN),
            request.headers.get(hdrs.AUTHORIZATION),
        )
        return _admit(self.app, origin, authorization, request.remote or "unknown", opening=False)

    def enter(self, request: web.Request, admission: Admitted) -> Entry | web.Response:
        app = self.app
        refused = _draining(app)
        if refused is not None:
            return refused
        app[METRICS].auth.labels(admission.auth.value).inc()
        address = request.remote or "unknown"
        place = _take_place(app, admission, address)
        if isinstance(place, web.Response):
            return place
        return Entry(admission, address, place, app[PLACES])

    def start(self, channel: ClientChannel, entry: Entry) -> ClientConnection:
        return _open_client(self.app, channel, entry.admission, entry.address)

    def finish(self, connection: ClientConnection, entry: Entry) -> None:
        _close_client(self.app, connection)
        self.app[PLACES].give_back(entry.place)


def _initialize_deadline_passed(
    app: web.Application, connection: ClientConnection, ms: int
) -> None:
    """Close ``connection`` (1008) if it has not sent ``initialize`` by now."""
    if not connection.initialized:
        app[METRICS].connections.labels("initialize_timeout").inc()
        reason = f"no initialize within {ms} ms"
        app[CLIENTS].closing(connection.shut(aiohttp.WSCloseCode.POLICY_VIOLATION, reason))


def revoke(app: web.Application, credentials: Credentials | None) -> int:
    """Close (1008) every client connection that came with a token not in
    ``credentials`` (a reload removed it); how many. The closes run in the background,
    in tasks the clients' set owns until they end."""
    if credentials is None:
        return 0
    revoked = [
        c for c in app[CLIENTS] if c.principal is not None and not credentials.admits(c.principal)
    ]
    for connection in revoked:
        app[METRICS].connections.labels("revoked").inc()
        app[CLIENTS].closing(connection.shut(aiohttp.WSCloseCode.POLICY_VIOLATION, "token revoked"))
    if revoked:
        logger.warning("closed %d client connection(s) whose token a reload removed", len(revoked))
    return len(revoked)


async def _metrics(request: web.Request) -> web.Response:
    body = await request.app[EXPOSITION]()
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})


async def _healthz(request: web.Request) -> web.Response:
    return web.Response(text="ok\n")


async def _readyz(request: web.Request) -> web.Response:
    if request.app[DRAINING].is_set():
        return web.Response(status=503, text="draining\n")
    ready = request.app[POOL].ready()
    if not ready:
        return web.Response(status=503, text="no backend is up\n")
    return web.Response(text=f"ready: {len(ready)} backend(s) up\n")


def announce(url: str) -> None:
    print(f"acp-router listening on {url}", flush=True)  # noqa: T201


async def serve(
    settings: Settings,
    on_listening: Callable[[str], None] = announce,
    *,
    config_path: Path | None = None,
    worker: WorkerRole | None = None,
) -> None:
    """Run the router until SIGINT or SIGTERM, reloading ``config_path`` on SIGHUP;
    ``on_listening`` gets the bound ws:// URL.

    ``worker``: run as one worker of a router with ``router.workers`` above 1
    (:mod:`router.server.workers`): on the listening sockets the parent handed over, with
    ``/metrics`` answering for every worker, and telling the parent, not
    ``on_listening``, once it listens.

    The stop sequence is :mod:`router.server.shutdown`'s; the signals stay handled until
    the process is done, so a signal during clean-up cannot kill it halfway.
    """
    app = create_app(settings, config_path=config_path)
    affinity = None if worker is None else _as_worker(app, worker)
    tls = server_context(settings.router)
    access_log = access_logger if settings.router.access_log else None
    runner = app_runner(app, access_log=access_log)
    with StopSignals().installed() as signals:
        await runner.setup()
        async with contextlib.AsyncExitStack() as stack:
            stack.push_async_callback(runner.cleanup)
            host, port = settings.router.address
            if worker is not None and affinity is not None:
                await stack.enter_async_context(affinity)
                await ready_to_serve(app[POOL], settings.router.connect_timeout_ms / 1000)
                await listen_on(runner, app[GUARD], worker.listening_sockets(), tls)
                await stack.enter_async_context(serving_siblings(worker, _sibling_app(app)))
                channel = await stack.enter_async_context(ParentChannel(worker))
                on_listening = channel.listening
            else:
                await listen(runner, app[GUARD], host, port, tls)
                if settings.router.metrics_address is not None:
                    await serve_metrics(stack, app[EXPOSITION], *settings.router.metrics_address)
            if settings.auth is None and (worker is None or worker.index == 0):
                logger.warning(
                    "no [auth] section: any client that reaches %s may use the agents", host
                )
            await stack.enter_async_context(reloading_on_hangup(app[RELOADER].reload))
            loop = type(asyncio.get_running_loop())
            logger.info("event loop: %s (%s)", loop.__module__.partition(".")[0], loop.__name__)
            scheme = "ws" if tls is None else "wss"
            on_listening(f"{scheme}://{host}:{runner.addresses[0][1]}/acp")
            await signals.stop.wait()
            sys.stdout.flush()
            await drain(app, settings.router.drain_seconds, signals.hurry)
            spread = settings.router.close_spread_seconds
            open_clients: OpenClients = app[CLIENTS]
            await close_spread(list(open_clients), spread, signals.hurry)
    logger.info("stopped")


def _as_worker(app: web.Application, worker: WorkerRole) -> Affinity:
    """Make ``app`` one worker's front door (before its runner is set up): ``/metrics``
    answers for every worker, and Streamable HTTP requests reach the worker that holds
    their connection (the middleware returned, to be entered for the serving)."""
    every_worker: Callable[[], Awaitable[bytes]] = WorkersExposition(
        worker.sockets, own=(worker.index, app[METRICS])
    )
    app[EXPOSITION] = every_worker
    affinity = Affinity(worker, app[HTTP_FRONT])
    app.middlewares.append(affinity.middleware)
    return affinity


def _sibling_app(app: web.Application) -> web.Application:
    """What the other workers of a router ask this one, on its Unix socket
    (:mod:`router.server.workers`): its own registry at ``/metrics``, and the Streamable
    HTTP requests of its connections that reached another worker. Those go to this
    worker's HTTP front and its door (origin and token checked again); their TCP
    connections were counted by the worker they came to."""
    siblings = web.Application(client_max_size=app[SETTINGS].router.max_message_bytes + 1)
    # what the handlers below read, the door's checks included
    siblings[METRICS] = app[METRICS]
    siblings[DOOR] = app[DOOR]
    siblings[TOKENS] = app[TOKENS]
    siblings[HTTP_FRONT] = app[HTTP_FRONT]
    siblings[EXPOSITION] = _exposition_of(app[METRICS])
    siblings.router.add_get("/metrics", _metrics)
    siblings.router.add_get("/acp", _acp_stream, allow_head=False)
    siblings.router.add_post("/acp", _acp_post)
    siblings.router.add_delete("/acp", _acp_delete)
    return siblings


async def _acp_stream(request: web.Request) -> web.StreamResponse:
    return await request.app[HTTP_FRONT].stream(request)


def app_runner(app: web.Application, **kwargs: Any) -> web.AppRunner:
    """The runner of the router's application: an idle HTTP keep-alive connection is
    closed after ``router.handshake_timeout_ms`` too (aiohttp's default is an hour).
    Start its site with :func:`router.server.accepting.listen`."""
    keepalive = app[SETTINGS].router.handshake_timeout_ms / 1000
    return web.AppRunner(app, handle_signals=False, keepalive_timeout=keepalive, **kwargs)


async def serve_metrics(
    stack: contextlib.AsyncExitStack,
    exposition: Callable[[], Awaitable[bytes]],
    host: str,
    port: int,
    *,
    what: str = "metrics",
) -> None:
    """Serve ``/metrics`` alone on ``host:port`` (``router.metrics_address``) until
    ``stack`` closes; the log says where, as ``what``."""
    runner = web.AppRunner(create_metrics_app(exposition), handle_signals=False, access_log=None)
    await runner.setup()
    stack.push_async_callback(runner.cleanup)
    await web.TCPSite(runner, host, port).start()
    logger.info("%s on http://%s:%d/metrics", what, host, runner.addresses[0][1])


async def drain(app: web.Application, seconds: float, hurry: asyncio.Event | None = None) -> None:
    """Stop taking clients and report not-ready for ``seconds`` (so load balancers and
    Kubernetes take this replica out), while connected clients carry on; the caller
    then closes them. ``hurry`` (a second stop signal) cuts the window short."""
    app[DRAINING].set()
    if seconds > 0:
        logger.info("draining for %.1f s", seconds)
        await wait_unless(hurry or asyncio.Event(), seconds)
