"""A minimal ACP client for benchmarks: one aiohttp WebSocket, one reader (the caller).

No reader task and no futures: a call sends its frame and reads until its response
comes back, skipping notifications, so the client adds as little as it can to what
is measured. The same client talks to an agent directly and to the router.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import orjson

#: Bound on any single wait for a frame.
WAIT = 15.0

JsonObject = dict[str, Any]


class BenchError(RuntimeError):
    """A benchmark could not run as intended (an error reply, a dead process)."""


class AcpSocket:
    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws
        self._ids = itertools.count(1)

    @classmethod
    @contextlib.asynccontextmanager
    async def connect(
        cls, http: aiohttp.ClientSession, url: str, *, compress: int = 0
    ) -> AsyncIterator[AcpSocket]:
        """An initialized connection to ``url``; ``compress``: permessage-deflate window
        bits to offer (0: none)."""
        async with http.ws_connect(url, max_msg_size=0, compress=compress) as ws:
            socket = cls(ws)
            await socket.call("initialize", {"protocolVersion": 1, "clientCapabilities": {}})
            yield socket

    async def send(self, method: str, params: JsonObject) -> int:
        """Send a request without waiting; its id."""
        request_id = next(self._ids)
        frame = {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}
        await self.ws.send_str(orjson.dumps(frame).decode())
        return request_id

    async def response(self) -> JsonObject:
        """The next response (notifications are skipped); an error reply raises."""
        while True:
            message = await self.receive()
            if "method" not in message:
                if "error" in message:
                    raise BenchError(f"error reply: {message['error']}")
                return message

    async def call(self, method: str, params: JsonObject) -> Any:
        """One request, answered in order (nothing else may be in flight); its result."""
        request_id = await self.send(method, params)
        reply = await self.response()
        if reply.get("id") != request_id:
            raise BenchError(f"expected the reply to {request_id}, got {reply}")
        return reply["result"]

    async def outcome(self, method: str, params: JsonObject) -> tuple[str, str]:
        """One request's outcome, ``ok`` or the error code, and the error's message
        (notifications are skipped; nothing else may be in flight)."""
        request_id = await self.send(method, params)
        while True:
            message = await self.receive()
            if message.get("id") == request_id and "method" not in message:
                error = message.get("error")
                if error is None:
                    return "ok", ""
                return str(error.get("code")), str(error.get("message"))

    async def new_session(self) -> str:
        result = await self.call("session/new", {"cwd": "/bench", "mcpServers": []})
        session_id: str = result["sessionId"]
        return session_id

    async def receive(self) -> JsonObject:
        """The next message, whatever it is."""
        frame = await self.ws.receive(timeout=WAIT)
        if frame.type is not aiohttp.WSMsgType.TEXT:
            raise BenchError(f"connection ended: {frame.type.name} {frame.data!r}")
        message: JsonObject = orjson.loads(frame.data)
        return message


def prompt_params(session_id: str, text: str) -> JsonObject:
    return {"sessionId": session_id, "prompt": [{"type": "text", "text": text}]}


def resume_params(session_id: str) -> JsonObject:
    return {"sessionId": session_id, "cwd": "/bench", "mcpServers": []}
