"""A TCP relay for fault tests: it passes bytes between a client and a target, and on
command cuts every connection (or one), holds new ones silent (accepted, never
answered) or refuses them (nothing listens), with or without cutting the ones it has:
what an L4 proxy in front of a live agent does; or stops passing bytes to the target
for a while (:meth:`Relay.hold`), as a backend that reads slowly does. Real sockets on
127.0.0.1; nothing sleeps.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
from collections.abc import AsyncIterator


class Mode(enum.Enum):
    PASS = "pass"
    STALL = "stall"  # accept, then never send a byte either way


class Relay:
    """Listens on ``port`` (fixed once chosen, so it can stop and listen again)."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = 0
        self.mode = Mode.PASS
        #: connections accepted while stalling, counted for tests to wait on
        self.stalled = 0
        self._changed = asyncio.Condition()
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        #: every connection accepted, in order: its client side, to cut it alone
        self.accepted: list[asyncio.StreamWriter] = []
        #: set while bytes from clients go on to the target (:meth:`hold`)
        self._flowing = asyncio.Event()
        self._flowing.set()

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/acp"

    async def listen(self) -> None:
        self._server = await asyncio.start_server(
            self._accept, "127.0.0.1", self.port, reuse_address=True
        )
        self.port = self._server.sockets[0].getsockname()[1]

    async def refuse(self) -> None:
        """Stop listening (reconnects are refused) and cut every connection."""
        server, self._server = self._server, None
        if server is not None:
            server.close()
        # cut first: since Python 3.12.1, wait_closed() also waits for every accepted
        # connection to end, and a stalled one never ends on its own
        await self.cut()
        if server is not None:
            await server.wait_closed()

    def stop_listening(self) -> None:
        """Refuse new connections; the ones open carry on (:meth:`open` listens again)."""
        server, self._server = self._server, None
        if server is not None:
            server.close()  # no wait_closed: it would wait for the connections kept open

    def cut_one(self, index: int) -> None:
        """Cut the ``index``-th connection accepted (0: the first), both sides."""
        self.accepted[index].close()

    def cut_oldest(self, count: int) -> None:
        """Cut the ``count`` oldest connections still open (the longest-lived: a router's
        control links, which it opens first and keeps)."""
        self.accepted = [w for w in self.accepted if not w.is_closing()]
        for writer in self.accepted[:count]:
            writer.close()

    def stall(self) -> None:
        self.mode = Mode.STALL

    def hold(self) -> None:
        """Read nothing more from clients (their sends back up, as to a backend that does
        not read) until :meth:`release`; the target's bytes still reach them."""
        self._flowing.clear()

    def release(self) -> None:
        self._flowing.set()

    async def open(self, target_port: int | None = None) -> None:
        """Pass bytes again (to ``target_port`` if given); stalled connections are cut."""
        self.target_port = target_port or self.target_port
        self.mode = Mode.PASS
        await self.cut()
        if self._server is None:
            await self.listen()

    async def cut(self) -> None:
        """Close every connection through the relay, both sides."""
        for writer in list(self._writers):
            writer.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def wait_stalled(self, count: int, timeout: float) -> None:
        async with asyncio.timeout(timeout), self._changed:
            await self._changed.wait_for(lambda: self.stalled >= count)

    async def close(self) -> None:
        await self.refuse()

    def _own(self, task: asyncio.Task[None]) -> None:
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # the connection is served by a task the relay owns (and cuts), not by the server's
        self._writers.add(writer)
        self.accepted.append(writer)
        self._own(asyncio.create_task(self._serve(reader, writer)))

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            if self.mode is Mode.STALL:
                async with self._changed:
                    self.stalled += 1
                    self._changed.notify_all()
                await asyncio.Event().wait()  # silent until cut
            target_reader, target_writer = await asyncio.open_connection(
                "127.0.0.1", self.target_port
            )
            self._writers.add(target_writer)
            try:
                await asyncio.gather(
                    _pipe(reader, target_writer, self._flowing), _pipe(target_reader, writer)
                )
            finally:
                self._writers.discard(target_writer)
                target_writer.close()
        except (ConnectionError, OSError):
            pass
        finally:
            self._writers.discard(writer)
            writer.close()


async def _pipe(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, flowing: asyncio.Event | None = None
) -> None:
    try:
        while True:
            if flowing is not None:
                await flowing.wait()
            data = await reader.read(65536)
            if not data:
                break
            writer.write(data)
            await writer.drain()
    finally:
        writer.close()


@contextlib.asynccontextmanager
async def start_relay(target_url: str) -> AsyncIterator[Relay]:
    """A relay in front of the WebSocket server at ``target_url`` (ws://127.0.0.1:PORT/...)."""
    relay = Relay(_port_of(target_url))
    await relay.listen()
    try:
        yield relay
    finally:
        await relay.close()


def _port_of(url: str) -> int:
    return int(url.split("//", 1)[1].split("/", 1)[0].rsplit(":", 1)[1])
