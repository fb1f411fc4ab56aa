"""Waiting on a router WebSocket (:class:`~router.server.links.sansio_websocket.SansIoWebSocket`):
for its send buffer to drain, its opening handshake to end, its peer's close frame, or its
connection to be gone.

Each waits on the socket's own wake-ups (:meth:`SansIoWebSocket.waiter`), never polling,
and ends when the connection does. They are kept apart from the class, which defines no
coroutine, so that the class compiles on every Python (docs/architecture.md, "Compiled
modules").
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from websockets.protocol import CONNECTING

if TYPE_CHECKING:
    from router.server.links.sansio_websocket import SansIoWebSocket


async def drained(ws: SansIoWebSocket) -> None:
    """Wait while ``ws``'s transport buffer is full (until it drains or the connection
    ends)."""
    while ws.paused and not ws.lost:
        await ws.waiter()


async def opened(ws: SansIoWebSocket) -> None:
    """Wait for the end of ``ws``'s opening handshake (a link's: the server's answer), or
    of its connection."""
    while ws.frames.state is CONNECTING and not ws.lost:
        await ws.waiter()


async def closed(ws: SansIoWebSocket) -> None:
    """Wait until ``ws``'s TCP connection is gone."""
    while not ws.lost:
        await ws.waiter()


async def close_frame(ws: SansIoWebSocket) -> None:
    """Wait until the peer's close frame has come (the closing handshake is done, on the
    router's side), or the connection is gone."""
    while ws.frames.close_rcvd is None and not ws.lost:
        await ws.waiter()
