"""The Streamable HTTP transport of the front door (ACP's transport RFD): ``POST /acp``
carries the client's frames, ``GET /acp`` opens server-sent event streams (one for the
connection, one per session), ``DELETE /acp`` ends the connection.

A connection starts with a POSTed ``initialize``, answered 200 with its JSON-RPC answer
and a fresh ``Acp-Connection-Id``; every later request names it, and is answered 202
(its JSON-RPC answer follows on an event stream). Each connection is one
:class:`~router.server.client.ClientConnection`, routed by the same core as a WebSocket
client's; the :class:`HttpConnection` is the channel it writes through, onto the event
stream :mod:`router.core.streams` chooses. The front door's checks are the
application's (:class:`Door`): origin and token on every request, draining and the
connection limits when a connection starts.

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
import re
from collections.abc import AsyncIterator, Iterable, Iterator
from dataclasses import dataclass
from typing import Protocol

from aiohttp import hdrs, web

from router.core.frontdoor import Admitted
from router.core.quotas import ByteBudget, ClientPlaces, Place
from router.core.streams import (
    Attached,
    EventStreams,
    Held,
    Overflow,
    Rejected,
    StreamKey,
    Write,
)
from router.protocol import acp
from router.protocol.errors import InvalidRequest, ParseError
from router.protocol.ids import ConnectionId, SessionId, new_connection_id
from router.protocol.jsonrpc import Message, Request, RequestId
from router.protocol.reading import parse
from router.server import log_context
from router.server.client import ClientChannel, ClientConnection
from router.server.config import RouterSection
from router.server.metrics import Metrics
from router.tasks import cancel_and_wait

logger = logging.getLogger(__name__)

KEEPALIVE = b": keepalive\n\n"
#: what a POST refused for ``router.max_held_bytes`` is told to wait
RETRY_AFTER_SECONDS = 1
_LINE_BREAK = re.compile(r"\r\n|\r|\n")
#: Accept values that include text/event-stream
_EVENT_STREAM_RANGES = frozenset({"text/event-stream", "text/*", "*/*"})


@dataclass(frozen=True, slots=True)
class Entry:
    """A client let in as a new connection; its ``place`` among ``places`` is held
    until :meth:`Door.finish` (or until it is reclaimed while idle:
    :meth:`HttpFront.reclaim`)."""

    admission: Admitted
    address: str
    place: Place
    places: ClientPlaces


class Door(Protocol):
    """The front door's checks and bookkeeping, shared with the WebSocket upgrade
    (:mod:`router.server.app`)."""

    def admit(self, request: web.Request) -> Admitted | web.Response:
        """The origin and the token of any request: who it is, or the refusal."""

    def enter(self, request: web.Request, admission: Admitted) -> Entry | web.Response:
        """A new connection: draining, then the limits (per address, in all)."""

    def start(self, channel: ClientChannel, entry: Entry) -> ClientConnection:
        """The client connection, counted among the open ones."""

    def finish(self, connection: ClientConnection, entry: Entry) -> None:
        """The client connection has ended: uncount it, free its place."""


def event(text: str) -> bytes:
    """One frame as a server-sent event. JSON text has line breaks only as whitespace
    between tokens; each line becomes a ``data:`` line, which the client joins back."""
    if "\n" not in text and "\r" not in text:
        return f"data: {text}\n\n".encode()
    return "".join(f"data: {line}\n" for line in _LINE_BREAK.split(text)).encode() + b"\n"


class EventStream:
    """One open ``GET``: a server-sent event stream to the client.

    A write that the client does not take within ``write_timeout`` seconds (it keeps the
    connection open and reads nothing) ends the stream and drops its connection, as a
    WebSocket client that stops answering pings is dropped: the frames for it never
    wait longer than that.
    """

    def __init__(
        self, request: web.Request, response: web.StreamResponse, write_timeout: float
    ) -> None:
        self.response = response
        self._transport = request.transport
        self._write_timeout = write_timeout
        #: set when the stream ends: displaced, its connection ended, or a write failed
        self.ended = asyncio.Event()
        self._written_at = asyncio.get_running_loop().time()

    async def write(self, data: bytes) -> bool:
        """Write ``data``; False (and the stream ends) when the client is gone, or does
        not read."""
        if self.ended.is_set():
            return False
        try:
            async with asyncio.timeout(self._write_timeout):
                await self.response.write(data)
        except ConnectionError:  # aiohttp's ClientConnectionResetError is one
            self.ended.set()
            return False
        except TimeoutError:
            self.ended.set()
            drop_unread(self._transport)
            return False
        self._written_at = asyncio.get_running_loop().time()
        return True

    async def keep_alive(self, interval: float) -> None:
        """Until the stream ends, write a keepalive comment whenever nothing else was
        written for ``interval`` seconds."""
        loop = asyncio.get_running_loop()
        while not self.ended.is_set():
            remaining = self._written_at + interval - loop.time()
            if remaining <= 0:
                await self.write(KEEPALIVE)
                continue
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(remaining):
                    await self.ended.wait()


def drop_unread(transport: asyncio.Transport | None) -> None:
    """End an event stream whose client keeps its connection open and reads nothing."""
    logger.warning("Streamable HTTP event stream dropped: the client does not read it")
    if transport is not None:
        transport.abort()


class HttpConnection:
    """One Streamable HTTP connection: its event streams, and the
    :class:`~router.server.client.ClientChannel` its client connection writes through."""

    #: a write to an event stream has a deadline (``asyncio.timeout``): in a task only
    inline = False

    def write(self, text: str) -> bool:
        """An event stream's writes wait (with their deadline): always :meth:`send`."""
        return False

    def __init__(
        self, entry: Entry, settings: RouterSection, metrics: Metrics, budget: ByteBudget
    ) -> None:
        self.id: ConnectionId = new_connection_id()
        self.entry = entry
        self.metrics = metrics
        self.streams = EventStreams(
            max_held=settings.http_held_frames,
            # any one frame fits, as in a link's outbox
            max_held_chars=2 * settings.max_message_bytes,
            # room for sessions known but closed, beside the ones attached
            max_sessions=2 * settings.max_sessions_per_connection,
            max_awaited=settings.max_in_flight_per_connection,
            budget=budget,
        )
        #: the open GETs, by holder number
        self.writers: dict[int, EventStream] = {}
        self.client: ClientConnection | None = None
        #: the log context's number for it
        self.number = 0
        #: when it last had a POST, or a stream open or closed (the loop's clock)
        self.active_at = asyncio.get_running_loop().time()
        #: set to end it; why, in ``reason`` (a label of acp_router_http_connections_ended_total)
        self.ending = asyncio.Event()
        self.reason = ""
        #: set once it has ended
        self.done = asyncio.Event()
        self._initialize: tuple[RequestId, asyncio.Future[str]] | None = None
        #: POSTs may come at once, on several HTTP connections: their frames enter the
        #: client connection one at a time, as a WebSocket's read loop hands them over
        self._receiving = asyncio.Lock()
        #: POSTs and event streams running now (:meth:`in_use`)
        self._uses = 0

    def end(self, reason: str) -> None:
        if not self.ending.is_set():
            self.reason = reason
            self.ending.set()

    def touch(self) -> None:
        self.active_at = asyncio.get_running_loop().time()

    @contextlib.contextmanager
    def in_use(self) -> Iterator[None]:
        """A POST or an event stream of the connection runs for the block: between them
        the connection is idle, and its place may go to a newcomer (docs/security.md: Limits)."""
        entry = self.entry
        self._uses += 1
        entry.places.use(entry.place)
        try:
            yield
        finally:
            self._uses -= 1
            if not self._uses:
                entry.places.rest(entry.place)

    async def receive(self, text: str) -> bool:
        """Hand one POSTed frame to the client connection; False when the connection
        ended first (its client connection takes nothing more)."""
        assert self.client is not None
        async with self._receiving:
            if self.ending.is_set():
                return False
            await self.client.receive(text)
            return True

    async def end_client(self) -> None:
        """End the client connection, once no POST is handing it a frame (one that
        comes later finds the connection ended: :meth:`receive`)."""
        assert self.client is not None
        async with self._receiving:
            await self.client.ended()

    async def initialize(self, request: Request) -> str:
        """Hand ``initialize`` to the client connection; its answer, which the client
        gets in the POST's body rather than on a stream."""
        answer: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._initialize = (request.id, answer)
        try:
            if not await self.receive(request.text):
                raise ConnectionError("the connection ended before its initialize")
            return await answer
        finally:
            self._initialize = None

    # -- ClientChannel ------------------------------------------------------------------------

    async def send(
        self, text: str, message: Message | None = None, answers: RequestId | None = None
    ) -> None:
        if self._initialize is not None and answers == self._initialize[0]:
            answer = self._initialize[1]
            if not answer.done():
                answer.set_result(text)
                return
        match self.streams.deliver(text, message, answers):
            case Write(key, holder):
                stream = self.writers[holder]
                if not await stream.write(event(text)):
                    self.closed(key, holder)
            case Held():
                pass
            case Overflow(key, shared):
                logger.warning(
                    "Streamable HTTP client connection ended: the %s stream held its most"
                    " (%s) and the client had not opened it",
                    "connection" if key is None else "session",
                    "router.max_held_bytes over every connection"
                    if shared
                    else f"{self.streams.max_held} frames,"
                    f" {self.streams.max_held_chars} characters over the connection",
                )
                self.end("overflow")

    async def close(self, code: int, reason: str) -> None:
        """End the connection (its streams end; the client sees them close) and wait
        until it has ended."""
        self.end("closed")
        await self.done.wait()

    # -- GETs ---------------------------------------------------------------------------------

    def opened(self, attached: Attached, stream: EventStream) -> None:
        self.writers[attached.holder] = stream
        if attached.displaced is None:
            self.metrics.http_streams.inc()
        else:
            displaced = self.writers.pop(attached.displaced, None)
            if displaced is not None:
                displaced.ended.set()
        self.touch()

    def closed(self, key: StreamKey, holder: int) -> None:
        """The GET ``holder`` has ended (or its last write failed)."""
        writer = self.writers.pop(holder, None)
        if writer is not None:
            writer.ended.set()
        if self.streams.release(key, holder):
            self.metrics.http_streams.dec()
            self.touch()


def accepts_events(accept: str | None) -> bool:
    """Whether an ``Accept`` header value includes ``text/event-stream``."""
    if accept is None:
        return False
    ranges = (part.split(";", 1)[0].strip().lower() for part in accept.split(","))
    return any(media in _EVENT_STREAM_RANGES for media in ranges)


def _refusal(status: int, text: str) -> web.Response:
    return web.Response(status=status, text=text + "\n")


def _failed(connection: HttpConnection) -> web.Response:
    """What the one boundary catch of a connection answers, once it logged the failure:
    the connection ends."""
    connection.end("error")
    return _refusal(500, "the router failed; the connection has ended")


async def read_body(request: web.Request, timeout: float) -> bytes | web.Response:
    """A request's body, read within ``timeout`` seconds (a client that trickles it is
    answered 408, as one that trickles its headers), else the refusal."""
    try:
        async with asyncio.timeout(timeout):
            return await request.read()
    except TimeoutError:
        refusal = _refusal(408, f"the body did not arrive within {round(timeout * 1000)} ms")
        return await _sent_and_closed(request, refusal)
    except web.HTTPRequestEntityTooLarge:
        return _too_large()
    except ConnectionError:  # the client went before its body was whole: no one to answer
        return _refusal(400, "the connection ended before the body did")


def _too_large() -> web.Response:
    return _refusal(413, "the body is larger than router.max_message_bytes")


async def _sent_and_closed(request: web.Request, refusal: web.Response) -> web.Response:
    """Send ``refusal`` now and close the connection after it, the body left unread:
    aiohttp would otherwise linger, reading what is left of it, for seconds more."""
    refusal.force_close()
    await refusal.prepare(request)
    await refusal.write_eof()
    if request.transport is not None:
        request.transport.close()
    return refusal


class Bodies:
    """Request bodies, read only within the bytes every connection may hold together
    (``router.max_held_bytes``, shared with the frames held for event streams): a body
    that would pass it is answered 503 with ``Retry-After``, unread. A body counts from before its first byte is read (its ``Content-Length``, or
    ``router.max_message_bytes`` when it has none) until its frame is handed on."""

    def __init__(self, budget: ByteBudget, settings: RouterSection, metrics: Metrics) -> None:
        self.budget = budget
        self._most = settings.max_message_bytes
        self._timeout = settings.handshake_timeout_ms / 1000
        self._metrics = metrics

    @contextlib.asynccontextmanager
    async def read(self, request: web.Request) -> AsyncIterator[bytes | web.Response]:
        """The body (held for the block), or the refusal to answer."""
        if not request.body_exists:
            yield b""
            return
        size = request.content_length
        if size is not None and size > self._most:
            yield _too_large()
            return
        size = self._most if size is None else size
        if not self.budget.take(size):
            self._metrics.limited.labels("held_bytes").inc()
            full = _refusal(503, "the router holds as many request bytes as it may: retry soon")
            full.headers[hdrs.RETRY_AFTER] = str(RETRY_AFTER_SECONDS)
            yield full  # the body unread (aiohttp reads what comes of it, and drops it)
            return
        try:
            yield await read_body(request, self._timeout)
        finally:
            self.budget.give(size)


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
                await self._flush(connection, key, attached.holder, stream)
                await stream.keep_alive(self.settings.http_keepalive_seconds)
            except ConnectionError:
                pass  # the client went while the stream opened
            finally:
                connection.closed(key, attached.holder)
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
            return _refusal(415, "POST a JSON-RPC message as application/json")
        async with self.bodies.read(request) as raw:
            if isinstance(raw, web.Response):
                return raw
            return await self._handle_post(request, admission, raw)

    async def _handle_post(
        self, request: web.Request, admission: Admitted, raw: bytes
    ) -> web.Response:
        """A POST whose body was read: its frame, to a new connection or an open one."""
        try:
            body = raw.decode()
        except UnicodeDecodeError:
            return _refusal(400, "the body is not UTF-8")
        shape = body.lstrip()[:1]
        if shape == "[":
            return _refusal(501, "batches are not supported: POST one JSON-RPC message")
        if shape != "{":
            return _refusal(400, "POST one JSON-RPC message, a JSON object")
        try:
            message: Message | None = parse(body)
        except ParseError:
            return _refusal(400, "the body is not JSON")
        except InvalidRequest:
            message = None  # the routing core answers it, on the connection stream
        connection_id = request.headers.get(acp.CONNECTION_ID_HEADER)
        if connection_id is None:
            if isinstance(message, Request) and message.method == acp.INITIALIZE:
                return await self._start(request, admission, message)
            return _refusal(400, "Acp-Connection-Id is required (POST initialize first)")
        connection = self._find(connection_id, admission)
        if connection is None:
            return _refusal(404, "no such connection")
        rejected = connection.streams.post(message, request.headers.get(acp.SESSION_ID_HEADER))
        if rejected is not None:
            return _refusal(rejected.status, rejected.text)
        connection.touch()
        log_context.connection.set(connection.number)
        try:
            with connection.in_use():
                received = await connection.receive(body)
        except Exception:  # the one boundary catch of a connection: log it, end it
            logger.exception("client connection failed")
            return _failed(connection)
        if not received:
            return _refusal(404, "no such connection")
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
            return _refusal(504, "initialize was not answered in time")
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
    ) -> tuple[HttpConnection, StreamKey, Attached] | web.Response:
        admission = self.door.admit(request)
        if isinstance(admission, web.Response):
            return admission
        if not accepts_events(request.headers.get(hdrs.ACCEPT)):
            return _refusal(
                406,
                "GET /acp is a WebSocket upgrade, or an event stream"
                " (Accept: text/event-stream, with Acp-Connection-Id)",
            )
        connection_id = request.headers.get(acp.CONNECTION_ID_HEADER)
        if connection_id is None:
            return _refusal(
                400,
                "GET /acp is a WebSocket upgrade, or an event stream of a connection"
                " (Acp-Connection-Id: POST initialize first)",
            )
        connection = self._find(connection_id, admission)
        if connection is None:
            return _refusal(404, "no such connection")
        session = request.headers.get(acp.SESSION_ID_HEADER)
        key = SessionId(session) if session is not None else None
        attached = connection.streams.attach(key)
        if isinstance(attached, Rejected):
            return _refusal(attached.status, attached.text)
        return connection, key, attached

    async def _flush(
        self, connection: HttpConnection, key: StreamKey, holder: int, stream: EventStream
    ) -> None:
        """Write the frames held for the stream; new ones flow to it once none is left."""
        while (text := connection.streams.take(key, holder)) is not None:
            if not await stream.write(event(text)):
                return

    # -- DELETE -------------------------------------------------------------------------------

    async def _delete(self, request: web.Request) -> web.Response:
        admission = self.door.admit(request)
        if isinstance(admission, web.Response):
            return admission
        connection_id = request.headers.get(acp.CONNECTION_ID_HEADER)
        if connection_id is None:
            return _refusal(400, "DELETE needs Acp-Connection-Id")
        connection = self._find(connection_id, admission)
        if connection is None:
            return _refusal(404, "no such connection")
        connection.end("deleted")
        await connection.done.wait()
        return web.Response(status=202)

    def reclaim(self, places: Iterable[Place]) -> None:
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
