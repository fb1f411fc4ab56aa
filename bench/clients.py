"""Many client connections at once, for the memory and storm benches.

A :class:`Crowd` opens connections concurrently (``initialize``, then one
``session/resume`` each, so every connection through a router also holds its
backend link), keeps a reader on each (aiohttp answers pings only while someone
reads, and the router closes a connection that stops answering them), and closes
them all together.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import aiohttp

from bench.wire import AcpSocket, resume_params

#: connections opened (or closed) at once
BATCH = 250
#: permessage-deflate window bits a client offers when it wants compression
DEFLATE = 15


@dataclass(slots=True)
class Crowd:
    http: aiohttp.ClientSession
    compress: bool = False
    sockets: list[aiohttp.ClientWebSocketResponse] = field(default_factory=list)
    readers: set[asyncio.Task[None]] = field(default_factory=set)

    async def join(self, url: str, session_id: str) -> None:
        """One more connection: open, initialize, resume ``session_id``, then idle."""
        ws = await self.http.ws_connect(
            url, max_msg_size=0, compress=DEFLATE if self.compress else 0
        )
        self.sockets.append(ws)
        socket = AcpSocket(ws)
        await socket.call("initialize", {"protocolVersion": 1, "clientCapabilities": {}})
        await socket.call("session/resume", resume_params(session_id))
        reader = asyncio.create_task(_idle(ws))
        self.readers.add(reader)
        reader.add_done_callback(self.readers.discard)

    async def grow(self, count: int, url: str, session_for: Callable[[int], str]) -> None:
        """``count`` more connections, ``BATCH`` at a time."""
        start = len(self.sockets)
        for first in range(start, start + count, BATCH):
            last = min(first + BATCH, start + count)
            async with asyncio.TaskGroup() as group:
                for n in range(first, last):
                    group.create_task(self.join(url, session_for(n)))

    async def close(self) -> None:
        for reader in list(self.readers):
            reader.cancel()
        await asyncio.gather(*self.readers, return_exceptions=True)
        for first in range(0, len(self.sockets), BATCH):
            await asyncio.gather(
                *(ws.close() for ws in self.sockets[first : first + BATCH]),
                return_exceptions=True,
            )
        self.sockets.clear()


async def _idle(ws: aiohttp.ClientWebSocketResponse) -> None:
    """Read (and so answer pings) until the connection ends."""
    async for _ in ws:
        pass


async def storm(http: aiohttp.ClientSession, targets: Sequence[tuple[str, str]]) -> float:
    """Seconds until every ``(url, session)`` client has connected and been answered,
    all started at once; the connections close afterwards (untimed)."""
    crowd = Crowd(http)
    started = time.perf_counter()
    try:
        async with asyncio.TaskGroup() as group:
            for url, session in targets:
                group.create_task(crowd.join(url, session))
        return time.perf_counter() - started
    finally:
        await crowd.close()
