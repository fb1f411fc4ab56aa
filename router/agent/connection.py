"""One client connection to the agent: frames in, one reply per request, requests out.

Requests are answered concurrently (a ``session/prompt`` lasts a whole turn, and the
``session/cancel`` or permission reply for it arrives meanwhile), each in a task of the
connection's task group. Notifications and responses are handled in order, each once
the requests read before it have begun (their tasks' first steps run first): a
``session/cancel`` right behind a ``session/prompt`` finds that prompt's turn running.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator
from typing import Any, Protocol

from router.agent.sessions import ConnectionId
from router.protocol import jsonrpc, reading
from router.protocol.errors import InternalError, JsonRpcError, ProtocolError
from router.protocol.jsonrpc import Notification, Request, Response

logger = logging.getLogger(__name__)

#: Requests from one client being answered at once; more are refused with -32603.
MAX_IN_FLIGHT = 64
#: Agent->client requests awaiting a reply on one connection.
MAX_AWAITED_REPLIES = 64


class FrameSink(Protocol):
    """Where text frames go (an aiohttp ``WebSocketResponse``)."""

    async def send_str(self, data: str) -> None: ...


class Handler(Protocol):
    """What answers the messages of a connection (the agent's methods)."""

    async def handle_request(self, connection: Connection, request: Request) -> Any: ...

    def handle_notification(self, connection: Connection, notification: Notification) -> None: ...


class Connection:
    def __init__(self, connection_id: ConnectionId, sink: FrameSink, handler: Handler) -> None:
        self.id = connection_id
        self._sink = sink
        self._handler = handler
        self._send_lock = asyncio.Lock()
        self._closed = False
        self._in_flight = 0
        self._next_request_id = 0
        self._awaited: dict[int, asyncio.Future[Response | None]] = {}

    async def send(self, text: str) -> None:
        """Send one frame, in call order; dropped once the connection is closed."""
        async with self._send_lock:
            if self._closed:
                logger.debug("connection %d: closed, dropping a frame", self.id)
                return
            try:
                await self._sink.send_str(text)
            except ConnectionError:
                self.close()

    async def notify(self, method: str, params: dict[str, Any]) -> None:
        await self.send(jsonrpc.encode_notification(method, params))

    @contextlib.contextmanager
    def expect_reply(self) -> Iterator[tuple[int, asyncio.Future[Response | None]]]:
        """A fresh request id (0, 1, ...) and the future its reply will resolve.

        The future resolves to None if the connection closes first. Send the request
        inside the ``with`` block; leaving it forgets the id.
        """
        if len(self._awaited) >= MAX_AWAITED_REPLIES:
            raise InternalError("too many requests to the client are awaiting a reply")
        request_id = self._next_request_id
        self._next_request_id += 1
        reply: asyncio.Future[Response | None] = asyncio.get_running_loop().create_future()
        if self._closed:
            reply.set_result(None)
        self._awaited[request_id] = reply
        try:
            yield request_id, reply
        finally:
            del self._awaited[request_id]

    async def receive(self, frame: str, tasks: asyncio.TaskGroup) -> None:
        """Handle one text frame; a request is answered in a new task of ``tasks``."""
        try:
            message = reading.parse(frame)
        except ProtocolError as exc:
            await self.send(jsonrpc.encode_protocol_error(exc))
            return
        if isinstance(message, Request):
            await self._start(message, tasks)
        else:  # after the first steps of the request tasks started so far (FIFO)
            asyncio.get_running_loop().call_soon(self._handle, message)

    def close(self) -> None:
        """Stop sending and give every awaited reply up (as None)."""
        self._closed = True
        for reply in self._awaited.values():
            if not reply.done():
                reply.set_result(None)

    async def _start(self, request: Request, tasks: asyncio.TaskGroup) -> None:
        if self._in_flight >= MAX_IN_FLIGHT:
            error = InternalError(
                f"too many requests in flight on this connection ({MAX_IN_FLIGHT})"
            )
            await self.send(jsonrpc.encode_error(request.id, error))
            return
        self._in_flight += 1
        tasks.create_task(self._answer(request))

    async def _answer(self, request: Request) -> None:
        try:
            result = await self._handler.handle_request(self, request)
            reply = jsonrpc.encode_result(request.id, result)
        except JsonRpcError as exc:
            reply = jsonrpc.encode_error(request.id, exc)
        except Exception:  # every request gets a reply, even after a bug
            logger.exception("connection %d: %s failed", self.id, request.method)
            reply = jsonrpc.encode_error(request.id, InternalError())
        finally:
            self._in_flight -= 1
        await self.send(reply)

    def _handle(self, message: Response | Notification) -> None:
        if isinstance(message, Response):
            self._resolve(message)
        else:
            self._notified(message)

    def _resolve(self, response: Response) -> None:
        reply = self._awaited.get(response.id) if isinstance(response.id, int) else None
        if reply is None or reply.done():
            logger.debug("connection %d: ignoring a reply to unknown id %r", self.id, response.id)
            return
        reply.set_result(response)

    def _notified(self, notification: Notification) -> None:
        try:
            self._handler.handle_notification(self, notification)
        except JsonRpcError as exc:
            logger.debug("connection %d: ignored %s: %s", self.id, notification.method, exc)
        except Exception:  # a notification has no reply to carry the error
            logger.exception("connection %d: %s failed", self.id, notification.method)
