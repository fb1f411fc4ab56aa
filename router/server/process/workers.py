"""What a worker process is (``router.workers`` above 1): its part of the port, its
channel to the parent, and the socket its metrics are read on.

A router with workers is a parent process that routes nothing
(:mod:`router.server.process.supervisor`) and N worker processes, each a whole router: one
replica as docs/operations.md "Scaling out the router" describes, with its own backend pool,
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
- **Between workers.** Each worker serves, on a Unix socket in the parent's private
  folder (:func:`serving_siblings`), what the others may ask of it: its own registry at
  ``/metrics`` (a scrape of any worker, or of the parent's ``router.metrics_listen``,
  reads them all: :class:`router.server.observability.metrics.WorkersExposition`), and the Streamable
  HTTP requests of the connections it holds (:class:`Affinity`).
- **Streamable HTTP.** An HTTP connection lives in the worker that answered its
  ``initialize``, but its later requests come on other TCP connections, which the kernel
  may hand to any worker. So the worker puts its index in front of the connection id it
  answers (``1.Zx8...``), and a worker that gets a request for another worker's
  connection passes it on to that worker over its socket, the answer (an event stream
  too) streamed back as it comes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

import aiohttp
from aiohttp import hdrs, web

from router.protocol import acp
from router.server.door.event_stream import drop_unread
from router.server.door.streamable_http import HttpFront
from router.server.pool.backends import Pool
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


def sibling_socket(folder: Path, index: int) -> Path:
    """Where worker ``index`` answers the other workers (and the parent)."""
    return folder / f"worker-{index}.sock"


@dataclass(frozen=True, slots=True)
class WorkerRole:
    """What the parent tells a worker, on its command line (``serve --worker I/N
    --worker-folder DIR --worker-fds L1,...,C``)."""

    index: int
    count: int
    #: the parent's private folder: every worker's socket for the others
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
        """Every worker's socket for the others, by index."""
        return [sibling_socket(self.folder, index) for index in range(self.count)]

    def listening_sockets(self) -> list[socket.socket]:
        """The sockets the parent handed over (each listens once the worker serves on it)."""
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

    ``balanced`` (Linux): a new socket per worker start, on the addresses bound at
    first (port 0 resolved then), which the worker makes listen once it is ready (the
    kernel hands connections only to sockets that listen, so none waits on a worker
    still starting), while the parent holds one bound socket per address that never
    listens, so the port stays reserved. Otherwise: one set of listening sockets that
    every worker is given (a worker still starting accepts none).

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
        """Sockets for a worker about to start (balanced: bound, not listening yet); give
        them to :meth:`handed_over` once it has them."""
        if not self.balanced:
            return list(self._held)
        made: list[socket.socket] = []
        try:
            for family, address in self._bound:
                sock = _socket(family, reuse_port=True)
                made.append(sock)
                sock.bind(address)
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
    (its clients drained and answered, as a single router's).

    The parent removes its private folder when it ends; a parent that was killed cannot,
    so then each worker removes its own socket as it stops, and the last one out the
    folder."""

    def __init__(self, role: WorkerRole) -> None:
        self._role = role
        self._sock = socket.socket(fileno=role.channel_fd)
        self._writer: asyncio.StreamWriter | None = None
        self._watch: asyncio.Task[None] | None = None
        self._orphaned = False

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
        if self._orphaned:
            self._leave_folder()

    def listening(self, url: str) -> None:
        """Tell the parent this worker serves (the parent announces ``url`` once every
        worker does)."""
        assert self._writer is not None, "enter the channel first"
        self._writer.write(LISTENING)

    async def _watch_parent(self, reader: asyncio.StreamReader) -> None:
        with contextlib.suppress(OSError):
            await reader.read()  # the parent writes nothing: this returns at end-of-file
        logger.warning("the parent process is gone: stopping")
        self._orphaned = True
        os.kill(os.getpid(), signal.SIGTERM)

    def _leave_folder(self) -> None:
        """Remove this worker's socket, and the parent's folder once no other worker's
        is left in it (the others, stopping too, remove theirs)."""
        sibling_socket(self._role.folder, self._role.index).unlink(missing_ok=True)
        with contextlib.suppress(OSError):  # not empty yet, or removed by another already
            self._role.folder.rmdir()


async def ready_to_serve(pool: Pool, timeout: float) -> None:
    """Wait until ``pool`` is ready as ``/readyz`` says (a backend is up), or knows it
    will not be soon (no backend is unknown), for ``timeout`` seconds at most: a worker
    started again after a crash takes no connection before then (its clients would be
    told no backend is available while the other workers have some)."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(timeout):
            while not pool.ready() and pool.unreachable():
                await pool.ready_changed.wait()


@contextlib.asynccontextmanager
async def serving_siblings(role: WorkerRole, app: web.Application) -> AsyncIterator[None]:
    """Serve ``app`` (what the other workers may ask: ``/metrics``, and the Streamable
    HTTP requests they pass on) on this worker's Unix socket."""
    runner = web.AppRunner(app, handle_signals=False, access_log=None)
    await runner.setup()
    try:
        await web.UnixSite(runner, str(sibling_socket(role.folder, role.index))).start()
        yield
    finally:
        await runner.cleanup()


#: headers of one hop, not passed on (RFC 9110, 7.6.1), and those aiohttp sets itself
_HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "proxy-connection", "te", "trailer", "transfer-encoding",
     "upgrade", "host", "content-length", "date", "server"}
)  # fmt: skip
_NO_CONNECTION = "no such connection\n"


def worker_of(tagged: str, count: int) -> tuple[int, str] | None:
    """The worker (of ``count``) a tagged ``Acp-Connection-Id`` names, and its bare id;
    None for any other text: only the form the router hands out, ``{index}.{bare}``
    (read without ``int()`` on a number of any length; ``00.`` is not ``0.``)."""
    owner, dot, bare = tagged.partition(".")
    if not (dot and owner.isascii() and owner.isdigit() and len(owner) <= len(str(count))):
        return None
    index = int(owner)
    return (index, bare) if index < count and owner == str(index) else None


class Affinity:
    """Streamable HTTP connections across workers: each request reaches the worker that
    holds its connection (the index before the dot of its ``Acp-Connection-Id``).

    A middleware of this worker's front door: a request for a connection of its own goes
    on with the bare id; one for another worker's is passed on to that worker's socket
    (its answer, an event stream too, streamed back as it comes); an ``initialize``
    answered here gets this worker's index in front of its new connection id. A request
    for a worker that is gone (starting again) gets 404: its connections went with it.
    WebSocket upgrades and other paths pass untouched.

    A request passed on is held to the rules of this worker's ``front`` first: its
    origin and token are checked before any of its body is read, the body is read within
    the bytes the front may hold (``router.max_held_bytes``), and each write of the
    answer has the deadline of a local event stream's.
    """

    def __init__(self, role: WorkerRole, front: HttpFront) -> None:
        self._role = role
        self._front = front
        self._metrics = front.metrics
        self._siblings: dict[int, aiohttp.ClientSession] = {}

    async def __aenter__(self) -> Affinity:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        for http in self._siblings.values():
            await http.close()
        self._siblings.clear()

    @web.middleware
    async def middleware(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        if request.path != "/acp" or request.headers.get(hdrs.UPGRADE, "").lower() == "websocket":
            return await handler(request)
        tagged = request.headers.get(acp.CONNECTION_ID_HEADER)
        if tagged is None:
            return self._tag(await handler(request))
        tag = worker_of(tagged, self._role.count)
        if tag is None:
            return await handler(request)  # not a worker's id: no such connection
        owner, bare = tag
        headers = request.headers.copy()
        headers[acp.CONNECTION_ID_HEADER] = bare
        if owner == self._role.index:
            return await handler(request.clone(headers=headers))
        return await self._pass_on(request, owner, headers)

    def _tag(self, response: web.StreamResponse) -> web.StreamResponse:
        """An ``initialize`` answered here: its connection id names this worker."""
        bare = response.headers.get(acp.CONNECTION_ID_HEADER)
        if bare is not None and not response.prepared:
            response.headers[acp.CONNECTION_ID_HEADER] = f"{self._role.index}.{bare}"
        return response

    def _sibling(self, index: int) -> aiohttp.ClientSession:
        http = self._siblings.get(index)
        if http is None or http.closed:
            path = str(sibling_socket(self._role.folder, index))
            http = aiohttp.ClientSession(
                connector=aiohttp.UnixConnector(path=path, limit=0),
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=5.0),
                auto_decompress=False,
            )
            self._siblings[index] = http
        return http

    async def _pass_on(
        self, request: web.Request, owner: int, headers: Mapping[str, str]
    ) -> web.StreamResponse:
        admission = self._front.door.admit(request)
        if isinstance(admission, web.Response):
            return admission  # the origin and the token before a byte of the body
        self._metrics.http_passed_on.inc()
        forward = {k: v for k, v in headers.items() if k.lower() not in _HOP_BY_HOP}
        async with self._front.bodies.read(request) as body:
            if isinstance(body, web.Response):
                return body
            try:  # answered once the owner has read the body: it is held no longer here
                upstream = await self._sibling(owner).request(
                    request.method, "http://worker/acp", headers=forward, data=body or None
                )
            except (OSError, aiohttp.ClientError) as exc:
                logger.debug("worker %d did not take a request passed on: %s", owner, exc)
                return web.Response(status=404, text=_NO_CONNECTION)
        async with upstream:
            response = web.StreamResponse(status=upstream.status, reason=upstream.reason)
            for name, value in upstream.headers.items():
                if name.lower() not in _HOP_BY_HOP:
                    response.headers.add(name, value)
            await response.prepare(request)
            await self._stream_back(request, response, upstream)
        return response

    async def _stream_back(
        self, request: web.Request, response: web.StreamResponse, upstream: aiohttp.ClientResponse
    ) -> None:
        """Write the owner's answer as it comes, each write within a local event
        stream's deadline (past it, the client is dropped as a local one is)."""
        try:
            async for chunk in upstream.content.iter_any():
                async with asyncio.timeout(self._front.write_timeout):
                    await response.write(chunk)
            await response.write_eof()
        except (ConnectionError, aiohttp.ClientError):
            pass  # the client, or the owner, went
        except TimeoutError:
            drop_unread(request.transport)
