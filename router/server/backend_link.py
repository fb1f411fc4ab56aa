"""A client connection's link to one backend.

A link is opened on first use: it connects, replays the client's ``initialize``
(with the negotiated protocol version) and ``authenticate``, then forwards frames.
One deadline (``router.connect_timeout_ms``) covers the TCP connect, the WebSocket
upgrade and the replayed handshake.

A frame for the backend (:meth:`BackendLink.forward`) is written at once when the
link is open, nothing is queued ahead of it and the socket takes it whole without
waiting (its send buffer is empty and the frame is well under the buffer's limit);
otherwise it goes into the link's own bounded :class:`~router.outbox.Outbox`, and a writer task,
started then and ended once the outbox is empty, sends the queued frames in order.
Either way frames leave in the order they were offered, and whoever offers one (the
client's read loop) never waits on this backend. A backend that does not read fast
enough fills its outbox, and the link is closed: the connection answers exactly the
requests routed here, and nothing else.

When the client connection ends (its task for the link is cancelled, not :meth:`close`),
what was queued last (the router's ``session/cancel`` of a turn the client left) is still
sent, for up to :data:`FLUSH_TIMEOUT`, before the socket closes; :meth:`BackendLink.sent`
waits for the same while the link stays open (the router stopping, before its 1012).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import Awaitable, Callable
from typing import Any, cast

import aiohttp

from router.outbox import Outbox
from router.protocol import acp
from router.protocol.errors import BackendLinkLost, HandshakeRefused
from router.protocol.ids import BackendId
from router.protocol.jsonrpc import Message, Request, Response, reader_limit
from router.protocol.splice import replace_id, replace_param
from router.server.faults import FOREIGN_FAILURES, backend_faults, describe
from router.server.metrics import Metrics
from router.server.wire import messages, read

logger = logging.getLogger(__name__)

HANDSHAKE_INITIALIZE = "acp-router:initialize"
HANDSHAKE_AUTHENTICATE = "acp-router:authenticate"

#: Frames a link's outbox holds at most (its size bound is ``2 * max_message_bytes``
#: characters, so any one frame a client may send fits in an empty outbox).
OUTBOX_FRAMES = 4096

#: How long a link being given up may take to close its socket politely.
CLOSE_TIMEOUT = 1.0

#: How long the frames queued on a link may take to leave when its client connection
#: ends (a ``session/cancel`` among them), before the link closes anyway.
FLUSH_TIMEOUT = 1.0

#: Longest frame (characters) written at once rather than queued: even at 4 bytes a
#: character it stays under a quarter of asyncio's default write-buffer limit (64 KiB),
#: so writing it into an empty send buffer can never pause the transport, and so never
#: makes the writer wait.
DIRECT_CHARS = 4096


def replayed_initialize(client_initialize: Request) -> str:
    """The client's ``initialize`` as it came (``_meta`` and all), for one new link: the
    router's id, and the protocol version the router negotiated."""
    text = replace_param(client_initialize.text, "protocolVersion", acp.PROTOCOL_VERSION)
    return replace_id(text, HANDSHAKE_INITIALIZE)


def replayed_authenticate(client_authenticate: Request) -> str:
    """The ``authenticate`` the backends accepted, as the client sent it, for one new link."""
    return replace_id(client_authenticate.text, HANDSHAKE_AUTHENTICATE)


class BackendLink:
    """One client connection's WebSocket to one backend."""

    def __init__(
        self,
        backend: BackendId,
        url: str,
        http: aiohttp.ClientSession,
        metrics: Metrics,
        *,
        max_message_bytes: int,
        connect_timeout: float,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self.backend = backend
        self._metrics = metrics
        self.url = url
        self._tls = tls
        self._http = http
        self._max_message_bytes = max_message_bytes
        self._connect_timeout = connect_timeout
        self._outbox = Outbox(OUTBOX_FRAMES, 2 * max_message_bytes)
        #: why the link takes no more frames; None while it does
        self.ended: str | None = None
        #: the task running :meth:`run` (the connection's task for this link); closing the
        #: link from elsewhere cancels it (no task of the link's own: a task is ~1.5 KiB
        #: of every idle connection)
        self._task: asyncio.Task[Any] | None = None
        #: :meth:`close` was called: the link is lost, not ended by the backend
        self._closed = False
        #: :meth:`close` cancelled :attr:`_task` (once)
        self._cancelled = False
        #: the link reads no more and is closing its socket: nothing left for
        #: :meth:`close` to stop
        self._finishing = False
        #: the socket, once the handshake is done (frames may be written to it then)
        self._ws: aiohttp.ClientWebSocketResponse | None = None
        #: its transport, to see that nothing waits in its send buffer (None: unknown,
        #: every frame goes through the outbox)
        self._transport: asyncio.WriteTransport | None = None
        #: the task sending the outbox, while frames wait in it
        self._writer: asyncio.Task[None] | None = None

    def offer(self, text: str) -> bool:
        """Queue one frame for the backend, never waiting; frames leave in offer order.

        False when the link takes no more frames: it has ended, or this frame would
        overflow its outbox (the link is then closed). The caller gives the link up
        and answers its requests.
        """
        if self.ended is not None:
            return False
        if not self._outbox.put(text):
            self.close("the backend is not reading fast enough (its outbox is full)")
            return False
        if self._ws is not None and self._writer is None:
            self._start_writer(self._ws)
        return True

    def _start_writer(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        """The task that sends the outbox, while frames wait in it."""
        self._writer = asyncio.create_task(self._write(ws), name=f"link-writer-{self.backend}")

    async def forward(self, text: str) -> bool:
        """:meth:`offer`, but the frame is written at once when the socket takes it
        without waiting and nothing is queued ahead of it (no task switch, no copy
        into the outbox); the same answer as :meth:`offer`.

        It never waits either: the write goes into an empty send buffer and is far below
        its limit (:data:`DIRECT_CHARS`), so the transport is not paused and aiohttp
        returns without awaiting a drain.
        """
        ws, transport = self._ws, self._transport
        if (
            ws is None
            or transport is None
            or self._writer is not None
            or self.ended is not None
            or len(text) > DIRECT_CHARS
            or transport.get_write_buffer_size()
        ):
            return self.offer(text)
        try:  # what backend_faults does, without a context manager per frame
            await ws.send_str(text)
        except FOREIGN_FAILURES as exc:
            self.close(f"sending failed: {describe(exc)}")
            return False
        return True

    def close(self, reason: str) -> None:
        """Take no more frames and stop the link (:meth:`run` then ends); idempotent.

        From another task, this cancels the task running :meth:`run` (it raises
        :class:`BackendLinkLost`); from that task itself (a frame it routed led here), the
        link stops once that frame is handled, with no cancellation left pending.
        """
        if self.ended is None:
            self.ended = reason
        self._closed = True
        task = self._task
        if (
            task is not None
            and not self._cancelled
            and not self._finishing
            and task is not asyncio.current_task()
        ):
            self._cancelled = True
            task.cancel()

    async def sent(self, timeout: float = FLUSH_TIMEOUT) -> None:
        """Wait, up to ``timeout`` seconds, until the frames queued so far have left (on a
        link not open yet they wait for its handshake: nothing to wait for here)."""
        writer = self._writer
        if writer is not None and timeout > 0:
            await asyncio.wait((writer,), timeout=timeout)

    async def run(
        self,
        initialize: Request,
        authenticate: Request | None,
        on_message: Callable[[Message], Awaitable[None]],
        on_open: Callable[[Any], None] = lambda result: None,
    ) -> str:
        """Open the link, then pump frames both ways until it ends; why it ended.
        ``on_open`` gets the backend's ``initialize`` result once the handshake is done.
        It runs in the caller's task: :meth:`close` from elsewhere cancels that task, and
        a cancellation of the task by anyone else passes through as it is.

        Raises :class:`BackendLinkLost` when the link cannot be opened within the
        deadline, breaks, or is closed by :meth:`close`; returns when the backend
        closes it.
        """
        task = asyncio.current_task()
        assert task is not None
        if not self._closed:
            self._task = task
            try:
                reason = await self._live(initialize, authenticate, on_message, on_open)
            except asyncio.CancelledError:
                # close()'s own cancellation becomes the link's loss; anyone else's goes on
                if self._cancelled and task.uncancel() == 0:
                    raise self._lost() from None
                raise
            finally:
                self._task = None
            if not self._closed:
                return reason
        raise self._lost()

    def _lost(self) -> BackendLinkLost:
        return BackendLinkLost(None, {"backend": self.backend, "reason": self.ended})

    async def _live(
        self,
        initialize: Request,
        authenticate: Request | None,
        on_message: Callable[[Message], Awaitable[None]],
        on_open: Callable[[Any], None],
    ) -> str:
        # backend_faults, written out: a context manager would be held (with its
        # generator) for the link's whole life, in every idle connection
        try:
            ws = await self._open(initialize, authenticate, on_open)
            self._ws, self._transport = ws, link_transport(ws)
            if self._outbox:  # frames offered while the link opened
                self._start_writer(ws)
            try:
                backend, metrics = self.backend, self._metrics
                async for frame in ws:  # wire.messages, without a generator per frame
                    message = read(frame, backend, metrics)
                    if message is not None:
                        await on_message(message)
                        if self._closed:  # by what the message led to, in this task
                            break
                self.ended = self.ended or _how_it_closed(ws)  # ending: no cancel needed
            finally:
                self._ws = self._transport = None
                self._finishing = True
                # the client connection ends (this task cancelled, not by close()): what
                # it queued last leaves before the socket closes
                ending = not self._closed and _cancelling()
                await self._stop_writer(FLUSH_TIMEOUT if ending else 0.0)
                await _shut(ws)
        except FOREIGN_FAILURES as exc:
            raise BackendLinkLost(None, {"backend": self.backend, "reason": describe(exc)}) from exc
        return self.ended or "closed"

    async def _stop_writer(self, flush: float = 0.0) -> None:
        """Stop the writer, after letting it send what is queued for up to ``flush``
        seconds."""
        writer = self._writer
        if writer is None:
            return
        await self.sent(flush)
        self._writer = None
        writer.cancel()
        await asyncio.wait((writer,))
        if not writer.cancelled() and writer.exception() is not None:
            logger.error("backend %s link writer failed", self.backend, exc_info=writer.exception())

    async def _open(
        self, initialize: Request, authenticate: Request | None, on_open: Callable[[Any], None]
    ) -> aiohttp.ClientWebSocketResponse:
        """Connect, upgrade and hand-shake under one deadline; the socket. ``on_open``
        gets the backend's ``initialize`` result (kept by no frame of the link's life)."""
        ws: aiohttp.ClientWebSocketResponse | None = None
        deadline = asyncio.timeout(self._connect_timeout)
        try:
            async with deadline:
                ws = await self._http.ws_connect(
                    self.url,
                    ssl=self._tls or True,
                    max_msg_size=reader_limit(self._max_message_bytes),
                    autoping=True,
                    heartbeat=30.0,
                )
                on_open(await self._handshake(ws, initialize, authenticate))
                return ws
        except BaseException as exc:
            if ws is not None:
                await _shut(ws)
            if isinstance(exc, TimeoutError) and deadline.expired():
                ms = round(self._connect_timeout * 1000)
                reason = f"not open within {ms} ms (connect, upgrade, initialize)"
                raise BackendLinkLost(None, {"backend": self.backend, "reason": reason}) from None
            raise

    async def _write(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        """The link's writer while frames wait: the outbox, in order, until it is empty
        (then the task ends; the next frame queued starts another) or a send fails."""
        while (text := self._outbox.take()) is not None:
            try:
                with backend_faults(self.backend):
                    await ws.send_str(text)
            except BackendLinkLost as exc:
                self.close(f"sending failed: {(exc.data or {}).get('reason')}")
                break
        self._writer = None

    async def _handshake(
        self, ws: aiohttp.ClientWebSocketResponse, initialize: Request, authenticate: Request | None
    ) -> Any:
        """Replay the client's handshake; the backend's ``initialize`` result."""
        await ws.send_str(replayed_initialize(initialize))
        result = await self._expect_ok(ws, HANDSHAKE_INITIALIZE, acp.INITIALIZE)
        if authenticate is not None:
            await ws.send_str(replayed_authenticate(authenticate))
            await self._expect_ok(ws, HANDSHAKE_AUTHENTICATE, acp.AUTHENTICATE)
        return result

    async def _expect_ok(
        self, ws: aiohttp.ClientWebSocketResponse, request_id: str, step: str
    ) -> Any:
        async for message in messages(ws, self.backend, self._metrics):
            if isinstance(message, Response) and message.id == request_id:
                if message.error is not None:
                    raise HandshakeRefused(self.backend, step, message.error)
                return message.result
        raise BackendLinkLost(None, {"backend": self.backend, "reason": "closed during handshake"})


def link_transport(ws: aiohttp.ClientWebSocketResponse) -> asyncio.WriteTransport | None:
    """The transport under ``ws``, or None when aiohttp does not show it where it used
    to (then every frame is queued: correct, one task switch slower).

    An empty send buffer means the transport is not paused (asyncio resumes a protocol
    once its buffer drains below the low-water mark), which is what lets
    :meth:`BackendLink.forward` write without waiting.
    """
    connection = getattr(getattr(ws, "_response", None), "connection", None)
    transport = getattr(connection, "transport", None)
    if not callable(getattr(transport, "get_write_buffer_size", None)):
        return None
    return cast(asyncio.WriteTransport, transport)  # uvloop's: the same methods, no base


def _cancelling() -> bool:
    """Whether the running task is being cancelled."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


def _how_it_closed(ws: aiohttp.ClientWebSocketResponse) -> str:
    code = ws.close_code
    if code is not None and code != aiohttp.WSCloseCode.ABNORMAL_CLOSURE:
        return f"closed by the backend (code {code})"
    failure = ws.exception()
    return "connection lost" if failure is None else f"connection lost ({describe(failure)})"


async def _shut(ws: aiohttp.ClientWebSocketResponse) -> None:
    """Close ``ws`` politely if the backend lets us within :data:`CLOSE_TIMEOUT`; aiohttp
    drops the connection when the wait is cut short."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(CLOSE_TIMEOUT):
            await ws.close()
