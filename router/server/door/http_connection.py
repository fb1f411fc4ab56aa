"""One Streamable HTTP connection (:class:`HttpConnection`): its event streams, and the
:class:`~router.server.connection.client.ClientChannel` its client connection writes through, onto
the stream :mod:`router.core.streams` chooses (docs/architecture.md, "The effects
channel").
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass

from router.core.frontdoor import Admitted
from router.core.quotas import ByteBudget, ClientPlaces, Seat
from router.core.streams import EventStreams, Held, Opened, Overflow, StreamKey, Write
from router.protocol.ids import ConnectionId, new_connection_id
from router.protocol.jsonrpc import Message, Request, RequestId
from router.server.config import RouterSection
from router.server.connection.client import ClientConnection
from router.server.door.event_stream import EventStream, event
from router.server.observability.metrics import Metrics

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Entry:
    """A client let in as a new connection; its ``place`` among ``places`` is held
    until :meth:`~router.server.door.streamable_http.Door.finish` (or until it is reclaimed
    while idle: :meth:`~router.server.door.streamable_http.HttpFront.reclaim`)."""

    admission: Admitted
    address: str
    place: Seat
    places: ClientPlaces


class HttpConnection:
    """One Streamable HTTP connection: its event streams, and the
    :class:`~router.server.connection.client.ClientChannel` its client connection writes through."""

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
        #: the open GETs, by reader number
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
            case Write(key, reader):
                stream = self.writers[reader]
                if not await stream.write(event(text)):
                    self.closed(key, reader)
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

    def opened(self, attached: Opened, stream: EventStream) -> None:
        self.writers[attached.reader] = stream
        if attached.displaced is None:
            self.metrics.http_streams.inc()
        else:
            displaced = self.writers.pop(attached.displaced, None)
            if displaced is not None:
                displaced.ended.set()
        self.touch()

    def closed(self, key: StreamKey, reader: int) -> None:
        """The GET ``reader`` has ended (or its last write failed)."""
        writer = self.writers.pop(reader, None)
        if writer is not None:
            writer.ended.set()
        if self.streams.release(key, reader):
            self.metrics.http_streams.dec()
            self.touch()
