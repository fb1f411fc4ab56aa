"""One run of the hosted agent command: a subprocess speaking ACP over stdio
(newline-delimited JSON-RPC on stdin/stdout; its stderr goes to ours).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Sequence

from router.protocol.errors import ProtocolError
from router.protocol.jsonrpc import Message, parse

logger = logging.getLogger(__name__)

#: after stdin closes, how long the agent may take to exit before SIGTERM, then SIGKILL
EXIT_GRACE_SECONDS = 2.0


class AgentProcess:
    """The agent subprocess: write lines in call order, read messages until it exits."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        assert process.stdin is not None
        assert process.stdout is not None
        self.process = process
        self._stdin = process.stdin
        self._stdout = process.stdout
        self._turn = asyncio.Lock()  # FIFO: lines leave in the order they were sent

    @classmethod
    async def start(cls, command: Sequence[str], *, max_line_bytes: int) -> AgentProcess:
        """Spawn ``command``; raises OSError when it cannot be run at all."""
        process = await asyncio.create_subprocess_exec(
            *command,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            limit=max_line_bytes,
        )
        logger.info("agent process %d started: %s", process.pid, " ".join(command))
        return cls(process)

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

    async def wait(self) -> int:
        return await self.process.wait()

    async def stop(self) -> int:
        """Close stdin and wait; then SIGTERM; then SIGKILL. The exit status."""
        if self.process.returncode is not None:
            return self.process.returncode
        self._stdin.close()
        for escalate in (self.process.terminate, self.process.kill):
            try:
                async with asyncio.timeout(EXIT_GRACE_SECONDS):
                    return await self.process.wait()
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    escalate()
        return await self.process.wait()
