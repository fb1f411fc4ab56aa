"""The Streamable HTTP transport of the front door (ACP's transport RFD): ``POST /acp``
carries the client's frames, ``GET /acp`` opens server-sent event streams (one for the
connection, one per session), ``DELETE /acp`` ends the connection.

A connection starts with a POSTed ``initialize``, answered 200 with its JSON-RPC answer
and a fresh ``Acp-Connection-Id``; every later request names it, and is answered 202
(its JSON-RPC answer follows on an event stream). Each connection is one
:class:`~router.server.connection.client.ClientConnection`, routed by the same core as a WebSocket
client's; the :class:`~router.server.door.http_connection.HttpConnection` is the channel it
writes through, onto the event stream (:mod:`router.server.door.event_stream`) that
:mod:`router.core.streams` chooses; a POST's body is read by
:mod:`router.server.door.request_bodies`. The front door's checks are the application's
(:class:`Door`): origin and token on every request, draining and the connection limits
when a connection starts (docs/architecture.md, "Every rule and its file").

Each connection has one owned task (:meth:`HttpFront._live`) that waits for its end
(DELETE, the idle deadline, a stream that overflows, or the router closing it), then
ends the client connection and its event streams. One reaper task ends the connections
that have had no stream open and no POST for ``router.http_idle_seconds``. An event
stream whose client has gone is noticed at its next write, at the latest the next
keepalive (``router.http_keepalive_seconds``); a frame whose write fails is lost (the
RFD's v1 replays nothing).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Iterable
from typing import Protocol

from aiohttp import hdrs, web

from router.core.frontdoor import Admitted
from router.core.quotas import ByteBudget, Seat
from router.core.streams import Opened, Rejected, StreamKey
from router.protocol import acp
from router.protocol.errors import InvalidRequest, ParseError
from router.protocol.ids import ConnectionId, SessionId
from router.protocol.jsonrpc import Message, Request
from router.protocol.reading import parse
from router.server.config import RouterSection
from router.server.connection.client import ClientConnection
from router.server.connection.client_links import ClientChannel
from router.server.door.event_stream import EventStream, event
from router.server.door.http_answers import text_response
from router.server.door.http_connection import Entry, HttpConnection
from router.server.door.request_bodies import Bodies
from router.server.observability import log_context
from router.server.observability.metrics import Metrics
from router.tasks import cancel_and_wait

logger = logging.getLogger(__name__)

#: Accept values that include text/event-stream
_EVENT_STREAM_RANGES = frozenset({"text/event-stream", "text/*", "*/*"})


class Door(Protocol):
    """The front door's checks and bookkeeping, shared with the WebSocket upgrade
    (:class:`router.server.door.admission.HttpDoor`)."""

    def admit(self, request: web.Request) -> Admitted | web.Response:
        """The origin and the token of any request: who it is, or the refusal."""

    def enter(self, request: web.Request, admission: Admitted) -> Entry | web.Response:
        """A new connection: draining, then the limits (per address, in all)."""

    def start(self, channel: ClientChannel, entry: Entry) -> ClientConnection:
        """The client connection, counted among the open ones."""

    def finish(self, connection: ClientConnection, entry: Entry) -> None:
        """The client connection has ended: uncount it, free its place."""


def accepts_events(accept: str | None) -> bool:
    """Whether an ``Accept`` header value includes ``text/event-stream``."""
    if accept is None:
        return False
    ranges = (part.split(";", 1)[0].strip().lower() for part in accept.split(","))
    return any(media in _EVENT_STREAM_RANGES for media in ranges)


def _failed(connection: HttpConnection) -> web.Response:
    """What the one boundary catch of a connection answers, once it logged the failure:
    the connection ends."""
    connection.end("error")
    return text_response(500, "the router failed; the connection has ended")


class HttpFront:
    """The Streamable HTTP connections of the front door, by ``Acp-Connection-Id``
    (bounded with the WebSocket ones by ``router.max_connections``: :class:`Door`)."""

    def __init__(self, settings: RouterSection, metrics: Metrics, door: Door) -> None:
        self.settings = settings
        #: how long an event stream may keep a frame waiting on a client that does not
        #: read (a WebSocket client is dropped after about as long without a pong)
        self.write_timeout = 2 * settings.http_keepalive_seconds
        self.metrics = metrics
        self.door = door
        #: what every connection holds together: bodies being read, frames held
        self.budget = ByteBudget(settings.max_held_bytes)
        self.bodies = Bodies(self.budget, settings, metrics)
        self.connections: dict[ConnectionId, HttpConnection] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """Reap idle connections while the block runs; end every connection after it."""
        reaper = asyncio.create_task(self._reap(), name="http-reaper")
        try:
            yield
        finally:
            await cancel_and_wait(reaper)
            for connection in list(self.connections.values()):
                connection.end("closed")
            await asyncio.gather(*self._tasks, return_exceptions=True)

    # -- the handlers -------------------------------------------------------------------------

    async def post(self, request: web.Request) -> web.Response:
        response = await self._post(request)
        self.metrics.http_requests.labels("POST", str(response.status)).inc()
        return response

    async def stream(self, request: web.Request) -> web.StreamResponse:
        """A GET without an upgrade: open an event stream, until it ends."""
        refused = self._open_stream(request)
        if isinstance(refused, web.Response):
            self.metrics.http_requests.labels("GET", str(refused.status)).inc()
            return refused
        connection, key, attached = refused
        self.metrics.http_requests.labels("GET", "200").inc()
        response = web.StreamResponse(
            headers={
                hdrs.CONTENT_TYPE: "text/event-stream",
                hdrs.CACHE_CONTROL: "no-store",
                "X-Accel-Buffering": "no",  # nginx: pass events on as they come
            }
        )
        stream = EventStream(request, response, write_timeout=self.write_timeout)
        connection.opened(attached, stream)
        with connection.in_use():
            try:
                await response.prepare(request)
                await self._flush(connection, key, attached.reader, stream)
                await stream.keep_alive(self.settings.http_keepalive_seconds)
            except ConnectionError:
                pass  # the client went while the stream opened
            finally:
                connection.closed(key, attached.reader)
        return response

    async def delete(self, request: web.Request) -> web.Response:
        response = await self._delete(request)
        self.metrics.http_requests.labels("DELETE", str(response.status)).inc()
        return response

    # -- POST ---------------------------------------------------------------------------------

    async def _post(self, request: web.Request) -> web.Response:
        admission = self.door.admit(request)
        if isinstance(admission, web.Response):
            return admission
        if request.content_type != "application/json":
            return text_response(415, "POST a JSON-RPC message as application/json")
        async with self.bodies.read(request) as raw:
            if isinstance(raw, web.Response):
                return raw
            return await self._handle_post(request, admission, raw)

    async def _handle_post(
        self, request: web.Request, admission: Admitted, raw: bytes | bytearray
    ) -> web.Response:
        """A POST whose body was read: its frame, to a new connection or an open one."""
        try:
            body = raw.decode()
        except UnicodeDecodeError:
            return text_response(400, "the body is not UTF-8")
        shape = body.lstrip()[:1]
        if shape == "[":
            return text_response(501, "batches are not supported: POST one JSON-RPC message")
        if shape != "{":
            return text_response(400, "POST one JSON-RPC message, a JSON object")
        try:
            message: Message | None = parse(body)
        except ParseError:
            return text_response(400, "the body is not JSON")
        except InvalidRequest:
            message = None  # the routing core answers it, on the connection stream
        connection_id = request.headers.get(acp.CONNECTION_ID_HEADER)
        if connection_id is None:
            if isinstance(message, Request) and message.method == acp.INITIALIZE:
                return await self._start(request, admission, message)
            return text_response(400, "Acp-Connection-Id is required (POST initialize first)")
        connection = self._find(connection_id, admission)
        if connection is None:
            return text_response(404, "no such connection")
        rejected = connection.streams.post(message, request.headers.get(acp.SESSION_ID_HEADER))
        if rejected is not None:
            return text_response(rejected.status, rejected.text)
        connection.touch()
        log_context.connection.set(connection.number)
        try:
            with connection.in_use():
                received = await connection.receive(body)
        except Exception:  # the one boundary catch of a connection: log it, end it
            logger.exception("client connection failed")
            return _failed(connection)
        if not received:
            return text_response(404, "no such connection")
        return web.Response(status=202)

    async def _start(
        self, request: web.Request, admission: Admitted, initialize: Request
    ) -> web.Response:
        """A new connection, with the answer to its ``initialize``."""
        entry = self.door.enter(request, admission)
        if isinstance(entry, web.Response):
            return entry
        connection = HttpConnection(entry, self.settings, self.metrics, self.budget)
        connection.number = log_context.new_connection()
        connection.client = self.door.start(connection, entry)
        self.connections[connection.id] = connection
        task = asyncio.create_task(self._live(connection), name="http-connection")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        try:
            async with asyncio.timeout(self.settings.connect_timeout_ms / 1000):
                with connection.in_use():
                    answer = await connection.initialize(initialize)
        except TimeoutError:
            connection.end("closed")
            return text_response(504, "initialize was not answered in time")
        except Exception:  # the one boundary catch of a connection: log it, end it
            logger.exception("client connection failed")
            return _failed(connection)
        return web.Response(
            text=answer,
            content_type="application/json",
            headers={acp.CONNECTION_ID_HEADER: connection.id},
        )

    async def _live(self, connection: HttpConnection) -> None:
        """Wait for ``connection`` to end, then end its client connection and streams."""
        try:
            await connection.ending.wait()
        finally:
            del self.connections[connection.id]
            for writer in connection.writers.values():
                writer.ended.set()
            assert connection.client is not None
            try:
                await connection.end_client()
            finally:
                connection.streams.drop()  # what it held, the last answers included
                self.door.finish(connection.client, connection.entry)
                self.metrics.http_ended.labels(connection.reason or "closed").inc()
                connection.done.set()
                logger.debug("Streamable HTTP connection ended: %s", connection.reason)

    # -- GET ----------------------------------------------------------------------------------

    def _open_stream(
        self, request: web.Request
    ) -> tuple[HttpConnection, StreamKey, Opened] | web.Response:
        admission = self.door.admit(request)
        if isinstance(admission, web.Response):
            return admission
        if not accepts_events(request.headers.get(hdrs.ACCEPT)):
            return text_response(
                406,
                "GET /acp is a WebSocket upgrade, or an event stream"
                " (Accept: text/event-stream, with Acp-Connection-Id)",
            )
        connection_id = request.headers.get(acp.CONNECTION_ID_HEADER)
        if connection_id is None:
            return text_response(
                400,
                "GET /acp is a WebSocket upgrade, or an event stream of a connection"
                " (Acp-Connection-Id: POST initialize first)",
            )
        connection = self._find(connection_id, admission)
        if connection is None:
            return text_response(404, "no such connection")
        session = request.headers.get(acp.SESSION_ID_HEADER)
        key = SessionId(session) if session is not None else None
        attached = connection.streams.attach(key)
        if isinstance(attached, Rejected):
            return text_response(attached.status, attached.text)
        return connection, key, attached

    async def _flush(
        self, connection: HttpConnection, key: StreamKey, reader: int, stream: EventStream
    ) -> None:
        """Write the frames held for the stream; new ones flow to it once none is left."""
        while (text := connection.streams.take(key, reader)) is not None:
            if not await stream.write(event(text)):
                return

    # -- DELETE -------------------------------------------------------------------------------

    async def _delete(self, request: web.Request) -> web.Response:
        admission = self.door.admit(request)
        if isinstance(admission, web.Response):
            return admission
        connection_id = request.headers.get(acp.CONNECTION_ID_HEADER)
        if connection_id is None:
            return text_response(400, "DELETE needs Acp-Connection-Id")
        connection = self._find(connection_id, admission)
        if connection is None:
            return text_response(404, "no such connection")
        connection.end("deleted")
        await connection.done.wait()
        return web.Response(status=202)

    def reclaim(self, places: Iterable[Seat]) -> None:
        """End the idle connections whose places went to newcomers."""
        reclaimed = set(places)
        if not reclaimed:
            return
        for connection in self.connections.values():
            if connection.entry.place in reclaimed:
                logger.info("Streamable HTTP connection idle: ending it, its place is needed")
                connection.end("reclaimed")

    def _find(self, connection_id: str, admission: Admitted) -> HttpConnection | None:
        """The connection, if it is there and the same client opened it."""
        connection = self.connections.get(ConnectionId(connection_id))
        if (
            connection is None
            or connection.ending.is_set()
            or connection.entry.admission.principal != admission.principal
        ):
            return None
        return connection

    # -- the idle deadline --------------------------------------------------------------------

    async def _reap(self) -> None:
        """End the connections with no stream open and no POST for the idle deadline;
        sleep until the next one could be due."""
        idle = self.settings.http_idle_seconds
        loop = asyncio.get_running_loop()
        while True:
            now = loop.time()
            wake = now + idle
            for connection in list(self.connections.values()):
                if connection.streams.open_streams:
                    continue
                due = connection.active_at + idle
                if due <= now:
                    logger.info("Streamable HTTP connection idle for %.0f s: ending it", idle)
                    connection.end("idle")
                else:
                    wake = min(wake, due)
            await asyncio.sleep(wake - now)
