"""A WebSocket on an asyncio transport, every frame read and written by websockets'
sans-I/O protocol: what the router's WebSocket (:mod:`router.server.links.websocket`) stands
on, for client connections and backend links alike (docs/architecture.md, "Every rule
and its file").

websockets' protocol (:class:`websockets.protocol.Protocol`) reads and writes the
frames, answers pings, keeps the size limit (a larger message fails the connection with
1009), checks masking (an unmasked frame from a client fails it with 1002) and runs the
closing handshake; :class:`SansIoWebSocket` drives it from ``asyncio.Protocol``
callbacks. So an idle connection holds no task and no coroutine, only its objects
(README's "Benchmarks": the bytes per idle client), and a frame costs no task switch: a
text message's handler (:class:`Receiver`) runs inline from ``data_received``
(:func:`router.server.links.inline.run_inline`), and only a handler that has to wait gets a
task, while later messages are held back (and the transport stops reading) so that they
are handled in the order they came. Binary messages are handed on only as "one came"
(ACP ignores them). A connection that says nothing for :data:`HEARTBEAT` seconds is
pinged, and dropped if it still says nothing for half as long again. A closing
handshake that does not finish within :data:`CLOSE_TIMEOUT` seconds drops the TCP
connection.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Coroutine
from typing import Any, Protocol, cast

from websockets.frames import Frame, Opcode
from websockets.protocol import CONNECTING, OPEN, Event, Protocol as Frames, Side
from websockets.typing import BytesLike

from router.server.links.inline import run_inline

#: seconds of silence from the peer before a ping; half as long again without a word drops it
HEARTBEAT = 30.0
#: seconds a closing handshake may take before the TCP connection is dropped
CLOSE_TIMEOUT = 10.0

#: close codes the router sends
INVALID_DATA = 1007
INTERNAL_ERROR = 1011


class Receiver(Protocol):
    """Where a WebSocket's messages go."""

    def received_text(self, text: str) -> Coroutine[Any, Any, None] | None:
        """Handle one text message: the coroutine (if any) runs inline until it waits."""

    def received_binary(self) -> None:
        """A binary message came (it is not read)."""

    def handling_failed(self, exc: Exception) -> None:
        """Handling a text message raised ``exc``."""

    def writable(self) -> None:
        """The transport's buffer has drained: it takes more."""

    def closed(self) -> None:
        """The connection is gone, and every message that came was handled. Once."""


class SansIoWebSocket(asyncio.Protocol):
    """One WebSocket connection: a client's, its opening handshake done by whoever made
    it; or a link's, from its TCP connection on (the upgrade's answer is read here)."""

    __slots__ = (
        "_ended",
        "_fragments",
        "_heard",
        "_held",
        "_open",
        "_pinged",
        "_receiver",
        "_resumed",
        "_task",
        "_timer",
        "_waiters",
        "frames",
        "inline",
        "lost",
        "paused",
        "transport",
    )

    def __init__(self, frames: Frames, receiver: Receiver) -> None:
        #: the sans-I/O protocol (its state, the close frames sent and received)
        self.frames = frames
        self._receiver = receiver
        self.transport: asyncio.Transport | None = None
        #: the transport's buffer is full: writers should wait (:func:`~router.server.links.waiting.drained`)
        self.paused = False
        #: the TCP connection is gone
        self.lost = False
        #: the protocol is open and the connection there (:meth:`_sync`)
        self._open = False
        #: the receiver has been told the connection ended
        self._ended = False
        #: the task finishing a message's handler that had to wait
        self._task: asyncio.Task[None] | None = None
        #: messages that came while :attr:`_task` ran, to handle after it, in order
        self._held: collections.deque[str] | None = None
        #: the parts of a fragmented message: a list for text, None for none, () binary
        self._fragments: list[BytesLike] | tuple[()] | None = None
        self._heard = False
        self._pinged = False
        #: the heartbeat, or the closing handshake's deadline
        self._timer: asyncio.TimerHandle | None = None
        #: who waits for the buffer to drain, or for the connection to end
        self._waiters: list[asyncio.Future[None]] | None = None
        self._resumed = True
        #: a message's handler runs inline until it waits (else each in a task)
        self.inline = True

    # -- asyncio.Protocol ----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self._sync()
        self._beat_in(HEARTBEAT)

    def data_received(self, data: bytes) -> None:
        self._heard = True
        frames = self.frames
        if frames.state is CONNECTING:  # a link's upgrade: the server's answer
            frames.receive_data(data)
            events = frames.events_received()
            if frames.state is OPEN and data.endswith(b"\r\n\r\n"):  # nothing after it
                self.frames = opened(frames)
            self.received(events)
            return
        frames.receive_data(data)
        self.received(frames.events_received())

    def received(self, events: list[Event]) -> None:
        """Act on what the protocol read (``data_received``, or bytes read before the
        connection was handed over)."""
        self._sync()
        self.flush()
        frames = self.frames
        for frame in events:
            if not isinstance(frame, Frame):  # the opening handshake's answer (a link's)
                self._wake()
                continue
            opcode = frame.opcode
            if opcode is Opcode.TEXT:
                if frame.fin:
                    self._text(frame.data)
                else:
                    self._fragments = [frame.data]
            elif opcode is Opcode.CONT:
                fragments = self._fragments
                if isinstance(fragments, list):
                    fragments.append(frame.data)
                if frame.fin:
                    self._fragments = None
                    if isinstance(fragments, list):
                        self._text(b"".join(fragments))
            elif opcode is Opcode.BINARY:
                if not frame.fin:
                    self._fragments = ()
                self._receiver.received_binary()
            elif opcode is Opcode.CLOSE:  # the closing handshake is done, or started
                self._wake()
        if frames.close_expected():
            self._closing()

    def eof_received(self) -> bool | None:
        self.frames.receive_eof()
        self._sync()
        self.flush()
        return None  # the transport closes itself

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        self._wake()
        self._receiver.writable()

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self.paused = False
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self.frames.receive_eof()
        self.frames.data_to_send()  # nowhere to send it now
        self._sync()
        self._wake()
        if self._task is None:
            self._end()

    # -- writing -------------------------------------------------------------------------------

    def send(self, text: str) -> bool:
        """Write one text message, never waiting (see :attr:`paused`); False when the
        connection is closing or closed (nothing is written)."""
        if not self._open:
            return False
        self.frames.send_text(text.encode())
        self.flush()
        return True

    def _sync(self) -> None:
        """Note whether the protocol is open: its state changes only in the calls this
        class makes to it, each followed by this."""
        self._open = self.frames.state is OPEN and not self.lost

    def close(self, code: int, reason: str = "", timeout: float = CLOSE_TIMEOUT) -> None:
        """Start the closing handshake (once); the TCP connection is dropped if it does not
        finish within ``timeout`` seconds."""
        if self._open:
            self.frames.send_close(code, reason)
            self._sync()
            self.flush()
            self._closing(timeout)

    def abort(self) -> None:
        """Drop the TCP connection now."""
        if self.transport is not None:
            self.transport.abort()

    def flush(self) -> None:
        """Write what the protocol has to send."""
        transport = self.transport
        for data in self.frames.data_to_send():
            if transport is None or transport.is_closing():
                continue
            if data:
                transport.write(data)
            elif transport.can_write_eof():  # the closing handshake is done: half-close
                transport.write_eof()
            else:
                transport.close()

    def waiter(self) -> asyncio.Future[None]:
        """A future set at the next change a wait may be waiting for (the buffer drained,
        the handshake's answer, a close frame, the connection gone):
        :mod:`router.server.links.waiting`."""
        future = asyncio.get_running_loop().create_future()
        if self._waiters is None:
            self._waiters = []
        self._waiters.append(future)
        return future

    def _wake(self) -> None:
        waiters, self._waiters = self._waiters, None
        for future in waiters or ():
            if not future.done():
                future.set_result(None)

    # -- reading -------------------------------------------------------------------------------

    def _text(self, data: BytesLike, frame: bytes | None = None) -> None:
        """One text message, ``data`` its payload; ``frame``: the whole frame it came in,
        when that is a frame a server side sends as it is (:class:`Verbatim`)."""
        try:
            text = str(data, "utf-8")
        except UnicodeDecodeError as exc:
            self._fail(INVALID_DATA, f"invalid UTF-8 at position {exc.start}")
            return
        if frame is not None:
            VERBATIM.frame, VERBATIM.text = frame, text
        if self._task is not None:  # a message before this one is still being handled
            if self._held is None:
                self._held = collections.deque()
            self._held.append(text)
            return
        self._handle(text)

    def _handle(self, text: str) -> bool:
        """Hand ``text`` to the receiver; True when its handler waits (in a task)."""
        try:
            handling = self._receiver.received_text(text)
            if handling is None:
                return False
            if self.inline:
                task = run_inline(handling, "websocket-message")
            else:
                task = asyncio.create_task(handling, name="websocket-message")
        except Exception as exc:  # noqa: BLE001 (the handler's failure is the receiver's to answer)
            self._receiver.handling_failed(exc)
            return False
        if task is None:
            return False
        self._task = task
        task.add_done_callback(self._handled)
        if self.transport is not None and not self.lost:
            self.transport.pause_reading()
            self._resumed = False
        return True

    def _handled(self, task: asyncio.Task[None]) -> None:
        self._task = None
        failure = None if task.cancelled() else task.exception()
        if isinstance(failure, Exception):
            self._receiver.handling_failed(failure)
        held = self._held
        while held:
            if self._handle(held.popleft()):  # that one waits too: the rest stays held
                return
        self._held = None
        if self.lost:
            self._end()
        elif not self._resumed and self.transport is not None:
            self._resumed = True
            self.transport.resume_reading()

    def _end(self) -> None:
        if not self._ended:
            self._ended = True
            self._receiver.closed()

    # -- closing and the heartbeat -----------------------------------------------------------

    def _fail(self, code: int, reason: str) -> None:
        self.frames.fail(code, reason)
        self._sync()
        self.flush()
        self._closing()

    def _closing(self, timeout: float = CLOSE_TIMEOUT) -> None:
        """The connection is expected to close: give it ``timeout`` seconds. A client
        side that failed the connection (it refused the server's frame), or got the
        server's close frame, closes the TCP connection itself rather than waiting for
        the server to."""
        if self._timer is not None:
            self._timer.cancel()
        self._timer = asyncio.get_running_loop().call_later(timeout, self.abort)
        frames = self.frames
        failed_or_answered = frames.parser_exc is not None or frames.close_rcvd is not None
        if frames.side is Side.CLIENT and failed_or_answered and self.transport is not None:
            self.transport.close()

    def _beat_in(self, seconds: float) -> None:
        self._timer = asyncio.get_running_loop().call_later(seconds, self._beat)

    def _beat(self) -> None:
        if self._heard:
            self._heard = self._pinged = False
            self._beat_in(HEARTBEAT)
        elif not self._pinged and self.frames.state is OPEN:
            self._pinged = True
            self.frames.send_ping(b"")
            self.flush()
            self._beat_in(HEARTBEAT / 2)
        else:  # no pong: the peer is gone
            self._timer = None
            self.abort()


def opened(handshake: Frames) -> Frames:
    """A protocol that goes on from ``handshake``'s (its opening handshake just done, at
    a frame boundary) with the same side, limits and extensions, but made open: websockets'
    handshake parser keeps the request or response it read (~2.5 KiB of headers) for as
    long as the connection lives; this one keeps none."""
    limits = (handshake.max_message_size, handshake.max_fragment_size)
    frames = Frames(handshake.side, state=OPEN, max_size=limits, logger=handshake.logger)
    frames.extensions = handshake.extensions
    return frames


class Verbatim:
    """The last text message read in a frame a server side would send as it is: a whole
    final text frame, unmasked (read from a server), no extension bits, its length in the
    fewest bytes (RFC 6455 5.2), and the text it carries. A server side sending that very
    text (the same str object: an agent's update or answer relayed to the editor as it
    came) writes the frame's bytes (:meth:`router.server.links.websocket.WebSocket.send`),
    without encoding the text again or building a header: the bytes it would have built.
    One per process (callbacks run one at a time); it holds one frame, at most
    :data:`~router.server.links.websocket.FAST_BYTES` and its header."""

    __slots__ = ("frame", "text")

    def __init__(self) -> None:
        self.frame = b""
        self.text: str | None = None


#: the frame last read that a server side may send as it came
VERBATIM = Verbatim()
