"""Server-sent event streams, the way a Streamable HTTP connection's frames reach its
client (:mod:`router.server.door.streamable_http`): one frame as one event, and one open
``GET`` whose writes have a deadline and whose idle stretches get a keepalive comment
(docs/architecture.md, "Every rule and its file").
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re

from aiohttp import web

logger = logging.getLogger(__name__)

KEEPALIVE = b": keepalive\n\n"
_LINE_BREAK = re.compile(r"\r\n|\r|\n")


def event(text: str) -> bytes:
    """One frame as a server-sent event. JSON text has line breaks only as whitespace
    between tokens; each line becomes a ``data:`` line, which the client joins back."""
    if "\n" not in text and "\r" not in text:
        return f"data: {text}\n\n".encode()
    return "".join(f"data: {line}\n" for line in _LINE_BREAK.split(text)).encode() + b"\n"


class EventStream:
    """One open ``GET``: a server-sent event stream to the client.

    A write that the client does not take within ``write_timeout`` seconds (it keeps the
    connection open and reads nothing) ends the stream and drops its connection, as a
    WebSocket client that stops answering pings is dropped: the frames for it never
    wait longer than that.
    """

    def __init__(
        self, request: web.Request, response: web.StreamResponse, write_timeout: float
    ) -> None:
        self.response = response
        self._transport = request.transport
        self._write_timeout = write_timeout
        #: set when the stream ends: displaced, its connection ended, or a write failed
        self.ended = asyncio.Event()
        self._written_at = asyncio.get_running_loop().time()

    async def write(self, data: bytes) -> bool:
        """Write ``data``; False (and the stream ends) when the client is gone, or does
        not read."""
        if self.ended.is_set():
            return False
        try:
            async with asyncio.timeout(self._write_timeout):
                await self.response.write(data)
        except ConnectionError:  # aiohttp's ClientConnectionResetError is one
            self.ended.set()
            return False
        except TimeoutError:
            self.ended.set()
            drop_unread(self._transport)
            return False
        self._written_at = asyncio.get_running_loop().time()
        return True

    async def keep_alive(self, interval: float) -> None:
        """Until the stream ends, write a keepalive comment whenever nothing else was
        written for ``interval`` seconds."""
        loop = asyncio.get_running_loop()
        while not self.ended.is_set():
            remaining = self._written_at + interval - loop.time()
            if remaining <= 0:
                await self.write(KEEPALIVE)
                continue
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(remaining):
                    await self.ended.wait()


def drop_unread(transport: asyncio.Transport | None) -> None:
    """End an event stream whose client keeps its connection open and reads nothing."""
    logger.warning("Streamable HTTP event stream dropped: the client does not read it")
    if transport is not None:
        transport.abort()
