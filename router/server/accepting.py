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

The guard hooks aiohttp's ``web.Server`` (the per-connection ``connection_made`` and
``connection_lost`` it is told of by each ``RequestHandler``) and a middleware that marks
a connection's first request; :func:`listen` installs both on a runner and starts its
site. With TLS a connection is seen once its TLS handshake is done (asyncio bounds the
TLS handshake itself, 60 s).
"""

from __future__ import annotations

import asyncio
import logging
import resource
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

from router.core.quotas import Client, ClientPlaces, ConnectionCounts, Full, Taken
from router.server.config import RouterSection
from router.server.metrics import Metrics

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
        self._open: dict[RequestHandler, _Accepted] = {}
        metrics.fd_refuse_at.set(self._refuse_fd_at or 0)

    @property
    def open(self) -> int:
        """TCP connections counted now (any state: handshake, WebSocket, keep-alive)."""
        return len(self._open)

    def install(self, server: web.Server) -> None:
        """Hear of every connection ``server`` accepts and loses.

        aiohttp has no hook for this: each ``RequestHandler`` calls its server's
        ``connection_made`` and ``connection_lost``, so this instance's are wrapped.
        """
        made, lost = server.connection_made, server.connection_lost

        def connection_made(handler: RequestHandler, transport: asyncio.Transport) -> None:
            made(handler, transport)
            self._accepted(handler, transport)

        def connection_lost(handler: RequestHandler, exc: BaseException | None = None) -> None:
            lost(handler, exc)
            self._lost(handler)

        server.connection_made = connection_made  # type: ignore[method-assign]
        server.connection_lost = connection_lost  # type: ignore[method-assign]

    @web.middleware
    async def middleware(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        """Ends the handshake deadline of the connection a request came on."""
        protocol = request.protocol
        if isinstance(protocol, RequestHandler):
            self.started(protocol)
        return await handler(request)

    def started(self, handler: RequestHandler) -> None:
        accepted = self._open.get(handler)
        if accepted is not None and accepted.deadline is not None:
            accepted.deadline.cancel()
            accepted.deadline = None
            self._metrics.handshaking.dec()

    def _accepted(self, handler: RequestHandler, transport: asyncio.Transport) -> None:
        peer = transport.get_extra_info("peername")
        address = str(peer[0]) if peer else "unknown"
        refusal = self._refusal(transport, address)
        if refusal is not None:
            _answer(transport, *refusal)
            return
        loop = asyncio.get_running_loop()
        deadline = loop.call_later(self._seconds, self._expire, handler)
        self._open[handler] = _Accepted(address, deadline)
        self._metrics.handshaking.inc()
        self._metrics.open_connections.set(len(self._open))

    def _refusal(self, transport: asyncio.Transport, address: str) -> tuple[int, str] | None:
        """Why this connection is refused at once (HTTP status and text), or None, counted;
        an admitted one is counted against its address."""
        metrics = self._metrics
        sock = transport.get_extra_info("socket")
        fd = sock.fileno() if sock is not None else -1
        if self._refuse_fd_at is not None and fd >= self._refuse_fd_at:
            metrics.connections.labels("fd_limit").inc()
            logger.warning("refused a connection: %d descriptors open or more", fd)
            return 503, "the router is near its open-file limit: try another replica\n"
        return admit(metrics, self._per_address, address, open_now=len(self._open), most=self._max)

    def _expire(self, handler: RequestHandler) -> None:
        accepted = self._open.get(handler)
        if accepted is None or accepted.deadline is None:
            return
        accepted.deadline = None
        self._metrics.handshaking.dec()
        self._metrics.connections.labels("handshake_timeout").inc()
        ms = round(self._seconds * 1000)
        if handler.transport is not None:
            _answer(handler.transport, 408, f"no request within {ms} ms\n")
        handler.force_close()

    def _lost(self, handler: RequestHandler) -> None:
        accepted = self._open.pop(handler, None)
        if accepted is None:
            return
        self._per_address.close(accepted.address)
        if accepted.deadline is not None:
            accepted.deadline.cancel()
            self._metrics.handshaking.dec()
        self._metrics.open_connections.set(len(self._open))


_REASONS = {408: "Request Timeout", 429: "Too Many Requests", 503: "Service Unavailable"}


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


def _answer(transport: asyncio.BaseTransport, status: int, text: str) -> None:
    """Write a whole HTTP response (the connection has no request being handled) and
    close: the client reads a status, not a reset."""
    body = text.encode()
    head = (
        f"HTTP/1.1 {status} {_REASONS[status]}\r\nContent-Type: text/plain; charset=utf-8\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    if isinstance(transport, asyncio.WriteTransport) and not transport.is_closing():
        transport.write(head.encode() + body)
    transport.close()


async def listen(
    runner: web.AppRunner,
    guard: ConnectionGuard,
    host: str,
    port: int,
    tls: ssl.SSLContext | None = None,
) -> web.TCPSite:
    """Start a site for ``runner`` (set up already) with ``guard`` on every connection."""
    server = runner.server
    assert server is not None, "set the runner up first"
    guard.install(server)
    site = web.TCPSite(runner, host, port, ssl_context=tls)
    await site.start()
    return site
