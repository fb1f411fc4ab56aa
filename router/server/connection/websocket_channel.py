"""A client connection's WebSocket (:class:`WebSocketChannel`): the
:class:`~router.server.connection.client.ClientChannel` its connection writes through, and the
:class:`~router.server.links.sansio_websocket.Receiver` that feeds the connection its frames
(docs/architecture.md, "The effects channel").
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from router.protocol.jsonrpc import Message, RequestId
from router.server.connection.client import ClientConnection
from router.server.links import waiting
from router.server.links.sansio_websocket import INTERNAL_ERROR
from router.server.links.websocket import WebSocket
from router.server.observability.metrics import Metrics

logger = logging.getLogger(__name__)


class WebSocketChannel:
    """A client connection's WebSocket: how the connection writes
    (:class:`~router.server.connection.client.ClientChannel`), and where its frames go (the
    :class:`~router.server.links.sansio_websocket.Receiver` of its :class:`WebSocket`).

    A frame is handed to the WebSocket when sent, so frames leave in call order (a burst
    goes out in one write when the loop turns: :meth:`WebSocket.send`), and a full
    transport makes the sender wait (:func:`~router.server.links.waiting.drained`).
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
            await waiting.drained(ws)

    async def close(self, code: int, reason: str) -> None:
        """Close with ``code`` (after the frames sent before) and wait for the closing
        handshake (bounded)."""
        if self.ws is not None:
            self.ws.close(code, reason)
            await waiting.close_frame(self.ws)

    # -- Receiver ------------------------------------------------------------------------------

    def received_text(self, text: str) -> Coroutine[Any, Any, None] | None:
        assert self.connection is not None
        return self.connection.received(text)

    def received_binary(self) -> None:
        self._metrics.client_frames_ignored.labels("binary").inc()

    def handling_failed(self, exc: Exception) -> None:
        """The one boundary of a client connection: log it, close 1011."""
        logger.error("client connection failed", exc_info=exc)
        if self.ws is not None:
            self.ws.close(INTERNAL_ERROR)

    def writable(self) -> None:
        pass  # a sender waits in waiting.drained

    def closed(self) -> None:
        self._ended(self)
