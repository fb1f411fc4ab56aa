"""The router's WebSocket reads whole final text frames itself and hands every other
frame to websockets' sans-I/O protocol (:class:`router.server.links.websocket.WebSocket`): for
any stream of frames, cut into reads anywhere, it must see exactly what the protocol
alone sees (the same messages, in order, the same binary frames) and write the same
bytes back (pongs, the close echo, a failure's close frame); and a text frame it writes
itself must read back as the protocol's own. A server's frame relayed as it came (the
same text sent on) is written as the router would write that text anew.
"""

from __future__ import annotations

import asyncio
import itertools

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from websockets.frames import Frame, Opcode
from websockets.protocol import Protocol, Side

from router.server.links.sansio_websocket import VERBATIM
from router.server.links.websocket import FAST_BYTES, MaskKeys, WebSocket, text_frame
from tests.sockets import KeptTransport, Receiver

LIMIT = 1 << 20


class Seen(Receiver):
    """A receiver that keeps what it is handed."""

    def __init__(self) -> None:
        self.messages: list[str | bytes] = []

    def received_text(self, text: str) -> None:
        self.messages.append(text)

    def received_binary(self) -> None:
        self.messages.append(b"binary")


def reference(data: bytes) -> tuple[list[str | bytes], bytes]:
    """What websockets' protocol alone makes of ``data``: messages, and bytes written."""
    protocol = Protocol(Side.SERVER, max_size=LIMIT)
    protocol.receive_data(data)
    messages: list[str | bytes] = []
    parts: list[bytes] | None = None
    for event in protocol.events_received():
        assert isinstance(event, Frame)
        if event.opcode is Opcode.TEXT:
            parts = [bytes(event.data)]
        elif event.opcode is Opcode.BINARY:
            parts = None
            messages.append(b"binary")
            continue
        elif event.opcode is Opcode.CONT and parts is not None:
            parts.append(bytes(event.data))
        else:
            continue
        if event.fin and parts is not None:
            messages.append(b"".join(parts).decode())
            parts = None
    written = b"".join(chunk if chunk else b"<eof>" for chunk in protocol.data_to_send())
    return messages, written


async def router_reads(data: bytes, cuts: list[int]) -> tuple[list[str | bytes], bytes]:
    seen = Seen()
    ws = WebSocket(Protocol(Side.SERVER, max_size=LIMIT), seen)
    transport = KeptTransport()
    ws.connection_made(transport)
    start = 0
    for cut in [*sorted(cuts), len(data)]:
        if cut > start:
            ws.data_received(data[start:cut])
            start = cut
    ws.connection_lost(None)
    return seen.messages, bytes(transport.written)


def client_frames(frames: list[Frame]) -> bytes:
    """``frames`` as a client sends them (masked)."""
    client = Protocol(Side.CLIENT, max_size=None)
    for frame in frames:
        client.send_frame(frame)
    return b"".join(client.data_to_send())


LENGTHS = st.one_of(
    st.integers(0, 300), st.sampled_from([125, 126, 127, 65535, 65536, FAST_BYTES + 1])
)


@st.composite
def a_frame(draw: st.DrawFn) -> list[Frame]:
    kind = draw(st.sampled_from(["text", "text", "text", "fragments", "binary", "ping", "pong"]))
    if kind == "text":
        size = draw(LENGTHS)
        return [Frame(Opcode.TEXT, ("é" * (size // 2) + "x" * (size % 2)).encode())]
    if kind == "fragments":
        parts = draw(st.lists(st.text(max_size=40), min_size=2, max_size=4))
        first = Frame(Opcode.TEXT, parts[0].encode(), fin=False)
        middle = [Frame(Opcode.CONT, part.encode(), fin=False) for part in parts[1:-1]]
        return [first, *middle, Frame(Opcode.CONT, parts[-1].encode())]
    if kind == "binary":
        return [Frame(Opcode.BINARY, bytes(draw(st.integers(0, 200))))]
    opcode = Opcode.PING if kind == "ping" else Opcode.PONG
    return [Frame(opcode, draw(st.binary(max_size=20)))]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(a_frame(), max_size=12),
    st.booleans(),
    st.lists(st.integers(0, 200_000), max_size=8),
)
def test_any_stream_of_frames_reads_as_the_protocol_alone_reads_it(
    stream: list[list[Frame]], closing: bool, cuts: list[int]
) -> None:
    frames = [frame for group in stream for frame in group]
    if closing:
        frames.append(Frame(Opcode.CLOSE, b"\x03\xe8bye"))
        frames.append(Frame(Opcode.TEXT, b"after the close"))
    data = client_frames(frames)
    assert asyncio.run(router_reads(data, cuts)) == reference(data)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(a_frame(), min_size=1, max_size=6), st.booleans())
def test_frames_read_one_whole_frame_a_read_read_as_the_protocol_alone_reads_them(
    stream: list[list[Frame]], closing: bool
) -> None:
    """Each read is one whole frame (how prompts and answers come): the reads the
    router takes without splitting them."""
    frames = [frame for group in stream for frame in group]
    if closing:
        frames.append(Frame(Opcode.CLOSE, b"\x03\xe8bye"))
        frames.append(Frame(Opcode.TEXT, b"after the close"))
    ends = list(itertools.accumulate(len(client_frames([frame])) for frame in frames))
    data = client_frames(frames)
    assert asyncio.run(router_reads(data, ends)) == reference(data)


@pytest.mark.parametrize("size", [0, 1, 125, 126, 127, 65535, 65536, FAST_BYTES + 1])
def test_a_whole_frame_in_one_read_reads_as_the_protocol_alone_reads_it(size: int) -> None:
    data = client_frames([Frame(Opcode.TEXT, b"x" * size), Frame(Opcode.TEXT, b"next")])
    first = len(client_frames([Frame(Opcode.TEXT, b"x" * size)]))
    assert asyncio.run(router_reads(data, [first])) == reference(data)


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(bytes((0x81, 5)) + b"hello", id="unmasked"),
        pytest.param(bytes((0xC1, 0x80)) + b"\x00\x00\x00\x00", id="reserved-bit"),
        pytest.param(client_frames([Frame(Opcode.TEXT, b"\xff\xfe")]), id="not-utf8"),
        pytest.param(client_frames([Frame(Opcode.TEXT, b"x" * (LIMIT + 1))]), id="too-big"),
        pytest.param(client_frames([Frame(Opcode.CONT, b"stray")]), id="stray-continuation"),
    ],
)
def test_a_bad_frame_fails_the_connection_as_the_protocol_does(data: bytes) -> None:
    messages, written = asyncio.run(router_reads(data, [1, 3]))
    assert messages == []
    code = written[2:4]  # the close frame's code, after its two header bytes
    expected = {b"\x03\xea", b"\x03\xef", b"\x03\xf1"}  # 1002, 1007, 1009
    assert code in expected, written


@pytest.mark.parametrize("size", [0, 125, 126, 65535, 65536, 200_000])
@pytest.mark.parametrize("masked", [False, True])
def test_a_text_frame_written_here_reads_as_the_protocols_own(size: int, masked: bool) -> None:
    payload = ("ü" * (size // 2) + "x" * (size % 2)).encode()
    reader = Protocol(Side.SERVER if masked else Side.CLIENT, max_size=None)
    reader.receive_data(text_frame(payload, masked=masked))
    [frame] = reader.events_received()
    assert isinstance(frame, Frame)
    assert (frame.opcode, frame.fin, bytes(frame.data)) == (Opcode.TEXT, True, payload)


def test_masking_keys_are_fresh_for_every_frame_and_after_a_fork() -> None:
    keys = MaskKeys()
    drawn = [keys.next() for _ in range(3000)]  # past the first 4 KiB of random bytes
    assert all(len(key) == 4 for key in drawn)
    assert len(set(drawn)) > 2900  # 32-bit keys: a repeat in 3,000 is rare, many are not
    keys.reset()
    assert keys.next() not in drawn[-5:]  # fresh bytes, not the pool's rest
    reader = Protocol(Side.SERVER, max_size=None)
    first, second = text_frame(b"same", masked=True), text_frame(b"same", masked=True)
    assert first != second  # another key for each frame
    reader.receive_data(first + second)
    read = [bytes(f.data) for f in reader.events_received() if isinstance(f, Frame)]
    assert read == [b"same", b"same"]


class Relay(Receiver):
    """A backend link's receiver that sends every text it is handed on to ``to``."""

    def __init__(self, to: WebSocket) -> None:
        self.to = to

    def received_text(self, text: str) -> None:
        self.to.send(text)


def server_frame(payload: bytes, length_bytes: int) -> bytes:
    """A final text frame as a server sends it (unmasked), its length in ``length_bytes``
    more bytes (0: in the second byte), minimal or not."""
    if length_bytes == 0:
        return bytes((0x81, len(payload))) + payload
    marker = 126 if length_bytes == 2 else 127
    return bytes((0x81, marker)) + len(payload).to_bytes(length_bytes, "big") + payload


async def relayed(data: bytes, cuts: list[int]) -> bytes:
    """What a client side's editor is written when a backend link reads ``data`` (cut into
    reads at ``cuts``) and relays each text as it came."""
    editor = WebSocket(Protocol(Side.SERVER, max_size=LIMIT), Seen())
    written = KeptTransport()
    editor.connection_made(written)
    link = WebSocket(Protocol(Side.CLIENT, max_size=LIMIT), Relay(editor))
    link.connection_made(KeptTransport())
    start = 0
    for cut in [*sorted(cuts), len(data)]:
        if cut > start:
            link.data_received(data[start:cut])
            start = cut
    return bytes(written.written)


def protocol_writes(payloads: list[bytes]) -> bytes:
    """What websockets' protocol writes, as a server, sending each payload as a text."""
    server = Protocol(Side.SERVER, max_size=None)
    for payload in payloads:
        server.send_text(payload)
    return b"".join(server.data_to_send())


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(
            st.one_of(st.integers(0, 300), st.sampled_from([125, 126, 127, 65535, 65536])),
            st.sampled_from([0, 2, 8]),
        ),
        min_size=1,
        max_size=8,
    ),
    st.booleans(),
)
def test_a_servers_frame_relayed_as_it_came_is_written_as_a_new_one(
    frames: list[tuple[int, int]], one_a_read: bool
) -> None:
    """Whatever length form the backend chose (the fewest bytes, or more), and however
    its frames came (one a read, or all in one), what the editor is written is what
    websockets writes for the same texts."""
    payloads = [("é" * (size // 2) + "x" * (size % 2)).encode() for size, _ in frames]
    encoded = [
        server_frame(payload, 8 if len(payload) > {0: 125, 2: 65535, 8: 2**63}[form] else form)
        for payload, (_, form) in zip(payloads, frames, strict=True)
    ]
    cuts = list(itertools.accumulate(len(frame) for frame in encoded)) if one_a_read else []
    assert asyncio.run(relayed(b"".join(encoded), cuts)) == protocol_writes(payloads)


@pytest.mark.parametrize("size", [0, 125, 126, 65535, 65536])
def test_a_frame_whose_length_takes_the_fewest_bytes_is_written_as_it_came(size: int) -> None:
    payload = b"x" * size
    frame = server_frame(payload, 0 if size < 126 else 2 if size < 65536 else 8)
    assert asyncio.run(relayed(frame + frame, [len(frame)])) == frame + frame
    assert VERBATIM.frame == frame
    assert VERBATIM.text == payload.decode()
