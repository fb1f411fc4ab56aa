"""The WebSocket transport of the front door: one client connection per upgraded
``GET /acp``, one JSON-RPC message per text frame.

:class:`WebSocketChannel` is how a :class:`~router.server.client.ClientConnection`
writes to a WebSocket client; :func:`pump` feeds it the client's frames until the
socket closes. Binary frames are ignored and counted, as ACP's transport RFD says
("Binary frames are ignored").
"""

from __future__ import annotations

import contextlib

import aiohttp
from aiohttp import web

from router.server.client import ClientConnection
from router.server.metrics import Metrics


class WebSocketChannel:
    """A client connection's WebSocket.

    aiohttp writes a frame to the transport synchronously when called (compressed
    frames under its own lock), so frames leave in call order, and a full transport
    makes callers wait in ``drain``: ordering and backpressure without a writer task,
    which measured ~5 % faster at p50 than a queue and a writer (bench forwarding).
    """

    def __init__(self, ws: web.WebSocketResponse) -> None:
        self.ws = ws

    async def send(self, text: str) -> None:
        with contextlib.suppress(ConnectionResetError):  # the client is gone; its loop ends
            await self.ws.send_str(text)

    async def close(self, code: int, reason: str) -> None:
        await self.ws.close(code=code, message=reason.encode())


async def pump(ws: web.WebSocketResponse, connection: ClientConnection, metrics: Metrics) -> None:
    """Hand every text frame of ``ws`` to ``connection`` until the socket closes, then
    end the connection."""
    try:
        async for frame in ws:
            if frame.type is aiohttp.WSMsgType.TEXT:
                await connection.receive(frame.data)
            elif frame.type is aiohttp.WSMsgType.BINARY:
                metrics.client_frames_ignored.labels("binary").inc()
    finally:
        await connection.ended()
