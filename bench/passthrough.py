"""The bare forwarder the router is held against: ``python -m bench.passthrough URL``.

An aiohttp WebSocket server that, for each client, opens one WebSocket to ``URL``
and copies text frames both ways as they are: no parsing, no ids, no metrics, no
routing. It is the least a Python aiohttp hop can cost, so "the router's added
latency over this one's" is the price of everything the router does on top.
Prints ``passthrough listening on ws://...`` once it listens; serves until SIGTERM.
"""

from __future__ import annotations

import asyncio
import signal
import sys

import aiohttp
from aiohttp import web

READY = "passthrough listening on "
TARGET = web.AppKey("target", str)
HTTP = web.AppKey("http", aiohttp.ClientSession)


async def _pump(
    source: aiohttp.ClientWebSocketResponse | web.WebSocketResponse,
    sink: aiohttp.ClientWebSocketResponse | web.WebSocketResponse,
) -> None:
    async for frame in source:
        if frame.type is aiohttp.WSMsgType.TEXT:
            await sink.send_str(frame.data)
    await sink.close()


async def _forward(request: web.Request) -> web.WebSocketResponse:
    client = web.WebSocketResponse(max_msg_size=0)
    await client.prepare(request)
    async with request.app[HTTP].ws_connect(request.app[TARGET], max_msg_size=0) as backend:
        upstream = asyncio.create_task(_pump(backend, client))
        try:
            await _pump(client, backend)
        finally:
            upstream.cancel()
            await asyncio.gather(upstream, return_exceptions=True)
    return client


async def serve(target: str) -> None:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
        app = web.Application()
        app[TARGET], app[HTTP] = target, http
        app.router.add_get("/acp", _forward)
        runner = web.AppRunner(app, handle_signals=False, access_log=None)
        await runner.setup()
        try:
            await web.TCPSite(runner, "127.0.0.1", 0).start()
            print(f"{READY}ws://127.0.0.1:{runner.addresses[0][1]}/acp", flush=True)
            stop = asyncio.Event()
            asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
            await stop.wait()
        finally:
            await runner.cleanup()


if __name__ == "__main__":
    asyncio.run(serve(sys.argv[1]))
