"""One run of the hosted agent command: a subprocess speaking ACP over stdio
(newline-delimited JSON-RPC on stdin/stdout).

The agent runs in a session and process group of its own, so stopping it reaches what
it started too (a CLI agent often runs its model client or tools as children): its
stdin is closed and its group gets SIGTERM, then SIGKILL. Its stderr is passed on to
the host's as it comes, and its last lines are kept (:class:`~router.host.stderr.StderrTail`)
to tell clients why it refused a session or died.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
from asyncio.subprocess import PIPE, Process, SubprocessStreamProtocol
from collections.abc import AsyncIterator, Sequence

from router.host.stderr import StderrTail
from router.protocol.errors import ProtocolError
from router.protocol.jsonrpc import Message
from router.protocol.reading import parse

logger = logging.getLogger(__name__)

#: after its stdin closes and its group gets SIGTERM, how long the agent (and every
#: process holding its pipes) may take to go before its group gets SIGKILL
EXIT_GRACE_SECONDS = 3.0
#: after SIGKILL, how long before the host stops waiting for the pipes to close (only a
#: process that left the group, e.g. with setsid, can still hold them)
KILL_WAIT_SECONDS = 2.0


class _ExitWatch(SubprocessStreamProtocol):
    """The usual stream protocol, plus an event for the process's own exit.

    ``Process.wait()`` returns only once the pipes are closed as well, and a child the
    agent started holds them open for as long as it lives.
    """

    def __init__(self, limit: int, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(limit=limit, loop=loop)
        self.exited = asyncio.Event()

    def process_exited(self) -> None:
        super().process_exited()
        self.exited.set()


class _StderrPump:
    """The agent's stderr, read as it comes by a reader callback on the loop: every byte
    goes on to the host's stderr and into the tail."""

    def __init__(self, fd: int, tail: StderrTail) -> None:
        self._fd = fd
        self._tail = tail
        self._loop = asyncio.get_running_loop()
        self._open = True
        os.set_blocking(fd, False)
        self._loop.add_reader(fd, self.read_available)

    def read_available(self) -> None:
        """Read what the pipe holds now, without waiting (also called to catch up before
        the tail is looked at: the agent writes its reason before its answer)."""
        while self._open:
            try:
                chunk = os.read(self._fd, 1 << 16)
            except BlockingIOError:
                return
            except OSError:
                chunk = b""
            if not chunk:
                self.close()
                return
            with contextlib.suppress(OSError, ValueError):  # our own stderr is gone
                sys.stderr.buffer.write(chunk)
                sys.stderr.buffer.flush()
            self._tail.feed(chunk)

    def close(self) -> None:
        if self._open:
            self._open = False
            self._loop.remove_reader(self._fd)
            os.close(self._fd)
            self._tail.end()


class AgentProcess:
    """The agent subprocess: write lines in call order, read messages until it exits."""

    def __init__(self, process: Process, watch: _ExitWatch, stderr_fd: int) -> None:
        assert process.stdin is not None
        assert process.stdout is not None
        self.process = process
        self._watch = watch
        self._stdin = process.stdin
        self._stdout = process.stdout
        self._turn = asyncio.Lock()  # FIFO: lines leave in the order they were sent
        #: the last lines of its stderr
        self.stderr_tail = StderrTail()
        self._stderr = _StderrPump(stderr_fd, self.stderr_tail)

    @classmethod
    async def start(cls, command: Sequence[str], *, max_line_bytes: int) -> AgentProcess:
        """Spawn ``command`` in a new session; raises OSError when it cannot be run at all."""
        loop = asyncio.get_running_loop()
        read_end, write_end = os.pipe()
        try:
            transport, watch = await loop.subprocess_exec(
                lambda: _ExitWatch(max_line_bytes, loop),
                *command,
                stdin=PIPE,
                stdout=PIPE,
                stderr=write_end,
                start_new_session=True,
            )
        except BaseException:
            os.close(read_end)
            raise
        finally:
            os.close(write_end)
        agent = cls(Process(transport, watch, loop), watch, read_end)
        logger.info("agent process %d started: %s", agent.pid, " ".join(command))
        return agent

    @property
    def pid(self) -> int:
        return self.process.pid

    async def send(self, text: str) -> None:
        """Write one message as one line; a line for an agent that has exited is dropped
        (its requests are answered when the exit is noticed)."""
        async with self._turn:
            if self._stdin.is_closing():
                return
            self._stdin.write(text.encode() + b"\n")
            with contextlib.suppress(ConnectionError):
                await self._stdin.drain()

    async def messages(self) -> AsyncIterator[Message]:
        """Every JSON-RPC message the agent writes, until its stdout ends."""
        while True:
            try:
                line = await self._stdout.readline()
            except ValueError:  # longer than the limit: skip to the next line
                logger.warning("agent %d wrote a line over the size limit; dropped", self.pid)
                continue
            if not line:
                return
            if not line.strip():
                continue
            try:
                yield parse(line)
            except ProtocolError as exc:
                logger.warning("agent %d wrote a line that is not JSON-RPC (%s)", self.pid, exc)

    def catch_up_stderr(self) -> None:
        """Read what the agent has written to stderr so far, so the tail holds it."""
        self._stderr.read_available()

    async def exited(self) -> int | None:
        """Wait until the agent process itself exits (whoever still holds its pipes)."""
        await self._watch.exited.wait()
        return self.process.returncode

    async def stop(self) -> int | None:
        """Stop the agent and everything in its process group; its exit status.

        Closes its stdin and sends its group SIGTERM, then SIGKILL after
        :data:`EXIT_GRACE_SECONDS`, and waits until its pipes are closed too. Also used
        after the agent exited by itself, to stop what it left behind. None when the
        pipes stay open even after SIGKILL (held by a process outside the group).
        """
        if not self._stdin.is_closing():
            self._stdin.close()
        self._signal_group(signal.SIGTERM)
        status: int | None = None
        for wait, then in ((EXIT_GRACE_SECONDS, signal.SIGKILL), (KILL_WAIT_SECONDS, None)):
            try:
                async with asyncio.timeout(wait):
                    status = await self.process.wait()
                break
            except TimeoutError:
                if then is None:
                    logger.warning("agent process %d: its pipes are still open", self.pid)
                    status = self.process.returncode
                else:
                    self._signal_group(then)
        self._stderr.read_available()
        self._stderr.close()
        return status

    def _signal_group(self, signum: signal.Signals) -> None:
        """Signal the agent's process group (its id is the agent's pid: a new session)."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signum)
