"""A WebSocket on an asyncio transport: the router's client connections and backend links.

websockets' sans-I/O protocol (:class:`websockets.protocol.Protocol`) reads and writes
the frames, answers pings, keeps the size limit (a larger message fails the connection
with 1009), checks masking (an unmasked frame from a client fails it with 1002) and runs
the closing handshake; :class:`WebSocket` drives it from ``asyncio.Protocol`` callbacks,
and reads and writes the one frame nearly all traffic is (a whole, final text frame of up
to :data:`FAST_BYTES`) itself, handing every other frame to the protocol byte for byte.
So an idle connection holds no task and no coroutine, only its objects (README's
"Benchmarks": the bytes per idle client), and a frame costs no task switch: a text
frame's handler (:class:`Receiver`) runs inline from ``data_received``
(:func:`router.server.inline.run_inline`), and only a handler that has to wait gets a
task, while later frames are held back (and the transport stops reading) so that they
are handled in the order they came. Binary frames are handed on only as "one came" (ACP
ignores them). The messages a burst (a read that brought several frames) leads to are
written once that read is done (:class:`Burst`). A connection that says nothing for
:data:`HEARTBEAT` seconds is pinged, and dropped if it still says nothing for half as
long again. A closing handshake that does not finish within :data:`CLOSE_TIMEOUT`
seconds drops the TCP connection.

:class:`WebSocketChannel` is a client connection's side of this: its
:class:`~router.server.client.ClientChannel` and the receiver that feeds the connection
its frames.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, Protocol, cast

from websockets.frames import Frame, Opcode
from websockets.protocol import CONNECTING, OPEN, Event, Protocol as Frames, Side
from websockets.typing import BytesLike

try:  # websockets' C speedup, when it was built
    from websockets.speedups import apply_mask
except ImportError:  # pragma: no cover
    from websockets.utils import apply_mask

from router.protocol.jsonrpc import Message, RequestId
from router.server.inline import run_inline
from router.server.metrics import Metrics

if TYPE_CHECKING:  # the client connection uses links, which use this module
    from router.server.client import ClientConnection

logger = logging.getLogger(__name__)

#: websockets' own log lines for the router's connections ("connection open" at INFO for
#: every one of them): warnings and errors only
FRAMES_LOG = logging.getLogger(f"{__name__}.frames")
FRAMES_LOG.setLevel(logging.WARNING)

#: seconds of silence from the peer before a ping; half as long again without a word drops it
HEARTBEAT = 30.0
#: seconds a closing handshake may take before the TCP connection is dropped
CLOSE_TIMEOUT = 10.0

#: close codes the router sends
INVALID_DATA = 1007
INTERNAL_ERROR = 1011


class Receiver(Protocol):
    """Where a :class:`WebSocket`'s messages go."""

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


class WebSocket(asyncio.Protocol):
    """One WebSocket connection: a client's, its opening handshake done by whoever made
    it; or a link's, from its TCP connection on (the upgrade's answer is read here)."""

    __slots__ = (
        "_batch",
        "_ended",
        "_fragments",
        "_heard",
        "_held",
        "_open",
        "_pinged",
        "_receiver",
        "_rest",
        "_resumed",
        "_task",
        "_through",
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
        #: the transport's buffer is full: writers should wait (:meth:`drained`)
        self.paused = False
        #: the TCP connection is gone
        self.lost = False
        #: the protocol is open and the connection there (:meth:`_sync`)
        self._open = False
        #: messages held while another WebSocket reads a burst (None: none are)
        self._batch: list[bytes] | None = None
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
        #: bytes read that do not make a whole frame yet
        self._rest = b""
        #: bytes still to come of the frame the protocol is reading
        self._through = 0
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
        if not self._open or frames.extensions:  # closing, or deflate: all its
            if self._rest:
                data, self._rest = self._rest + data, b""
            frames.receive_data(data)
            self.received(frames.events_received())
            return
        if self._through:  # the rest of a frame the protocol has begun to read
            data = self._pass(data)
        elif self._rest:
            data, self._rest = self._rest + data, b""
        if not data:
            return
        if BURST.reading or not several(data):
            self._split(data)
            return
        BURST.begin()  # what this read's frames lead to is written once it is read
        try:
            self._split(data)
        finally:
            BURST.end()

    def _split(self, data: bytes) -> None:
        """Read whole final text frames here (the frames nearly all traffic is); hand
        every other frame to the protocol, byte for byte and in order, so that it only
        ever starts reading at a frame's first byte."""
        frames = self.frames
        server = frames.side is Side.SERVER
        limit = frames.max_message_size
        fast = FAST_BYTES if limit is None else min(limit, FAST_BYTES)
        i, end = 0, len(data)
        while i < end:
            if end - i < 2:
                break
            second = data[i + 1]
            length = second & 0x7F
            if length < 126:
                head = 6 if second & 0x80 else 2
            else:
                bounds = frame_bounds(data, i)
                if bounds is None:  # its header is not all here yet
                    break
                _, head, length = bounds
            if (
                data[i] == FINAL_TEXT
                and (second >= 0x80) is server
                and length <= fast
                and self._open
                and frames.current_size is None
            ):
                stop = i + head + length
                if stop > end:
                    break
                payload = data[i + head : stop]
                if server:
                    payload = apply_mask(payload, data[i + head - 4 : i + head])
                self._text(payload)
                i = stop
                continue
            # the protocol's: this frame's bytes that are here, and the rest when they
            # come; and, once it is no longer open, everything
            self._through = head + length if self._open else end - i
            data = self._pass(data[i:] if i else data)
            i, end = 0, len(data)
        self._rest = data[i:] if i < end else b""

    def _pass(self, data: bytes) -> bytes:
        """Hand the protocol the bytes of the frame it is reading (:attr:`_through` more
        of them); what follows that frame, unread (none while the frame goes on, or once
        the protocol has stopped reading frames)."""
        take = self._through
        mine, rest = (data, b"") if len(data) <= take else (data[:take], data[take:])
        self._through = take - len(mine)
        frames = self.frames
        frames.receive_data(mine)
        self.received(frames.events_received())
        if self._through or frames.state is not OPEN:
            if rest and frames.state is not OPEN:
                frames.receive_data(rest)
                self.received(frames.events_received())
            return b""
        return rest

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
        connection is closing or closed (nothing is written).

        Messages sent while another WebSocket reads a burst (several frames in one read:
        a backend's streamed updates, ~25 to a read) are held and go out in one write
        when that read is done (:class:`Burst`), instead of one system call and one TCP
        segment each. Any other message (a prompt's answer, the first of a burst) is
        written at once.
        """
        if not self._open:
            return False
        frames = self.frames
        if frames.extensions or self.transport is None:
            frames.send_text(text.encode())
            self.flush()
            return True
        data = text_frame(text.encode(), masked=frames.side is Side.CLIENT)
        if BURST.reading:
            if self._batch is None:
                self._batch = []
                BURST.holding.append(self)
            self._batch.append(data)
            return True
        self.transport.write(data)
        return True

    @property
    def batched(self) -> int:
        """Messages held until the burst being read is done (:meth:`send`)."""
        return len(self._batch) if self._batch else 0

    def write_batch(self) -> None:
        """Write the messages held (the burst is done)."""
        batch, self._batch = self._batch, None
        if batch and self.transport is not None and not self.transport.is_closing():
            self.transport.write(b"".join(batch))

    def _sync(self) -> None:
        """Note whether the protocol is open: its state changes only in the calls this
        class makes to it, each followed by this."""
        self._open = self.frames.state is OPEN and not self.lost

    async def drained(self) -> None:
        """Wait while the transport's buffer is full (until it drains or the
        connection ends)."""
        while self.paused and not self.lost:
            await self._waiter()

    def close(self, code: int, reason: str = "", timeout: float = CLOSE_TIMEOUT) -> None:
        """Start the closing handshake (once); the TCP connection is dropped if it does not
        finish within ``timeout`` seconds."""
        if self._open:
            self.frames.send_close(code, reason)
            self._sync()
            self.flush()
            self._closing(timeout)

    async def opened(self) -> None:
        """Wait for the end of the opening handshake (a link's: the server's answer), or
        of the connection."""
        while self.frames.state is CONNECTING and not self.lost:
            await self._waiter()

    async def wait_closed(self) -> None:
        """Wait until the TCP connection is gone."""
        while not self.lost:
            await self._waiter()

    async def wait_close_frame(self) -> None:
        """Wait until the peer's close frame has come (the closing handshake is done, on
        the router's side), or the connection is gone."""
        while self.frames.close_rcvd is None and not self.lost:
            await self._waiter()

    def abort(self) -> None:
        """Drop the TCP connection now."""
        if self.transport is not None:
            self.transport.abort()

    def flush(self) -> None:
        """Write what the protocol has to send (after the messages waiting in a batch)."""
        transport = self.transport
        batch = self._batch
        if batch:  # held messages go first (the burst's end then finds none)
            if transport is not None and not transport.is_closing():
                transport.write(b"".join(batch))
            batch.clear()
        for data in self.frames.data_to_send():
            if transport is None or transport.is_closing():
                continue
            if data:
                transport.write(data)
            elif transport.can_write_eof():  # the closing handshake is done: half-close
                transport.write_eof()
            else:
                transport.close()

    def _waiter(self) -> asyncio.Future[None]:
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

    def _text(self, data: BytesLike) -> None:
        try:
            text = str(data, "utf-8")
        except UnicodeDecodeError as exc:
            self._fail(INVALID_DATA, f"invalid UTF-8 at position {exc.start}")
            return
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


#: the first byte of a final, unfragmented text frame without extension bits
FINAL_TEXT = 0x81
#: the largest text frame read here; a longer one is the protocol's, which buffers it
#: without copying what came before at every read
FAST_BYTES = 64 * 1024


def frame_bounds(data: bytes, i: int) -> tuple[int, int, int] | None:
    """The frame starting at ``data[i]``: its first byte, the length of its header (the
    mask key included) and of its payload; None when its header is not all there."""
    end = len(data)
    if end - i < 2:
        return None
    second = data[i + 1]
    length, head = second & 0x7F, 2
    if length == 126:
        if end - i < 4:
            return None
        length, head = int.from_bytes(data[i + 2 : i + 4], "big"), 4
    elif length == 127:
        if end - i < 10:
            return None
        length, head = int.from_bytes(data[i + 2 : i + 10], "big"), 10
    if second & 0x80:
        head += 4
    return data[i], head, length


def several(data: bytes) -> bool:
    """Whether ``data`` holds more than the first frame in it."""
    bounds = frame_bounds(data, 0)
    return bounds is not None and bounds[1] + bounds[2] < len(data)


class Burst:
    """While one WebSocket reads a burst (a read that brought several frames), the
    messages any WebSocket sends are held (:meth:`WebSocket.send`), and written, one
    write per WebSocket, when the read is done. The loop runs one callback at a time, so
    one burst is read at a time; a handler that waits finishes outside it (its later
    messages go out as they are sent)."""

    __slots__ = ("holding", "reading")

    def __init__(self) -> None:
        self.reading = False
        #: the WebSockets holding messages of this burst
        self.holding: list[WebSocket] = []

    def begin(self) -> None:
        self.reading = True

    def end(self) -> None:
        self.reading = False
        holding, self.holding = self.holding, []
        for ws in holding:
            ws.write_batch()


#: the burst being read, if any (one per process: callbacks run one at a time)
BURST = Burst()


def text_frame(payload: bytes, *, masked: bool) -> bytes:
    """One final text frame carrying ``payload`` (masked with a random key: a client's)."""
    length = len(payload)
    flag = 0x80 if masked else 0
    if length < 126:
        head = bytes((FINAL_TEXT, flag | length))
    elif length < 65536:
        head = bytes((FINAL_TEXT, flag | 126)) + length.to_bytes(2, "big")
    else:
        head = bytes((FINAL_TEXT, flag | 127)) + length.to_bytes(8, "big")
    if not masked:
        return head + payload
    key = os.urandom(4)
    return head + key + apply_mask(payload, key)


class WebSocketChannel:
    """A client connection's WebSocket: how the connection writes
    (:class:`~router.server.client.ClientChannel`), and where its frames go (the
    :class:`Receiver` of its :class:`WebSocket`).

    A frame is handed to the WebSocket when sent, so frames leave in call order (a burst
    goes out in one write when the loop turns: :meth:`WebSocket.send`), and a full
    transport makes the sender wait (:meth:`WebSocket.drained`).
    """

    __slots__ = ("_ended", "_metrics", "connection", "deadline", "ws")

    #: :meth:`send` never needs a task of its own
    inline = True

    def __init__(self, metrics: Metrics, ended: Callable[[WebSocketChannel], None]) -> None:
        self._metrics = metrics
        self._ended = ended
        self.ws: WebSocket | None = None
        #: the connection fed by this channel (set once it is made)
        self.connection: ClientConnection | None = None
        #: the connection's deadline for ``initialize`` (its owner's timer)
        self.deadline: asyncio.TimerHandle | None = None

    def attach(self, ws: WebSocket) -> None:
        """Write on ``ws`` (connected already)."""
        self.ws = ws

    def write(self, text: str) -> bool:
        ws = self.ws
        assert ws is not None
        if ws.paused:
            return False
        ws.send(text)  # a client that is gone is not an error (its connection ends)
        return True

    async def send(
        self, text: str, message: Message | None = None, answers: RequestId | None = None
    ) -> None:
        ws = self.ws
        assert ws is not None
        if ws.send(text) and ws.paused:
            await ws.drained()

    async def close(self, code: int, reason: str) -> None:
        """Close with ``code`` (after the frames sent before) and wait for the closing
        handshake (bounded)."""
        if self.ws is not None:
            self.ws.close(code, reason)
            await self.ws.wait_close_frame()

    # -- Receiver ------------------------------------------------------------------------------

    def received_text(self, text: str) -> Coroutine[Any, Any, None]:
        assert self.connection is not None
        return self.connection.receive(text)

    def received_binary(self) -> None:
        self._metrics.client_frames_ignored.labels("binary").inc()

    def handling_failed(self, exc: Exception) -> None:
        """The one boundary of a client connection: log it, close 1011."""
        logger.error("client connection failed", exc_info=exc)
        if self.ws is not None:
            self.ws.close(INTERNAL_ERROR)

    def writable(self) -> None:
        pass  # a sender waits in WebSocket.drained

    def closed(self) -> None:
        self._ended(self)
