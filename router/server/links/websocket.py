"""The router's WebSocket, for its client connections and backend links: a
:class:`~router.server.links.sansio_websocket.SansIoWebSocket` that reads and writes the one
frame nearly all traffic is (a whole, final text frame of up to :data:`FAST_BYTES`)
itself, and hands every other frame to websockets' protocol byte for byte
(docs/architecture.md, "Every rule and its file").

The messages a burst (a read that brought several frames) leads to are written once
that read is done (:class:`Burst`).
"""

from __future__ import annotations

import logging
import os
import struct
from typing import Final

from websockets.protocol import OPEN, Protocol as Frames, Side

try:  # websockets' C speedup, when it was built
    from websockets.speedups import apply_mask
except ImportError:  # pragma: no cover
    from websockets.utils import apply_mask

from router.server.links.sansio_websocket import VERBATIM, Receiver, SansIoWebSocket

#: websockets' own log lines for the router's connections ("connection open" at INFO for
#: every one of them): warnings and errors only
FRAMES_LOG = logging.getLogger(f"{__name__}.frames")
FRAMES_LOG.setLevel(logging.WARNING)


class WebSocket(SansIoWebSocket):
    """One WebSocket connection (:class:`SansIoWebSocket`), whose whole final text frames
    are read and written here."""

    __slots__ = ("_batch", "_fast", "_masked", "_rest", "_through")

    def __init__(self, frames: Frames, receiver: Receiver) -> None:
        super().__init__(frames, receiver)
        #: messages held while another WebSocket reads a burst (None: none are)
        self._batch: list[bytes] | None = None
        #: bytes read that do not make a whole frame yet
        self._rest = b""
        #: bytes still to come of the frame the protocol is reading
        self._through = 0
        #: a client side masks the frames it sends
        self._masked = frames.side is Side.CLIENT
        #: the longest text frame read here (the protocol's limits outlive its handshake)
        limit = frames.max_message_size
        self._fast = FAST_BYTES if limit is None else min(limit, FAST_BYTES)

    # -- reading -------------------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        # a read that is one whole final text frame (a prompt, its answer: most reads) is
        # read here, as _split would read it, without _split's loop (a tenth of the
        # router's bytecodes per round trip)
        end = len(data)
        if end > 5 and data[0] == FINAL_TEXT and self._open and not (self._through or self._rest):
            second = data[1]
            server = second >= 0x80  # masked: what a server side reads
            length = second & 0x7F
            if length == 126:
                length, head = (data[2] << 8) | data[3], 8 if server else 4
            elif length == 127:  # 64 KiB or more: never read here
                length, head = end, end
            else:
                head = 6 if server else 2
            frames = self.frames
            if (
                head + length == end
                and server is not self._masked
                and length <= self._fast
                and not frames.extensions
                and frames.current_size is None
            ):
                self._heard = True
                if server:
                    self._text(apply_mask(data[head:], data[head - 4 : head]))
                else:  # a server's frame: sent on as it came, when its length is minimal
                    self._text(data[head:], data if head == 2 or length > 125 else None)
                return
        self._read(data)

    def _read(self, data: bytes) -> None:
        if not self._open or self.frames.extensions:  # opening, closing, or deflate: all its
            if self._rest:
                data, self._rest = self._rest + data, b""
            super().data_received(data)
            return
        self._heard = True
        if self._through:  # the rest of a frame the protocol has begun to read
            data = self._pass(data)
        elif self._rest:
            data, self._rest = self._rest + data, b""
        if not data:
            return
        if BURST.reading:
            self._split(data)
            return
        try:
            self._split(data)
        finally:
            if BURST.holding or BURST.reading:  # _split began one
                BURST.end()

    def _split(self, data: bytes) -> None:
        """Read whole final text frames here (the frames nearly all traffic is); hand
        every other frame to the protocol, byte for byte and in order, so that it only
        ever starts reading at a frame's first byte. A whole frame with more bytes after
        it begins a burst (:class:`Burst`), unless one is being read: what the rest of
        this read leads to is written once it is read (:meth:`data_received` ends it)."""
        frames = self.frames
        server = not self._masked
        fast = self._fast
        i, end = 0, len(data)
        while i < end:
            if end - i < 2:
                break
            second = data[i + 1]
            length = second & 0x7F
            if length < 126:
                head = 6 if second & 0x80 else 2
            elif length == 126:  # 126 to 65,535 bytes: most updates
                if end - i < 4:
                    break
                length = (data[i + 2] << 8) | data[i + 3]
                head = 8 if second & 0x80 else 4
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
                if stop < end and not BURST.reading:
                    BURST.begin()  # several frames in one read
                payload = data[i + head : stop]
                if server:
                    self._text(apply_mask(payload, data[i + head - 4 : i + head]))
                else:  # a server's frame: sent on as it came, when its length is minimal
                    minimal = head == 2 or length > (125 if head == 4 else 65535)
                    self._text(payload, data[i:stop] if minimal else None)
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
            return super().send(text)
        if self._masked:
            data = text_frame(text.encode(), masked=True)
        elif text is VERBATIM.text:  # relayed as it came: its frame, byte for byte
            data = VERBATIM.frame
        else:
            payload = text.encode()
            data = text_header(len(payload)) + payload
        if BURST.reading:
            batch = self._batch
            if batch is None:
                batch = self._batch = []
                BURST.holding.append(self)
            batch.append(data)
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

    def flush(self) -> None:
        """Write the messages waiting in a batch, then what the protocol has to send."""
        batch = self._batch
        if batch:  # held messages go first (the burst's end then finds none)
            transport = self.transport
            if transport is not None and not transport.is_closing():
                transport.write(b"".join(batch))
            batch.clear()
        super().flush()


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


#: a header of a text frame of 126 to 65,535 bytes: its first byte, its second, the length
_MID_HEADER: Final = struct.Struct("!BBH").pack


def text_header(length: int, flag: int = 0) -> bytes:
    """The header of a final text frame of ``length`` bytes (``flag`` 0x80: masked, the
    key to follow)."""
    if length < 126:
        return bytes((FINAL_TEXT, flag | length))
    if length < 65536:
        return _MID_HEADER(FINAL_TEXT, flag | 126, length)
    return bytes((FINAL_TEXT, flag | 127)) + length.to_bytes(8, "big")


class MaskKeys:
    """Masking keys for the frames a client side sends (RFC 6455 5.3: fresh and
    unpredictable): the system's random bytes, read 4 KiB at a time, so that a frame costs
    a slice, not a system call."""

    __slots__ = ("_at", "_pool")

    def __init__(self) -> None:
        self._pool = b""
        self._at = 0

    def reset(self) -> None:
        """Read fresh bytes for the next key (a forked process must not repeat its
        parent's)."""
        self._pool, self._at = b"", 0

    def next(self) -> bytes:
        at = self._at
        if at >= len(self._pool):
            self._pool, at = os.urandom(4096), 0
        self._at = at + 4
        return self._pool[at : at + 4]


MASK_KEYS = MaskKeys()
os.register_at_fork(after_in_child=MASK_KEYS.reset)


def text_frame(payload: bytes, *, masked: bool) -> bytes:
    """One final text frame carrying ``payload`` (masked with a random key: a client's)."""
    if not masked:
        return text_header(len(payload)) + payload
    key = MASK_KEYS.next()
    return text_header(len(payload), 0x80) + key + apply_mask(payload, key)
