"""Every TCP connection of the front door, from accept to its first request.

aiohttp reads a request line and headers for as long as a client cares to send them,
and counts nothing before a handler runs: 1,500 connections trickling headers, or 500
that send nothing, would hold their file descriptors for good. So each connection is
seen here as it is accepted, before it has said anything:

- it counts against ``router.max_connections`` and
  ``router.max_connections_per_address`` from that moment until it closes (past either,
  it is answered at once: HTTP 503 or 429, and closed);
- it must send its whole request (``GET /acp``'s line and headers, or any other) within
  ``router.handshake_timeout_ms``, else it gets HTTP 408 and is closed; once a request
  is handled, aiohttp's keep-alive timeout (set to the same) closes it when idle;
- it is refused (HTTP 503) when its own descriptor number reaches
  :data:`FD_REFUSE_FRACTION` of the process's ``RLIMIT_NOFILE``: Linux hands out the
  lowest free descriptor, so at least that many are open, and the router keeps the rest
  for backend links and the files it reads.

Each accepted connection is a :class:`FrontDoor`: it tells the guard when it comes and
goes, and reads the head of the first request itself. A WebSocket upgrade of ``/acp``
(the router's clients) is handed to the router's own WebSocket (the app's
:data:`WEBSOCKET` entry: no aiohttp objects for its life); any other request, and
everything after it on that connection, to aiohttp's request handler, whose middleware
(:meth:`ConnectionGuard.middleware`) marks the first request. :func:`listen` starts a
site whose connections come in through the front door. With TLS a connection is seen
once its TLS handshake is done (asyncio bounds the TLS handshake itself, 60 s).
"""

from __future__ import annotations

import asyncio
import logging
import resource
import socket
import ssl
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from http import HTTPStatus
from typing import cast

from aiohttp import web

from router.core.quotas import Client, ClientPlaces, ConnectionCounts, Full, Taken
from router.server.config import RouterSection
from router.server.observability.metrics import Metrics

logger = logging.getLogger(__name__)

#: new connections are refused once their descriptor reaches this share of RLIMIT_NOFILE
FD_REFUSE_FRACTION = 0.9


def fd_refuse_at() -> int | None:
    """The descriptor number from which connections are refused (None: no limit)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return None
    return int(soft * FD_REFUSE_FRACTION)


@dataclass(slots=True)
class _Accepted:
    address: str
    #: the handshake deadline, until the connection's first request is handled
    deadline: asyncio.TimerHandle | None


#: how the app serves a WebSocket upgrade of ``/acp`` that a connection opened with: the
#: transport and every byte read so far (the request's head and whatever followed); the
#: protocol that takes the connection's bytes from then on (None: answered, closing)
WebSocketEntry = Callable[[asyncio.Transport, bytes], asyncio.Protocol | None]
WEBSOCKET: web.AppKey[WebSocketEntry] = web.AppKey("websocket")

#: the longest first request head read here; a longer one is aiohttp's to refuse
MAX_HEAD = 16 * 1024


class ConnectionGuard:
    """Limits and the handshake deadline of every TCP connection of one front door."""

    def __init__(
        self,
        settings: RouterSection,
        metrics: Metrics,
        per_address: ConnectionCounts,
        refuse_fd_at: int | None = None,
    ) -> None:
        self._seconds = settings.handshake_timeout_ms / 1000
        self._max = settings.max_connections
        self._per_address = per_address
        self._metrics = metrics
        self._refuse_fd_at = fd_refuse_at() if refuse_fd_at is None else refuse_fd_at
        self._open: dict[FrontDoor, _Accepted] = {}
        metrics.fd_refuse_at.set(self._refuse_fd_at or 0)

    @property
    def open(self) -> int:
        """TCP connections counted now (any state: handshake, WebSocket, keep-alive)."""
        return len(self._open)

    @web.middleware
    async def middleware(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        """Ends the handshake deadline of the connection a request came on."""
        door = request.transport.get_protocol() if request.transport is not None else None
        if isinstance(door, FrontDoor):
            self.started(door)
        return await handler(request)

    def started(self, handler: FrontDoor) -> None:
        """``handler``'s first request has come whole: its handshake deadline ends."""
        accepted = self._open.get(handler)
        if accepted is not None and accepted.deadline is not None:
            accepted.deadline.cancel()
            accepted.deadline = None
            self._metrics.handshaking.dec()

    def accepted(self, handler: FrontDoor, transport: asyncio.Transport) -> None:
        """A connection was accepted: count it, or answer and close it."""
        peer = transport.get_extra_info("peername")
        address = str(peer[0]) if peer else "unknown"
        refusal = self._admit(transport, address)
        if refusal is not None:
            answer(transport, *refusal)
            return
        loop = asyncio.get_running_loop()
        deadline = loop.call_later(self._seconds, self._expire, handler)
        self._open[handler] = _Accepted(address, deadline)
        self._metrics.handshaking.inc()
        self._metrics.open_connections.set(len(self._open))

    def _admit(self, transport: asyncio.Transport, address: str) -> tuple[int, str] | None:
        """Count this connection against its address (:func:`admit`), or why it is refused
        at once (HTTP status and text), counted: near the open-file limit, or too many."""
        metrics = self._metrics
        sock = transport.get_extra_info("socket")
        fd = sock.fileno() if sock is not None else -1
        if self._refuse_fd_at is not None and fd >= self._refuse_fd_at:
            metrics.connections.labels("fd_limit").inc()
            logger.warning("refused a connection: %d descriptors open or more", fd)
            return 503, "the router is near its open-file limit: try another replica\n"
        return admit(metrics, self._per_address, address, open_now=len(self._open), most=self._max)

    def _expire(self, handler: FrontDoor) -> None:
        accepted = self._open.get(handler)
        if accepted is None or accepted.deadline is None:
            return
        accepted.deadline = None
        self._metrics.handshaking.dec()
        self._metrics.connections.labels("handshake_timeout").inc()
        ms = round(self._seconds * 1000)
        if handler.transport is not None:
            answer(handler.transport, 408, f"no request within {ms} ms\n")

    def lost(self, handler: FrontDoor) -> None:
        """A connection is gone."""
        accepted = self._open.pop(handler, None)
        if accepted is None:
            return
        self._per_address.close(accepted.address)
        if accepted.deadline is not None:
            accepted.deadline.cancel()
            self._metrics.handshaking.dec()
        self._metrics.open_connections.set(len(self._open))


def admit(
    metrics: Metrics, per_address: ConnectionCounts, address: str, *, open_now: int, most: int
) -> tuple[int, str] | None:
    """Count one more TCP connection from ``address`` (given back with
    ``per_address.close``), or why it is refused (HTTP status and text), counted: too
    many in all (503), or from there (429)."""
    if open_now >= most:
        return _full(metrics, "process")
    if not per_address.open(address):
        return _full(metrics, "address")
    return None


def take_place(metrics: Metrics, places: ClientPlaces, client: Client) -> Taken | tuple[int, str]:
    """A place for a new client connection (WebSocket or Streamable HTTP) of ``client``
    (given back with ``places.give_back``; end the connections it ``reclaimed``), or why
    it is refused (HTTP status and text), counted: too many in all (503), or for that
    token or address (429)."""
    taken = places.take(client)
    return _full(metrics, taken.scope) if isinstance(taken, Full) else taken


#: each refusal of a connection limit: its result label, the limited label, its answer
_FULL = {
    "process": ("rejected", None, 503, "too many connections\n"),
    "address": ("address_limit", "connections_per_address", 429, "too many connections from your address\n"),
    "principal": ("principal_limit", "connections_per_principal", 429, "too many connections with your token\n"),
}  # fmt: skip


def _full(metrics: Metrics, scope: str) -> tuple[int, str]:
    result, limit, status, text = _FULL[scope]
    metrics.connections.labels(result).inc()
    if limit is not None:
        metrics.limited.labels(limit).inc()
    return status, text


def answer(
    transport: asyncio.Transport,
    status: int,
    text: str,
    headers: Mapping[str, str] | None = None,
) -> None:
    """Write a whole HTTP response (the connection has no request being handled) and
    close: the client reads a status, not a reset.

    Closing a socket whose peer's bytes are still unread makes the kernel answer with a
    reset, which can discard the response before the client reads it (a client that sent
    its request before this one was accepted, or a body after its head). So the response
    is followed by a FIN, and the connection :class:`Lingering` until the client closes.
    """
    body = text.encode()
    extra = "".join(f"{name}: {value}\r\n" for name, value in (headers or {}).items())
    head = (
        f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\n"
        f"Content-Type: text/plain; charset=utf-8\r\n{extra}"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    if transport.is_closing():
        return
    # no isinstance check of the transport: uvloop's are not asyncio.Transport subclasses
    transport.write(head.encode() + body)
    if transport.can_write_eof():  # not over TLS, whose close sends its own close_notify
        transport.write_eof()
    transport.set_protocol(Lingering(transport, transport.get_protocol()))


#: how long an answered connection is read (and what it sends dropped) before it is closed
LINGER_SECONDS = 1.0
#: the most an answered connection may send before it is closed at once
LINGER_BYTES = 64 * 1024


class Lingering(asyncio.Protocol):
    """A connection answered and closing: what the client still sends is read and dropped
    until it closes (its EOF), for :data:`LINGER_SECONDS` at most and
    :data:`LINGER_BYTES` at most; the protocol it had still hears that it is lost."""

    __slots__ = ("_left", "_then", "_timer", "_transport")

    def __init__(self, transport: asyncio.Transport, then: asyncio.BaseProtocol) -> None:
        self._transport = transport
        self._then = then
        self._left = LINGER_BYTES
        self._timer = asyncio.get_running_loop().call_later(LINGER_SECONDS, transport.close)

    def data_received(self, data: bytes) -> None:
        self._left -= len(data)
        if self._left < 0:
            self._transport.close()

    def eof_received(self) -> bool | None:
        return None  # the transport closes

    def connection_lost(self, exc: Exception | None) -> None:
        self._timer.cancel()
        self._then.connection_lost(exc)


class FrontDoor(asyncio.Protocol):
    """One TCP connection of the front door, from accept to close.

    The guard counts it while it lives. Until the head of its first request is read
    whole (within the handshake deadline), the bytes stay here; then the connection is
    handed on for good: to the app's :data:`WEBSOCKET` entry when the request is a
    WebSocket upgrade of ``/acp``, else to an aiohttp request handler, which may itself
    hand an upgrade it reads later (a kept-alive connection's) to a WebSocket
    (:meth:`adopt`). The front door stays the transport's protocol and passes every
    callback on to whoever holds the connection.
    """

    __slots__ = ("_entry", "_guard", "_head", "_http", "_inner", "_server", "transport")

    def __init__(
        self, guard: ConnectionGuard, server: web.Server, entry: WebSocketEntry | None
    ) -> None:
        self._guard = guard
        self._server = server
        self._entry = entry
        self.transport: asyncio.Transport | None = None
        self._head = b""
        #: who takes the connection's bytes (None: its first head is still being read)
        self._inner: asyncio.Protocol | None = None
        #: the aiohttp request handler, once the connection is handed to one
        self._http: asyncio.BaseProtocol | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self._guard.accepted(self, self.transport)

    def data_received(self, data: bytes) -> None:
        inner = self._inner
        if inner is not None:
            inner.data_received(data)
            return
        head = self._head + data if self._head else data
        end = head.find(b"\r\n\r\n")
        if end < 0 and len(head) <= MAX_HEAD:
            self._head = head
            return
        self._head = b""
        transport = self.transport
        assert transport is not None
        if end >= 0 and self._entry is not None and wants_websocket(head[:end]):
            self._guard.started(self)
            self._inner = self._entry(transport, head)
            return
        handler = self._server()
        self._inner = self._http = handler
        handler.connection_made(transport)
        handler.data_received(head)

    def adopt(self, websocket: asyncio.Protocol) -> None:
        """From now on the connection's bytes go to ``websocket`` (an upgrade that the
        aiohttp handler read); the handler still hears when the connection is lost."""
        self._inner = websocket

    def eof_received(self) -> bool | None:
        if self._inner is None:
            return None  # the transport closes
        return self._inner.eof_received()

    def pause_writing(self) -> None:
        if self._inner is not None:
            self._inner.pause_writing()

    def resume_writing(self) -> None:
        if self._inner is not None:
            self._inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        self._guard.lost(self)
        inner, http = self._inner, self._http
        self._inner = self._http = None
        if http is not None:
            http.connection_lost(exc)
        if inner is not None and inner is not http:
            inner.connection_lost(exc)


def wants_websocket(head: bytes) -> bool:
    """Whether a request head (without its closing blank line) is ``GET /acp`` (with or
    without a query) with ``Upgrade: websocket``: the upgrade the router serves itself.
    Anything else, or any other spelling, is aiohttp's (which routes it as it should)."""
    line, _, fields = head.partition(b"\r\n")
    parts = line.split(b" ")
    if len(parts) != 3 or parts[0] != b"GET" or parts[1].partition(b"?")[0] != b"/acp":
        return False
    for field in fields.split(b"\r\n"):
        name, _, value = field.partition(b":")
        if name.strip().lower() == b"upgrade":
            return value.strip().lower() == b"websocket"
    return False


class FrontDoorSite(web.BaseSite):
    """A listening socket (a host and port, or one made elsewhere) whose connections
    come in through the :class:`FrontDoor` of ``guard``."""

    __slots__ = ("_door", "_host", "_port", "_sock")

    def __init__(
        self,
        runner: web.AppRunner,
        guard: ConnectionGuard,
        *,
        host: str | None = None,
        port: int = 0,
        sock: socket.socket | None = None,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        super().__init__(runner, ssl_context=ssl_context)
        server = runner.server
        assert server is not None, "set the runner up first"
        entry = runner.app.get(WEBSOCKET)
        self._door = lambda: FrontDoor(guard, server, entry)
        self._host, self._port, self._sock = host, port, sock

    @property
    def name(self) -> str:
        scheme = "https" if self._ssl_context else "http"
        return f"{scheme}://{self._host}:{self._port}"

    async def start(self) -> None:
        await super().start()
        loop = asyncio.get_running_loop()
        if self._sock is not None:
            self._server = await loop.create_server(
                self._door, sock=self._sock, ssl=self._ssl_context, backlog=self._backlog
            )
        else:
            self._server = await loop.create_server(
                self._door, self._host, self._port, ssl=self._ssl_context, backlog=self._backlog
            )


async def listen(
    runner: web.AppRunner,
    guard: ConnectionGuard,
    host: str,
    port: int,
    tls: ssl.SSLContext | None = None,
) -> web.BaseSite:
    """Start a site for ``runner`` (set up already) with ``guard`` on every connection."""
    site = FrontDoorSite(runner, guard, host=host, port=port, ssl_context=tls)
    await site.start()
    return site


async def listen_on(
    runner: web.AppRunner,
    guard: ConnectionGuard,
    sockets: Sequence[socket.socket],
    tls: ssl.SSLContext | None,
) -> None:
    """Serve on listening sockets made elsewhere (a worker's, from its parent), with
    ``guard`` on every connection, as :func:`listen` does."""
    for sock in sockets:
        await FrontDoorSite(runner, guard, sock=sock, ssl_context=tls).start()
