"""``acp-router connect URL``: a stdio <-> WebSocket bridge.

Editors launch ACP agents as subprocesses and speak newline-delimited JSON-RPC on
their stdin/stdout (ACP's stdio transport). Launching ``acp-router connect
ws://router:8765/acp`` as the "agent" puts the whole fleet behind that editor: every
line read on stdin goes out as one text frame, every text frame received is written
as one line. Frames are passed as they are, except that a frame holding a raw
newline (legal JSON whitespace, illegal in NDJSON) is re-encoded on one line.

Exit status: 0 when stdin ends or the far side closes normally, 1 when the
connection is lost.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import stat
import sys
import threading

import orjson
import websockets
from websockets.asyncio.client import ClientConnection

from router.commands.bearer import auth_headers
from router.protocol.errors import AcpRouterError, ProtocolError
from router.protocol.jsonrpc import Request, RequestId, Response, parse

logger = logging.getLogger(__name__)

#: after stdin ends, how long answers still owed may take before the bridge closes
DRAIN_SECONDS = 60.0


async def run_bridge(url: str) -> int:
    try:
        ws = await websockets.connect(
            url, max_size=None, compression=None, additional_headers=auth_headers()
        )
    except (OSError, websockets.InvalidURI, websockets.InvalidHandshake) as exc:
        raise AcpRouterError(f"cannot connect to {url}: {exc}") from None
    async with ws:
        return await Bridge(ws, StdinLines(), await _stdout()).run()


class StdinLines:
    """Lines of stdin, read by a daemon thread: works for pipes, files, terminals and
    /dev/null alike (epoll takes only some of them), and never holds up the exit. The
    small queue makes the thread wait when the router is slower than the editor."""

    def __init__(self) -> None:
        self._lines: asyncio.Queue[bytes] = asyncio.Queue(maxsize=64)
        loop = asyncio.get_running_loop()
        threading.Thread(target=self._read, args=(loop,), name="stdin", daemon=True).start()

    def _read(self, loop: asyncio.AbstractEventLoop) -> None:
        try:
            for line in iter(sys.stdin.buffer.readline, b""):
                asyncio.run_coroutine_threadsafe(self._lines.put(line), loop).result()
            asyncio.run_coroutine_threadsafe(self._lines.put(b""), loop).result()
        except (RuntimeError, concurrent.futures.CancelledError):
            pass  # the loop is gone: the bridge is exiting

    async def readline(self) -> bytes:
        """The next line, or b"" at the end of stdin."""
        return await self._lines.get()


async def _stdout() -> asyncio.StreamWriter | None:
    """A non-blocking writer when stdout is a pipe (backpressure from a slow editor);
    None for a file or a terminal, which take plain writes."""
    loop = asyncio.get_running_loop()
    if not stat.S_ISFIFO(os.fstat(sys.stdout.fileno()).st_mode):
        return None
    transport, protocol = await loop.connect_write_pipe(
        asyncio.streams.FlowControlMixin, sys.stdout
    )
    return asyncio.StreamWriter(transport, protocol, None, loop)


class Bridge:
    """Pumps lines one way and frames the other, minding which requests await answers:
    when stdin ends, answers still owed are let through before the socket closes, so
    ``printf '...' | acp-router connect URL`` prints every reply."""

    def __init__(
        self, ws: ClientConnection, stdin: StdinLines, stdout: asyncio.StreamWriter | None
    ) -> None:
        self._ws = ws
        self._stdin = stdin
        self._stdout = stdout
        self._owed: set[RequestId] = set()
        self._settled = asyncio.Event()
        self._settled.set()

    async def run(self) -> int:
        upstream = asyncio.create_task(self._upstream(), name="stdin-to-ws")
        downstream = asyncio.create_task(self._downstream(), name="ws-to-stdout")
        try:
            await asyncio.wait({upstream, downstream}, return_when=asyncio.FIRST_COMPLETED)
            if upstream.done() and not downstream.done():
                await self._let_answers_through(downstream)
        finally:
            for task in (upstream, downstream):
                task.cancel()
            await asyncio.gather(upstream, downstream, return_exceptions=True)
        if not downstream.done() or downstream.cancelled() or self._ws.close_code is None:
            await self._ws.close()  # we are done: stdin ended
            return 0
        clean = self._ws.close_code in (1000, 1001)
        if not clean:
            logger.error("connection lost: %s %s", self._ws.close_code, self._ws.close_reason)
        return 0 if clean else 1

    async def _let_answers_through(self, downstream: asyncio.Task[None]) -> None:
        settled = asyncio.create_task(self._settled.wait())
        try:
            await asyncio.wait(
                {settled, downstream}, timeout=DRAIN_SECONDS, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            settled.cancel()

    async def _upstream(self) -> None:
        while line := await self._stdin.readline():
            text = line.decode().strip()
            if text:
                self._note(text, sent=True)
                await self._ws.send(text)

    async def _downstream(self) -> None:
        try:
            async for frame in self._ws:
                if isinstance(frame, str):  # binary frames are not ACP
                    self._note(frame, sent=False)
                    await self._write(_one_line(frame).encode() + b"\n")
        except websockets.ConnectionClosedError:
            pass

    def _note(self, text: str, *, sent: bool) -> None:
        try:
            message = parse(text)
        except ProtocolError:
            return
        if sent and isinstance(message, Request):
            self._owed.add(message.id)
            self._settled.clear()
        elif not sent and isinstance(message, Response) and message.id in self._owed:
            self._owed.discard(message.id)
            if not self._owed:
                self._settled.set()

    async def _write(self, line: bytes) -> None:
        if self._stdout is None:
            sys.stdout.buffer.write(line)
            sys.stdout.buffer.flush()
        else:
            self._stdout.write(line)
            await self._stdout.drain()


def _one_line(frame: str) -> str:
    if "\n" not in frame and "\r" not in frame:
        return frame
    try:
        return orjson.dumps(orjson.loads(frame)).decode()
    except orjson.JSONDecodeError:
        return frame.replace("\r", " ").replace("\n", " ")
