"""The editor's side of ``acp-router connect`` (:mod:`router.commands.connect`): its
stdin read as lines by a thread, held while there is no router connection, and frames
written to its stdout as lines (ACP's stdio transport: newline-delimited JSON-RPC).
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import os
import select
import stat
import sys
import threading
from collections.abc import Iterator

import orjson

from router.protocol.errors import AcpRouterError

#: editor lines held while there is no connection
MAX_HELD = 1024


class EditorGone(AcpRouterError):
    """The editor closed the bridge's stdout."""


class StdinLines:
    """Lines of stdin, read by a daemon thread with ``os.read`` on fd 0: works for pipes,
    files, terminals and /dev/null alike (epoll takes only some of them), and never
    holds up the exit (it takes no lock the interpreter wants at shutdown, as
    ``sys.stdin.buffer`` would). The small queue makes the thread wait when the router
    is slower than the editor."""

    def __init__(self) -> None:
        self._lines: asyncio.Queue[bytes] = asyncio.Queue(maxsize=64)
        loop = asyncio.get_running_loop()
        threading.Thread(target=self._read, args=(loop,), name="stdin", daemon=True).start()

    def _read(self, loop: asyncio.AbstractEventLoop) -> None:
        try:
            for line in _lines_of(sys.stdin.fileno()):
                self._put(line, loop)
            self._put(b"", loop)
        except (RuntimeError, concurrent.futures.CancelledError):
            pass  # the loop is gone: the bridge is exiting

    def _put(self, line: bytes, loop: asyncio.AbstractEventLoop) -> None:
        """Queue ``line`` on the loop's side, waiting while the queue is full."""
        put = self._lines.put(line)
        try:
            asyncio.run_coroutine_threadsafe(put, loop).result()
        except RuntimeError:  # the loop closed first: the coroutine never ran
            put.close()
            raise

    async def readline(self) -> bytes:
        """The next line, or b"" at the end of stdin."""
        return await self._lines.get()


def _lines_of(fd: int) -> Iterator[bytes]:
    """The lines read from ``fd`` (the last one perhaps without its newline), until its
    end or an error."""
    pending = bytearray()
    while True:
        try:
            chunk = os.read(fd, 1 << 16)
        except BlockingIOError:  # a descriptor someone made non-blocking
            select.select([fd], [], [])
            continue
        except OSError:
            chunk = b""
        if not chunk:
            break
        searched = len(pending)
        pending += chunk
        start = 0
        while (end := pending.find(b"\n", max(start, searched))) >= 0:
            yield bytes(pending[start : end + 1])
            start = end + 1
        del pending[:start]
    if pending:
        yield bytes(pending)


async def open_stdout() -> asyncio.StreamWriter | None:
    """A non-blocking writer when stdout is a pipe or a socket (editors spawn agents with
    either; a slow editor then holds the bridge back without blocking it); None for a
    file or a terminal, which take plain writes."""
    loop = asyncio.get_running_loop()
    mode = os.fstat(sys.stdout.fileno()).st_mode
    if not (stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)):
        return None
    transport, protocol = await loop.connect_write_pipe(
        asyncio.streams.FlowControlMixin, sys.stdout
    )
    return asyncio.StreamWriter(transport, protocol, None, loop)


class EditorPipes:
    """The editor's stdin and stdout: its lines, those read while there was no connection
    first (:meth:`hold`), and frames written to it as lines."""

    def __init__(self, stdin: StdinLines, stdout: asyncio.StreamWriter | None) -> None:
        self._stdin = stdin
        self._stdout = stdout
        #: editor lines read while there was no connection, to send once there is
        self.held: collections.deque[bytes] = collections.deque()
        #: stdin has ended (what was held may still be sent)
        self.ended = False

    async def next_line(self) -> bytes:
        """The next line to send: a held one, else the next from stdin; b"" once stdin
        has ended and nothing is held."""
        if self.held:
            return self.held.popleft()
        # stdin may have ended while the first connection was being made
        line = b"" if self.ended else await self._stdin.readline()
        if not line:
            self.ended = True
        return line

    async def hold(self) -> None:
        """Read the editor's lines while there is no connection, to send them once there
        is one; returns when stdin ends."""
        while True:
            if len(self.held) >= MAX_HELD:  # stdin waits until the replay is done
                await asyncio.get_running_loop().create_future()
            line = await self._stdin.readline()
            if not line:
                self.ended = True
                return
            self.held.append(line)

    async def write(self, frame: str) -> None:
        """Write ``frame`` as one line.

        Raises:
            EditorGone: stdout was closed.
        """
        line = _one_line(frame).encode() + b"\n"
        try:
            if self._stdout is None:
                sys.stdout.buffer.write(line)
                sys.stdout.buffer.flush()
            else:
                self._stdout.write(line)
                await self._stdout.drain()
        except (BrokenPipeError, ConnectionResetError):
            raise EditorGone() from None


def _one_line(frame: str) -> str:
    if "\n" not in frame and "\r" not in frame:
        return frame
    try:
        return orjson.dumps(orjson.loads(frame)).decode()
    except orjson.JSONDecodeError:
        return frame.replace("\r", " ").replace("\n", " ")
