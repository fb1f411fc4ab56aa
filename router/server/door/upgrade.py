"""A WebSocket upgrade of ``/acp``: the door's checks (:mod:`router.server.door.admission`),
the handshake answered, and the client connection served on the router's own WebSocket
(:mod:`router.server.links.websocket`), whether the upgrade opened its TCP connection (the
front door hands it over: :func:`websocket_entry`) or came on one aiohttp holds
(:func:`upgrade_held`). An upgraded client must send ``initialize`` within
``router.initialize_timeout_ms``, else its connection is closed with 1008
(docs/architecture.md, "Every rule and its file").
"""

from __future__ import annotations

import asyncio
from typing import Any, NamedTuple, cast

from aiohttp import hdrs, web
from websockets.extensions.permessage_deflate import ServerPerMessageDeflateFactory
from websockets.http11 import Request as WsRequest
from websockets.protocol import Protocol
from websockets.server import ServerProtocol

from router.core import ending
from router.core.frontdoor import Admitted
from router.core.quotas import Seat
from router.protocol import acp
from router.protocol.ids import new_connection_id
from router.server.connection.client import ClientConnection
from router.server.connection.websocket_channel import WebSocketChannel
from router.server.door.accepting import FrontDoor, WebSocketEntry, answer
from router.server.door.admission import (
    admit_client,
    close_client,
    open_client,
    place_client,
    refuse_while_draining,
)
from router.server.door.app_keys import CLIENTS, METRICS, PLACES, SETTINGS
from router.server.links import waiting
from router.server.links.sansio_websocket import opened
from router.server.links.websocket import FRAMES_LOG, WebSocket
from router.server.observability import log_context


async def upgrade_held(request: web.Request) -> web.StreamResponse:
    """Serve a WebSocket upgrade of ``/acp`` that came on a connection aiohttp holds (one
    kept alive after an earlier request; a connection that opens with the upgrade never
    reaches aiohttp: :func:`websocket_entry`), until the connection is gone."""
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
    await waiting.closed(served)
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


def websocket_entry(app: web.Application) -> WebSocketEntry:
    """How a connection that opens with a WebSocket upgrade of ``/acp`` is served (the
    front door hands it over with the bytes read so far): a refusal is answered and the
    connection closed."""

    def entry(transport: asyncio.Transport, data: bytes) -> asyncio.Protocol | None:
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
    place: Seat


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
    refused = refuse_while_draining(app)
    if refused is not None:
        return refused
    admission = admit_client(
        app, _field(upgrade, "Origin"), _field(upgrade, "Authorization"), address
    )
    if not isinstance(admission, Admitted):
        return admission
    place = place_client(app, admission, address)
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
    connection = channel.connection = open_client(
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


def _client_gone(app: web.Application, channel: WebSocketChannel, place: Seat) -> None:
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
            close_client(app, connection)
            app[PLACES].give_back(place)

    app[CLIENTS].closing(end())


def _initialize_deadline_passed(
    app: web.Application, connection: ClientConnection, ms: int
) -> None:
    """Close ``connection`` (1008) if it has not sent ``initialize`` by now."""
    if not connection.initialized:
        app[METRICS].connections.labels("initialize_timeout").inc()
        app[CLIENTS].closing(connection.shut(ending.no_initialize(ms)))
