"""What a worker process is (``router.workers`` above 1): its part of the port, its
channel to the parent, and the socket its metrics are read on.

A router with workers is a parent process that routes nothing
(:mod:`router.server.supervisor`) and N worker processes, each a whole router: one
replica as README "Scaling out the router" describes, with its own backend pool,
control links, location hints, limits and admin state. The parent starts each one as
``acp-router serve --config FILE`` with the hidden options of :class:`WorkerRole`.

- **The port.** On Linux every worker has a listening socket of its own on the same
  address (``SO_REUSEPORT``), and the kernel spreads new connections evenly over them.
  The parent makes these sockets (:class:`Listeners`) and hands each to the worker it
  starts: port 0 is resolved once, and the parent keeps a bound, not listening, socket
  on the port so that no other program takes it while a worker starts again. Elsewhere
  ``SO_REUSEPORT`` is missing or does not balance, so the workers share one listening
  socket (the start says so) and whichever is quickest to accept takes a connection.
- **The channel.** A socket pair: the worker writes ``listening`` once it serves; the
  parent writes nothing, so the worker reads end-of-file only when the parent is gone,
  and then stops as on SIGTERM (:class:`ParentChannel`).
- **Metrics.** Each worker serves its own registry at ``/metrics`` on a Unix socket in
  the parent's private folder (:func:`serving_own_metrics`); a scrape of any worker, or
  of the parent's ``router.metrics_listen``, reads them all
  (:class:`router.server.metrics.WorkersExposition`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import sys
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from aiohttp import web

from router.server.metrics import CONTENT_TYPE, Metrics
from router.tasks import cancel_and_wait

logger = logging.getLogger(__name__)

#: a listening socket's queue of connections not yet accepted (aiohttp's default)
BACKLOG = 128
#: what a worker writes on its channel once it serves
LISTENING = b"listening\n"


def reuse_port_balances() -> bool:
    """Whether the kernel spreads connections over sockets sharing a port with
    ``SO_REUSEPORT`` (Linux does; the BSDs and macOS hand them all to one socket)."""
    return sys.platform.startswith("linux") and hasattr(socket, "SO_REUSEPORT")


def metrics_socket(folder: Path, index: int) -> Path:
    """Where worker ``index`` serves its own registry."""
    return folder / f"worker-{index}.sock"


@dataclass(frozen=True, slots=True)
class WorkerRole:
    """What the parent tells a worker, on its command line (``serve --worker I/N
    --worker-folder DIR --worker-fds L1,...,C``)."""

    index: int
    count: int
    #: the parent's private folder: every worker's metrics socket
    folder: Path
    #: the listening sockets it serves on, one per address of ``router.listen``
    listen_fds: tuple[int, ...]
    #: its end of the channel to the parent
    channel_fd: int

    def argv(self) -> list[str]:
        fds = ",".join(str(fd) for fd in (*self.listen_fds, self.channel_fd))
        return [
            "--worker",
            f"{self.index}/{self.count}",
            "--worker-folder",
            str(self.folder),
            "--worker-fds",
            fds,
        ]

    @classmethod
    def of(cls, worker: str, folder: str, fds: str) -> WorkerRole:
        """The role from its command-line options; ValueError when they make none."""
        index, _, count = worker.partition("/")
        numbers = [int(fd) for fd in fds.split(",")]
        role = cls(int(index), int(count), Path(folder), tuple(numbers[:-1]), numbers[-1])
        if not 0 <= role.index < role.count or not role.listen_fds:
            raise ValueError(f"not a worker role: {worker} {fds}")
        return role

    @property
    def sockets(self) -> list[Path]:
        """Every worker's metrics socket, by index."""
        return [metrics_socket(self.folder, index) for index in range(self.count)]

    def listening_sockets(self) -> list[socket.socket]:
        """The listening sockets the parent handed over."""
        return [socket.socket(fileno=fd) for fd in self.listen_fds]


# -- the parent's side of the port ----------------------------------------------------------


def _addresses(host: str, port: int) -> list[tuple[int, tuple[object, ...]]]:
    """The distinct (family, address) pairs ``host`` names, as a server binds them."""
    found: list[tuple[int, tuple[object, ...]]] = []
    for family, _, _, _, address in socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    ):
        if (family, address) not in found:
            found.append((family, address))
    return found


def _socket(family: int, *, reuse_port: bool) -> socket.socket:
    """A TCP socket set up as asyncio sets up a server's."""
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    if family == socket.AF_INET6:
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
    return sock


class Listeners:
    """The sockets of ``router.listen``, made by the parent for its workers.

    ``balanced`` (Linux): a new listening socket per worker start, on the addresses
    bound at first (port 0 resolved then), while the parent holds one bound socket
    per address that never listens, so the port stays reserved. Otherwise: one set of
    listening sockets that every worker is given.

    Raises:
        OSError: an address cannot be bound (in use, not this host's).
    """

    def __init__(self, host: str, port: int, *, balanced: bool) -> None:
        self.balanced = balanced
        self._held: list[socket.socket] = []
        self._bound: list[tuple[int, tuple[object, ...]]] = []
        try:
            for family, address in _addresses(host, port):
                if self._bound:  # the port the first address got, when it was 0
                    address = (address[0], self.port, *address[2:])
                sock = _socket(family, reuse_port=balanced)
                self._held.append(sock)
                sock.bind(address)
                if not balanced:
                    sock.listen(BACKLOG)
                self._bound.append((family, sock.getsockname()))
        except BaseException:
            self.close()
            raise

    @property
    def port(self) -> int:
        port: int = self._bound[0][1][1]  # type: ignore[assignment]
        return port

    def for_worker(self) -> list[socket.socket]:
        """Listening sockets for a worker about to start; give them to :meth:`handed_over`
        once it has them."""
        if not self.balanced:
            return list(self._held)
        made: list[socket.socket] = []
        try:
            for family, address in self._bound:
                sock = _socket(family, reuse_port=True)
                made.append(sock)
                sock.bind(address)
                sock.listen(BACKLOG)
        except BaseException:
            for sock in made:
                sock.close()
            raise
        return made

    def handed_over(self, sockets: Sequence[socket.socket]) -> None:
        """The worker holds ``sockets`` now: close the parent's copies of its own ones,
        so they close when it ends and the kernel gives their share to the others."""
        if self.balanced:
            for sock in sockets:
                sock.close()

    def close(self) -> None:
        for sock in self._held:
            sock.close()


# -- the worker's side ----------------------------------------------------------------------


class ParentChannel:
    """A worker's end of its channel to the parent: :meth:`listening` tells the parent
    it serves; end-of-file means the parent is gone, and the worker stops as on SIGTERM
    (its clients drained and answered, as a single router's)."""

    def __init__(self, fd: int) -> None:
        self._sock = socket.socket(fileno=fd)
        self._writer: asyncio.StreamWriter | None = None
        self._watch: asyncio.Task[None] | None = None

    async def __aenter__(self) -> ParentChannel:
        reader, self._writer = await asyncio.open_unix_connection(sock=self._sock)
        self._watch = asyncio.create_task(self._watch_parent(reader), name="watch-parent")
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self._watch is not None:
            await cancel_and_wait(self._watch)
        if self._writer is not None:
            self._writer.close()
            with contextlib.suppress(OSError):
                await self._writer.wait_closed()

    def listening(self, url: str) -> None:
        """Tell the parent this worker serves (the parent announces ``url`` once every
        worker does)."""
        assert self._writer is not None, "enter the channel first"
        self._writer.write(LISTENING)

    @staticmethod
    async def _watch_parent(reader: asyncio.StreamReader) -> None:
        with contextlib.suppress(OSError):
            await reader.read()  # the parent writes nothing: this returns at end-of-file
        logger.warning("the parent process is gone: stopping")
        os.kill(os.getpid(), signal.SIGTERM)


async def _own_metrics(request: web.Request) -> web.Response:
    body = request.app[_METRICS].exposition()
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})


_METRICS = web.AppKey("metrics", Metrics)


@contextlib.asynccontextmanager
async def serving_own_metrics(role: WorkerRole, metrics: Metrics) -> AsyncIterator[None]:
    """Serve this worker's registry alone at ``/metrics`` on its Unix socket, for the
    worker (or parent) that answers a scrape."""
    app = web.Application()
    app[_METRICS] = metrics
    app.router.add_get("/metrics", _own_metrics)
    runner = web.AppRunner(app, handle_signals=False, access_log=None)
    await runner.setup()
    try:
        await web.UnixSite(runner, str(metrics_socket(role.folder, role.index))).start()
        yield
    finally:
        await runner.cleanup()
