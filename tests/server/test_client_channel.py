"""The client WebSocket's writer (:class:`router.server.connection.websocket_channel.WebSocketChannel`),
on a real server (the router's own WebSocket on an asyncio server, after websockets'
server handshake) and an aiohttp client over loopback: the frames a burst leads to (a
read that brings a backend's several frames at once) are held until that read is done,
then written at once; a lone frame never is; every frame arrives whole and in order
either way, and a close lets held frames go first.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from contextlib import asynccontextmanager
from typing import Any, cast

import aiohttp
from websockets.protocol import OPEN, Protocol, Side
from websockets.server import ServerProtocol

from router.server.connection.websocket_channel import WebSocketChannel
from router.server.links.websocket import WebSocket, text_frame
from router.server.observability.metrics import Metrics
from tests.sockets import KeptTransport, Receiver
from tests.support import WAIT

Writer = Callable[[WebSocketChannel], Awaitable[None]]


def held(channel: WebSocketChannel) -> int:
    """Frames the channel's WebSocket holds back until the loop turns."""
    assert channel.ws is not None
    return channel.ws.batched


@asynccontextmanager
async def channel_to_client(write: Writer) -> AsyncIterator[aiohttp.ClientWebSocketResponse]:
    """A server whose one WebSocket runs ``write`` with its channel and TCP socket; the
    client's end of that WebSocket."""
    writers: set[asyncio.Task[None]] = set()

    class Upgrade(asyncio.Protocol):
        """Reads the client's upgrade, answers it, then hands the connection to a
        WebSocket whose channel ``write`` gets."""

        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            self.transport = transport
            self.frames = ServerProtocol()

        def data_received(self, data: bytes) -> None:
            self.frames.receive_data(data)
            request = self.frames.events_received()[0]
            self.frames.send_response(self.frames.accept(request))  # type: ignore[arg-type]
            channel = WebSocketChannel(Metrics(), lambda _: None)
            ws = WebSocket(self.frames, channel)
            self.transport.set_protocol(ws)
            ws.connection_made(self.transport)
            ws.flush()
            channel.attach(ws)
            writers.add(asyncio.ensure_future(write(channel)))

    loop = asyncio.get_running_loop()
    server = await loop.create_server(Upgrade, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        async with aiohttp.ClientSession() as http:
            async with http.ws_connect(f"ws://127.0.0.1:{port}/") as ws:
                yield ws
        await asyncio.gather(*writers)
    finally:
        server.close()
        await server.wait_closed()


async def received(ws: aiohttp.ClientWebSocketResponse, count: int) -> list[str]:
    frames = []
    async with asyncio.timeout(WAIT):
        for _ in range(count):
            frames.append(await ws.receive_str())
    return frames


class Source(Receiver):
    """A WebSocket reading a backend's frames (over a transport that goes nowhere): each
    message it reads is handed to ``handle`` inline, as a link hands its messages to the
    client connection."""

    def __init__(self, handle: Callable[[str], Awaitable[None]]) -> None:
        self.handle = handle
        self.ws = WebSocket(Protocol(Side.CLIENT, state=OPEN), self)
        self.ws.connection_made(KeptTransport())

    def read(self, *texts: str) -> None:
        """One read that brings ``texts``, one frame each."""
        self.ws.data_received(b"".join(text_frame(t.encode(), masked=False) for t in texts))

    def received_text(self, text: str) -> Coroutine[Any, Any, None]:
        return cast(Coroutine[Any, Any, None], self.handle(text))


FRAMES = [f'{{"n":{n}}}' for n in range(50)]


async def test_a_burst_is_held_until_its_read_is_done_and_arrives_in_order() -> None:
    seen: list[int] = []

    async def burst(channel: WebSocketChannel) -> None:
        async def forward(text: str) -> None:
            await channel.send(text)
            seen.append(held(channel))

        Source(forward).read(*FRAMES)  # one read, 50 frames
        seen.append(held(channel))

    async with channel_to_client(burst) as ws:
        assert await received(ws, 50) == FRAMES
    assert seen[:50] == list(range(1, 51))  # every frame of the burst is held
    assert seen[50] == 0  # and all are written once the read is done


async def test_lone_frames_are_never_held() -> None:
    seen: list[int] = []

    async def lone(channel: WebSocketChannel) -> None:
        async def forward(text: str) -> None:
            await channel.send(text)
            seen.append(held(channel))

        source = Source(forward)
        for text in FRAMES[:5]:  # one read each
            source.read(text)

    async with channel_to_client(lone) as ws:
        assert await received(ws, 5) == FRAMES[:5]
    assert seen == [0] * 5


async def test_closing_lets_a_held_burst_go_first() -> None:
    closed = asyncio.Event()

    async def burst_then_close(channel: WebSocketChannel) -> None:
        async def forward(text: str) -> None:
            await channel.send(text)
            if text == FRAMES[2]:
                assert held(channel) == 3
                await channel.close(1012, "stopping")
                assert held(channel) == 0
                closed.set()

        Source(forward).read(*FRAMES[:3])
        async with asyncio.timeout(WAIT):
            await closed.wait()

    async with channel_to_client(burst_then_close) as ws:
        assert await received(ws, 3) == FRAMES[:3]
        async with asyncio.timeout(WAIT):
            closing = await ws.receive()
        assert closing.type is aiohttp.WSMsgType.CLOSE
        assert closing.data == 1012
