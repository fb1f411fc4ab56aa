"""Many light ACP backends in one process: ``python -m bench.scripted --count N``.

One aiohttp application listens on ``N`` loopback ports; the port a connection came
in on is the backend it talks to (``b0`` ... ``b{N-1}``). It answers just what a
locate needs, as cheaply as it can, so the router's cost is what is measured:

* ``initialize``: protocol 1, ``sessionCapabilities`` with ``status`` and ``resume``;
* ``session/status``: ``active`` when the session belongs here, else ``-32002``;
* ``session/resume``: ``{}`` when the session belongs here, else ``-32002``;
* ``session/prompt``: ``{"stopReason": "end_turn"}`` at once (the hop bench's
  zero-work backend; the workers bench pipelines prompts through a router), after
  ``params._meta.updates`` ``session/update`` notifications when the prompt asks for
  them, written as fast as the socket takes them;
* anything else with an id: ``-32601``.

A session belongs to the backend its id names: ``b7-anything`` lives on ``b7``, so
sessions need no creating and the router has no hint for them. Once every port
listens, the process writes the URLs to ``--urls`` (one a line) and prints one line,
``scripted backends listening: N``; it serves until SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from aiohttp import web

READY = "scripted backends listening: "
NOT_FOUND = -32002
METHOD_NOT_FOUND = -32601
INITIALIZE_RESULT = {
    "protocolVersion": 1,
    "agentCapabilities": {"sessionCapabilities": {"status": {}, "resume": {}}},
    "authMethods": [],
}
PORT = web.AppKey("port_to_backend", dict[int, str])
#: what a prompt's streamed ``session/update`` notifications say (each one ~250 B)
CHUNK = "A line of an agent's answer, streamed back to the client one chunk at a time."


def backend_id(index: int) -> str:
    return f"b{index}"


def owner(session_id: str) -> str:
    """The backend a session lives on: the part of its id before the first ``-``."""
    return session_id.partition("-")[0]


def answer(backend: str, message: dict[str, Any]) -> str | None:
    """The reply to one request, or None for a notification."""
    if "id" not in message:
        return None
    method = message.get("method")
    params = message.get("params") or {}
    result: Any = None
    error: dict[str, Any] | None = None
    if method == "initialize":
        result = INITIALIZE_RESULT
    elif method == "session/prompt":
        result = {"stopReason": "end_turn"}
    elif method in ("session/status", "session/resume"):
        session_id = params.get("sessionId", "")
        if owner(session_id) != backend:
            data = {"sessionId": session_id}
            error = {"code": NOT_FOUND, "message": "unknown session", "data": data}
        elif method == "session/status":
            result = {"status": "active"}
        else:
            result = {}
    else:
        error = {"code": METHOD_NOT_FOUND, "message": f"method not found: {method}"}
    reply: dict[str, Any] = {"jsonrpc": "2.0", "id": message["id"]}
    if error is None:
        reply["result"] = result
    else:
        reply["error"] = error
    return orjson.dumps(reply).decode()


async def _serve(request: web.Request) -> web.WebSocketResponse:
    sockname = request.transport.get_extra_info("sockname") if request.transport else None
    backend = request.app[PORT][sockname[1]] if sockname else "b?"
    ws = web.WebSocketResponse(max_msg_size=0)
    await ws.prepare(request)
    async for frame in ws:
        if frame.type is aiohttp.WSMsgType.TEXT:
            message = orjson.loads(frame.data)
            await _stream(ws, message)
            reply = answer(backend, message)
            if reply is not None:
                await ws.send_str(reply)
    return ws


def updates_asked(message: dict[str, Any]) -> int:
    """How many ``session/update`` notifications a prompt asks to be streamed first."""
    if message.get("method") != "session/prompt":
        return 0
    meta = (message.get("params") or {}).get("_meta") or {}
    count = meta.get("updates", 0)
    return count if isinstance(count, int) else 0


def update(session_id: str) -> str:
    """One ``session/update`` notification (an agent message chunk) of ``session_id``."""
    content = {"type": "text", "text": CHUNK}
    chunk = {"sessionUpdate": "agent_message_chunk", "content": content}
    params = {"sessionId": session_id, "update": chunk}
    return orjson.dumps({"jsonrpc": "2.0", "method": "session/update", "params": params}).decode()


async def _stream(ws: web.WebSocketResponse, message: dict[str, Any]) -> None:
    count = updates_asked(message)
    if count:
        text = update(message["params"].get("sessionId", ""))
        for _ in range(count):
            await ws.send_str(text)


async def serve(count: int, urls: Path) -> None:
    app = web.Application()
    app[PORT] = {}
    app.router.add_get("/acp", _serve)
    runner = web.AppRunner(app, handle_signals=False, access_log=None)
    await runner.setup()
    try:
        lines = []
        for index in range(count):
            site = web.TCPSite(runner, "127.0.0.1", 0, backlog=4096)
            await site.start()
            port = runner.addresses[-1][1]
            app[PORT][port] = backend_id(index)
            lines.append(f"ws://127.0.0.1:{port}/acp")
        _write(urls, lines)
        print(f"{READY}{count}", flush=True)
        await _until_signalled()
    finally:
        await runner.cleanup()


def _write(path: Path, lines: list[str]) -> None:
    path.write_text("\n".join(lines) + "\n")


async def _until_signalled() -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    await stop.wait()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.scripted", description=__doc__)
    parser.add_argument("--count", type=int, required=True, help="backends (ports) to serve")
    parser.add_argument("--urls", type=Path, required=True, help="write the URLs here")
    args = parser.parse_args(argv)
    asyncio.run(serve(args.count, args.urls))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
