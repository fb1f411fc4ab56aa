"""One WebSocket client of the host: its bounded outbox and its one writer.

Frames for a client never make the host wait: they are queued in the client's own
outbox and its writer task sends them, in order. A client that reads slowly (or not at
all) therefore delays no other client, nor the agent's output, nor a router's probes;
when its outbox would pass :data:`OUTBOX_FRAMES` frames or ``2 * max_message_bytes``
characters it is closed with 1008 ("too slow") and handled like a client that left.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from aiohttp import WSCloseCode, web

from router.outbox import Outbox

logger = logging.getLogger(__name__)

#: frames one client's outbox holds at most (as a router's link to a backend)
OUTBOX_FRAMES = 4096
#: how long closing a client may take (its close frame, then its answer) before the
#: connection is just dropped
CLOSE_SECONDS = 2.0
TOO_SLOW = (WSCloseCode.POLICY_VIOLATION, "too slow: the client's outbox is full")


class WaitingOutbox:
    """A client's :class:`~router.outbox.Outbox` its writer waits on; once finished,
    :meth:`get` hands out what is left, then None."""

    def __init__(self, max_frames: int, max_chars: int) -> None:
        self._frames = Outbox(max_frames, max_chars)
        self._ready = asyncio.Event()
        self._finished = False

    def put(self, text: str) -> bool:
        """Queue ``text``; False (and nothing queued) when that would pass a bound."""
        if not self._frames.put(text):
            return False
        self._ready.set()
        return True

    def finish(self) -> None:
        """Take no more frames."""
        self._finished = True
        self._ready.set()

    async def get(self) -> str | None:
        """The oldest frame, waiting for one; None once finished and empty."""
        while (text := self._frames.take()) is None:
            if self._finished:
                return None
            self._ready.clear()
            await self._ready.wait()
        return text


class ClientLink:
    """A client's WebSocket, the outbox in front of it, and the task that writes it."""

    def __init__(self, ws: web.WebSocketResponse, *, max_message_bytes: int) -> None:
        self.ws = ws
        self._outbox = WaitingOutbox(OUTBOX_FRAMES, 2 * max_message_bytes)
        self._closing: tuple[int, str] | None = None
        #: set when the outbox overflowed: the writer is stopped, the client is dropped
        self.too_slow = False
        self.writer = asyncio.create_task(self._write(), name="host-client-writer")

    def offer(self, text: str) -> None:
        """Queue a frame for the client, never waiting. When it would overflow the
        outbox, the client is too slow: its writer stops (the caller of
        :meth:`ended` then closes it)."""
        if self.too_slow or self._closing is not None:
            return
        if not self._outbox.put(text):
            self.too_slow = True
            self.writer.cancel()

    def close_after_sending(self, code: int, reason: str) -> None:
        """Send what is queued, then close with ``code``."""
        if self._closing is None:
            self._closing = (code, reason)
            self._outbox.finish()

    async def close(self, code: int, reason: str) -> None:
        """Close now with ``code``, within :data:`CLOSE_SECONDS` (a client that does not
        read gets no close frame, only the end of the connection)."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(CLOSE_SECONDS):
                await self.ws.close(code=code, message=reason.encode(), drain=False)

    async def _write(self) -> None:
        while (text := await self._outbox.get()) is not None:
            try:
                await self.ws.send_str(text)
            except ConnectionError:  # the client is gone: its reader notices
                return
        if self._closing is not None:
            await self.close(*self._closing)
