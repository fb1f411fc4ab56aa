"""A client connection's link to one backend.

A link is opened on first use (:meth:`BackendLink.open`): it connects, replays the
client's ``initialize`` (with the negotiated protocol version) and ``authenticate``,
then forwards frames. One deadline (``router.connect_timeout_ms``) covers the TCP
connect, the WebSocket upgrade and the replayed handshake. The opening runs in the
connection's task; once open, the link lives on its socket's callbacks
(:class:`~router.server.links.websocket.WebSocket`): an idle link holds no task. Each frame
from the backend is handed to ``on_message`` as it is read, and when the socket is gone
``on_end`` is told why, once.

A frame for the backend (:meth:`BackendLink.forward`) is written to the socket at once
when the link is open and its transport takes more; otherwise it goes into the link's
own bounded :class:`~router.outbox.Outbox`, which the transport takes from, in order,
as its buffer drains. Either way frames leave in the order they were offered, and
whoever offers one (the client's read loop) never waits on this backend. A backend that
does not read fast enough fills its outbox, and the link is closed: the connection
answers exactly the requests routed here, and nothing else.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from websockets.client import ClientProtocol
from websockets.exceptions import PayloadTooBig
from websockets.protocol import OPEN
from websockets.uri import parse_uri

from router.outbox import Outbox
from router.protocol import acp
from router.protocol.errors import BackendLinkLost, HandshakeRefused, ProtocolError
from router.protocol.ids import BackendId, reserved_id
from router.protocol.jsonrpc import Message, Request, Response
from router.protocol.reading import parse
from router.protocol.splice import replace_id, replace_param
from router.server.links import waiting
from router.server.links.faults import FOREIGN_FAILURES, describe
from router.server.links.websocket import FRAMES_LOG, WebSocket
from router.server.links.wire import TOO_BIG, dropped
from router.server.observability.metrics import Metrics

logger = logging.getLogger(__name__)

HANDSHAKE_INITIALIZE = reserved_id("initialize")
HANDSHAKE_AUTHENTICATE = reserved_id("authenticate")

#: Frames a link's outbox holds at most (its size bound is ``2 * max_message_bytes``
#: characters, so any one frame a client may send fits in an empty outbox).
OUTBOX_FRAMES = 4096

#: How long a link being given up may take to close its socket politely.
CLOSE_TIMEOUT = 1.0

#: How long the frames queued on a link may take to leave when its client connection
#: ends (the router's ``session/cancel`` of a turn the client left among them), before
#: the link closes anyway.
FLUSH_TIMEOUT = 1.0

#: the close code a link is given up with (a normal closure, as it always was)
NORMAL_CLOSURE = 1000

#: what an open link that ended calls: with the link and why it ended
Ended = Callable[["BackendLink", str], None]


def replayed_initialize(client_initialize: Request) -> str:
    """The client's ``initialize`` as it came (``_meta`` and all), for one new link: the
    router's id, and the protocol version the router negotiated."""
    text = replace_param(client_initialize.text, "protocolVersion", acp.PROTOCOL_VERSION)
    return replace_id(text, HANDSHAKE_INITIALIZE)


def replayed_authenticate(client_authenticate: Request) -> str:
    """The ``authenticate`` the backends accepted, as the client sent it, for one new link."""
    return replace_id(client_authenticate.text, HANDSHAKE_AUTHENTICATE)


@dataclass(slots=True)
class _Handshake:
    """The replayed handshake in progress: the answer expected next, and what follows."""

    expected: str
    authenticate: Request | None
    on_open: Callable[[Any], None]
    done: asyncio.Future[None]
    result: Any = None


class BackendLink:
    """One client connection's WebSocket to one backend."""

    __slots__ = (
        "_cancelled",
        "_closed",
        "_connect_timeout",
        "_handshake",
        "_inline_messages",
        "_max_message_bytes",
        "_metrics",
        "_on_end",
        "_on_message",
        "_outbox",
        "_task",
        "_tls",
        "_ws",
        "backend",
        "ended",
        "timed_out",
        "url",
    )

    def __init__(
        self,
        backend: BackendId,
        url: str,
        metrics: Metrics,
        *,
        max_message_bytes: int,
        connect_timeout: float,
        tls: ssl.SSLContext | None = None,
        inline: bool = True,
    ) -> None:
        self.backend = backend
        #: it did not open within ``connect_timeout``: the backend left its handshake
        #: unanswered (evidence it is frozen: :meth:`router.server.pool.backends.Pool.unanswered`)
        self.timed_out = False
        #: whether ``on_message`` may run inline, outside a task (:mod:`router.server.links.inline`)
        self._inline_messages = inline
        self._metrics = metrics
        self.url = url
        self._tls = tls
        self._max_message_bytes = max_message_bytes
        self._connect_timeout = connect_timeout
        self._outbox = Outbox(OUTBOX_FRAMES, 2 * max_message_bytes)
        #: why the link takes no more frames; None while it does
        self.ended: str | None = None
        #: the task running :meth:`open`, while it runs; :meth:`close` cancels it
        self._task: asyncio.Task[Any] | None = None
        #: :meth:`close` was called: the link is lost, not ended by the backend
        self._closed = False
        #: :meth:`close` cancelled :attr:`_task` (once)
        self._cancelled = False
        #: the socket, once connected
        self._ws: WebSocket | None = None
        #: the replayed handshake, while it runs (None once the link is open)
        self._handshake: _Handshake | None = None
        self._on_message: Callable[[Message], Coroutine[Any, Any, None] | None] | None = None
        self._on_end: Ended | None = None

    @property
    def is_open(self) -> bool:
        """Whether frames go to the backend now (the handshake is done)."""
        return self._ws is not None and self._handshake is None and self._on_end is not None

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
        self._flush()
        return True

    def forward(self, text: str) -> bool:
        """:meth:`offer`, written straight to the socket when nothing waits in the
        outbox and the transport takes more; the same answer as :meth:`offer`."""
        ws = self._ws
        if (
            ws is None
            or ws.paused
            or self._outbox.frames
            or not self.is_open
            or self.ended is not None
        ):
            return self.offer(text)
        if ws.send(text):
            return True
        self.close("sending failed: the connection is closing")
        return False

    def _flush(self) -> None:
        """Write what waits in the outbox while the transport takes more."""
        ws = self._ws
        if ws is None or not self.is_open:
            return
        while not ws.paused and (text := self._outbox.take()) is not None:
            if not ws.send(text):
                self.close("sending failed: the connection is closing")
                return

    def close(self, reason: str) -> None:
        """Take no more frames and stop the link; idempotent. ``on_end`` hears of it
        once the socket is gone (an open link); a link still opening makes :meth:`open`
        raise :class:`BackendLinkLost` (its task is cancelled, unless this is it)."""
        if self.ended is None:
            self.ended = reason
        self._closed = True
        task = self._task
        if task is not None and not self._cancelled and task is not asyncio.current_task():
            self._cancelled = True
            task.cancel()
        if self._ws is not None:
            self._ws.close(NORMAL_CLOSURE, timeout=CLOSE_TIMEOUT)

    async def sent(self, timeout: float = FLUSH_TIMEOUT) -> None:
        """Wait, up to ``timeout`` seconds, until what is queued on the link has left: its
        outbox is empty and its socket's send buffer has drained (the link is about to
        close: the client connection ended, or the router stops)."""
        ws = self._ws
        if ws is None or ws.transport is None or not self.is_open or timeout <= 0:
            return
        # writing pauses at once and resumes only once the buffer is empty: drained
        # waits for that (the link closes next, so the limits need not come back)
        ws.transport.set_write_buffer_limits(high=0, low=0)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                while not ws.lost:
                    await waiting.drained(ws)
                    if not self._outbox:
                        return
                    self._flush()

    async def open(
        self,
        initialize: Request,
        authenticate: Request | None,
        on_message: Callable[[Message], Coroutine[Any, Any, None] | None],
        on_end: Ended,
        on_open: Callable[[Any], None] = lambda result: None,
    ) -> None:
        """Open the link: connect, upgrade and replay the handshake under one deadline.
        ``on_open`` gets the backend's ``initialize`` result once the handshake is done;
        from then on the link runs without a task: ``on_message`` gets each message
        from the backend, and ``on_end`` why the link ended, once.

        It runs in the caller's task: :meth:`close` from elsewhere cancels that task,
        and a cancellation of the task by anyone else passes through as it is (the
        socket is dropped either way).

        Raises :class:`BackendLinkLost` when the link cannot be opened within the
        deadline, breaks meanwhile, or is closed by :meth:`close`
        (:class:`HandshakeRefused` when the backend refuses the handshake).
        """
        task = asyncio.current_task()
        assert task is not None
        if self._closed:
            raise self._lost()
        self._task = task
        self._on_message = on_message
        try:
            await self._open(initialize, authenticate, on_open)
        except asyncio.CancelledError:
            self._drop()
            # close()'s own cancellation becomes the link's loss; anyone else's goes on
            if self._cancelled and task.uncancel() == 0:
                raise self._lost() from None
            raise
        except BaseException:
            self._drop()
            raise
        finally:
            self._task = None
        self._on_end = on_end
        self._flush()  # frames offered while it opened
        if self._ws is not None and self._ws.lost:  # it ended before this task went on
            self.closed()

    def _lost(self) -> BackendLinkLost:
        return BackendLinkLost(None, {"backend": self.backend, "reason": self.ended})

    def _drop(self) -> None:
        ws, self._ws, self._handshake = self._ws, None, None
        if ws is not None:
            ws.abort()

    async def _open(
        self, initialize: Request, authenticate: Request | None, on_open: Callable[[Any], None]
    ) -> None:
        deadline = asyncio.timeout(self._connect_timeout)
        try:
            async with deadline:
                ws = await self._connect()
                loop = asyncio.get_running_loop()
                done: asyncio.Future[None] = loop.create_future()
                self._handshake = _Handshake(HANDSHAKE_INITIALIZE, authenticate, on_open, done)
                ws.send(replayed_initialize(initialize))
                await done
        except TimeoutError:
            if not deadline.expired():
                raise
            self.timed_out = True
            ms = round(self._connect_timeout * 1000)
            reason = f"not open within {ms} ms (connect, upgrade, initialize)"
            raise BackendLinkLost(None, {"backend": self.backend, "reason": reason}) from None
        except FOREIGN_FAILURES as exc:
            raise BackendLinkLost(None, {"backend": self.backend, "reason": describe(exc)}) from exc

    async def _connect(self) -> WebSocket:
        """The TCP connection (TLS for ``wss://``) and the WebSocket upgrade."""
        uri = parse_uri(self.url)
        frames = ClientProtocol(uri, max_size=self._max_message_bytes, logger=FRAMES_LOG)
        ws = self._ws = WebSocket(frames, self)
        ws.inline = self._inline_messages
        tls = (self._tls or True) if uri.secure else None
        loop = asyncio.get_running_loop()
        await loop.create_connection(
            lambda: ws, uri.host, uri.port, ssl=tls, server_hostname=uri.host if tls else None
        )
        frames.send_request(frames.connect())
        ws.flush()
        await waiting.opened(ws)
        if ws.frames.state is not OPEN:
            failure = frames.handshake_exc
            reason = "closed during the upgrade" if failure is None else describe(failure)
            raise BackendLinkLost(None, {"backend": self.backend, "reason": reason})
        return ws

    # -- the socket's receiver ----------------------------------------------------------------

    def received_text(self, text: str) -> Coroutine[Any, Any, None] | None:
        if self.ended is not None:  # a link given up says nothing more
            return None
        try:  # read_text, without its call (this runs for every frame a backend sends)
            message = parse(text)
        except ProtocolError as exc:
            dropped(exc, self.backend, self._metrics)
            return None
        if self._handshake is not None:
            self._shake(self._handshake, message)
            return None
        assert self._on_message is not None
        return self._on_message(message)

    def _shake(self, handshake: _Handshake, message: Message) -> None:
        """One step of the replayed handshake: the answer it waits for, or a message
        that comes before it (dropped)."""
        if not isinstance(message, Response) or message.id != handshake.expected:
            return
        if handshake.done.done():
            return
        if message.error is not None:
            step = (
                acp.INITIALIZE if handshake.expected == HANDSHAKE_INITIALIZE else acp.AUTHENTICATE
            )
            handshake.done.set_exception(HandshakeRefused(self.backend, step, message.error))
            return
        if handshake.expected == HANDSHAKE_INITIALIZE:
            handshake.result = message.result
            if handshake.authenticate is not None and self._ws is not None:
                handshake.expected = HANDSHAKE_AUTHENTICATE
                self._ws.send(replayed_authenticate(handshake.authenticate))
                return
        self._handshake = None
        handshake.on_open(handshake.result)
        handshake.done.set_result(None)

    def received_binary(self) -> None:
        self._metrics.drop_frame(self.backend, "binary")

    def writable(self) -> None:
        self._flush()

    def handling_failed(self, exc: Exception) -> None:
        """Routing a message from the backend failed: the link's boundary."""
        logger.error("link to backend %s failed", self.backend, exc_info=exc)
        self.close("router error")

    def closed(self) -> None:
        """The socket is gone: say why, once (an open link), or end the opening."""
        ws = self._ws
        if ws is None:
            return
        reason = self._why(ws)
        self.ended = self.ended or reason
        handshake, self._handshake = self._handshake, None
        if handshake is not None and not handshake.done.done():
            handshake.done.set_exception(self._closed_during_handshake())
        on_end = self._on_end
        if on_end is None:  # still opening: open() raises
            return
        self._ws = None
        on_end(self, self.ended)

    def _closed_during_handshake(self) -> BackendLinkLost:
        reason = self.ended or "closed during handshake"
        return BackendLinkLost(None, {"backend": self.backend, "reason": reason})

    def _why(self, ws: WebSocket) -> str:
        if self._closed and self.ended is not None:
            return self.ended
        frames = ws.frames
        failure = frames.parser_exc
        if isinstance(failure, PayloadTooBig):
            self._metrics.drop_frame(self.backend, "too_big")
            return f"{TOO_BIG} ({failure}); link closed with 1009"
        received = frames.close_rcvd
        if received is not None:
            return f"closed by the backend (code {received.code})"
        if failure is not None:
            return f"connection lost ({describe(failure)})"
        return "connection lost"
