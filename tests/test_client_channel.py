"""The client WebSocket's writer (:class:`router.server.websocket.WebSocketChannel`), on a
real server (the router's own WebSocket on an asyncio server, after websockets' server
handshake) and an aiohttp client over loopback: a burst of frames written before the
event loop turns is held until it turns (then written at once), a lone frame never is,
and every frame arrives whole and in order either way.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import aiohttp
from websockets.server import ServerProtocol

from router.server.metrics import Metrics
from router.server.websocket import WebSocket, WebSocketChannel
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


async def test_a_burst_is_held_until_the_loop_turns_and_arrives_in_order() -> None:
    seen: list[int] = []

    async def burst(channel: WebSocketChannel) -> None:
        for n in range(50):
            await channel.send(f'{{"n":{n}}}')  # no wait in between: one turn of the loop
            seen.append(held(channel))
        await asyncio.sleep(0)  # the loop turns: the burst is let go
        await asyncio.sleep(0)
        seen.append(held(channel))

    async with channel_to_client(burst) as ws:
        assert await received(ws, 50) == [f'{{"n":{n}}}' for n in range(50)]
    assert seen[0] == 0  # the first frame of a turn is never held
    assert seen[1:50] == list(range(1, 50))  # the rest of the burst is
    assert seen[50] == 0  # and let go once the loop has turned


async def test_lone_frames_are_never_held() -> None:
    seen: list[int] = []

    async def lone(channel: WebSocketChannel) -> None:
        for n in range(5):
            await channel.send(f'{{"n":{n}}}')
            seen.append(held(channel))
            await asyncio.sleep(0)  # the loop turns between frames
            await asyncio.sleep(0)

    async with channel_to_client(lone) as ws:
        assert await received(ws, 5) == [f'{{"n":{n}}}' for n in range(5)]
    assert seen == [0] * 5


async def test_closing_lets_a_held_burst_go_first() -> None:
    async def burst_then_close(channel: WebSocketChannel) -> None:
        for n in range(3):
            await channel.send(f'{{"n":{n}}}')
        assert held(channel) == 2
        await channel.close(1012, "stopping")
        assert held(channel) == 0

    async with channel_to_client(burst_then_close) as ws:
        assert await received(ws, 3) == ['{"n":0}', '{"n":1}', '{"n":2}']
        async with asyncio.timeout(WAIT):
            closing = await ws.receive()
        assert closing.type is aiohttp.WSMsgType.CLOSE
        assert closing.data == 1012
