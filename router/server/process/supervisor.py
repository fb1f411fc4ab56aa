"""The parent process of a router with workers (``router.workers`` above 1).

It routes nothing: it binds ``router.listen`` (:class:`router.server.process.workers.Listeners`),
starts the N workers, each in a process group of its own (a Ctrl-C in a terminal reaches
the parent only, which passes it on once), and then:

- **SIGTERM or SIGINT** goes to every worker, which drains and closes its clients as a
  single router does (:mod:`router.server.process.shutdown`); a second one goes on too (the
  workers hurry). The parent waits for them all and exits 0 when each stopped cleanly,
  1 otherwise.
- **SIGHUP** goes to every worker: each reloads the file (a worker still starting gets
  it once it listens).
- **A worker that ends** on its own is started again, after 0.5 s, then twice as long
  after each end that comes within a minute of its start, up to 30 s. A worker that
  ends before every worker of the first start listens stops the router (exit 1): a
  router that cannot start should not pretend to run.
- ``router.metrics_listen``: the parent serves ``/metrics`` there, every worker's series.

The router announces ``acp-router listening on ws://...`` once every worker listens.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from router.server.config import Settings
from router.server.links.tls import server_context
from router.server.observability.metrics import WorkersExposition
from router.server.operator.operator_endpoints import serve_metrics
from router.server.process.app import create_app
from router.server.process.shutdown import StopSignals, wait_unless
from router.server.process.workers import (
    LISTENING,
    Listeners,
    WorkerRole,
    reuse_port_balances,
    sibling_socket,
)
from router.tasks import cancel_all_and_wait

logger = logging.getLogger(__name__)

#: the wait before a worker that ended starts again; doubled after each quick end
INITIAL_BACKOFF_SECONDS = 0.5
MAX_BACKOFF_SECONDS = 30.0
#: a worker that ran this long before it ended was not failing: the wait starts over
STABLE_SECONDS = 60.0


def backoff(failures: int) -> float:
    """Seconds before a worker starts again after ``failures`` (1 or more) quick ends in
    a row."""
    return float(min(MAX_BACKOFF_SECONDS, INITIAL_BACKOFF_SECONDS * 2 ** (failures - 1)))


def ended(status: int) -> str:
    """A worker's exit status in words."""
    if status < 0:
        try:
            return f"was killed by {signal.Signals(-status).name}"
        except ValueError:
            return f"was killed by signal {-status}"
    return f"exited with status {status}"


@dataclass(slots=True)
class _Worker:
    """One running worker process and the parent's end of its channel."""

    index: int
    process: asyncio.subprocess.Process
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    started_at: float
    listening: bool = False
    #: a SIGHUP came while it was starting: send it once it listens
    reload_pending: bool = False

    def send(self, signum: int) -> None:
        if self.process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(signum)


class Supervisor:
    """Starts the workers, passes signals on to them, starts again those that end."""

    def __init__(
        self, command: Sequence[str], count: int, folder: Path, listeners: Listeners
    ) -> None:
        self._command = command
        self._count = count
        self._folder = folder
        self._listeners = listeners
        self._workers: dict[int, _Worker] = {}
        self._listened: set[int] = set()
        self._all_listening = asyncio.Event()
        #: set by a stop signal, or by a worker that failed at the first start
        self._stopping = asyncio.Event()
        self._failed = False

    async def run(self, signals: StopSignals, announce: Callable[[], None]) -> int:
        """Run the workers until a stop signal (or a failed start); the exit status."""
        slots = [
            asyncio.create_task(self._keep(index), name=f"worker-{index}")
            for index in range(self._count)
        ]
        relays = [
            asyncio.create_task(self._relay(signals.stop), name="relay-stop"),
            asyncio.create_task(self._relay(signals.hurry), name="relay-hurry"),
            asyncio.create_task(self._announce_once(announce), name="announce"),
        ]
        try:
            statuses = await asyncio.gather(*slots)
        finally:
            self._stop()
            await cancel_all_and_wait(*slots, *relays)
        if self._failed:
            return 1
        return 0 if all(status == 0 for status in statuses) else 1

    def reload(self) -> None:
        """SIGHUP: every worker reloads the configuration."""
        logger.info("SIGHUP: every worker reloads the configuration")
        for worker in self._workers.values():
            if worker.listening:
                worker.send(signal.SIGHUP)
            else:
                worker.reload_pending = True

    async def _relay(self, event: asyncio.Event) -> None:
        """Once ``event`` (a stop signal, or the second one) is set, pass SIGTERM on."""
        await event.wait()
        self._stop()

    def _stop(self) -> None:
        self._stopping.set()
        for worker in self._workers.values():
            worker.send(signal.SIGTERM)

    async def _announce_once(self, announce: Callable[[], None]) -> None:
        await self._all_listening.wait()
        if not self._stopping.is_set():
            announce()

    async def _keep(self, index: int) -> int:
        """Keep worker ``index`` running until the stop; its last exit status (0 for a
        worker stopped before it listened)."""
        loop = asyncio.get_running_loop()
        failures = 0
        while True:
            worker = await self._start(index)
            status = await self._until_ended(worker)
            if self._stopping.is_set():
                return 0 if worker.listening is False and status == -signal.SIGTERM else status
            pid = worker.process.pid
            if not self._all_listening.is_set():
                logger.error(
                    "worker %d (pid %d) %s before the router was listening: stopping",
                    index,
                    pid,
                    ended(status),
                )
                self._failed = True
                self._stop()
                return status
            failures = 1 if loop.time() - worker.started_at >= STABLE_SECONDS else failures + 1
            delay = backoff(failures)
            logger.error(
                "worker %d (pid %d) %s; starting it again in %.1f s",
                index,
                pid,
                ended(status),
                delay,
            )
            if await wait_unless(self._stopping, delay):
                return 0

    async def _start(self, index: int) -> _Worker:
        parent_end, child_end = socket.socketpair()
        try:
            listening = self._listeners.for_worker()
            try:
                role = WorkerRole(
                    index,
                    self._count,
                    self._folder,
                    tuple(sock.fileno() for sock in listening),
                    child_end.fileno(),
                )
                process = await asyncio.create_subprocess_exec(
                    *self._command,
                    *role.argv(),
                    stdin=asyncio.subprocess.DEVNULL,
                    pass_fds=(*role.listen_fds, role.channel_fd),
                    process_group=0,
                )
            finally:
                self._listeners.handed_over(listening)
                child_end.close()
            reader, writer = await asyncio.open_unix_connection(sock=parent_end)
        except BaseException:
            parent_end.close()
            raise
        worker = _Worker(index, process, reader, writer, asyncio.get_running_loop().time())
        self._workers[index] = worker
        logger.info("worker %d (pid %d) started", index, process.pid)
        if self._stopping.is_set():
            worker.send(signal.SIGTERM)
        return worker

    async def _until_ended(self, worker: _Worker) -> int:
        """Wait for ``worker`` to say it listens, then to end; its exit status."""
        try:
            if await worker.reader.readline() == LISTENING:
                self._listens(worker)
            return await worker.process.wait()
        finally:
            self._workers.pop(worker.index, None)
            worker.writer.close()

    def _listens(self, worker: _Worker) -> None:
        worker.listening = True
        again = worker.index in self._listened
        self._listened.add(worker.index)
        logger.info(
            "worker %d (pid %d) is listening%s",
            worker.index,
            worker.process.pid,
            " again" if again else "",
        )
        if len(self._listened) == self._count:
            self._all_listening.set()
        if worker.reload_pending:
            worker.send(signal.SIGHUP)


async def serve_workers(
    settings: Settings,
    on_listening: Callable[[str], None],
    *,
    config_path: Path,
    command: Sequence[str],
) -> int:
    """Run the router as ``router.workers`` worker processes, each started as
    ``command`` (``acp-router serve --config FILE``) with its role, until SIGINT or
    SIGTERM; the exit status.

    Raises:
        ConfigError: a token source, the session secret or a TLS file is unusable
            (checked here, once, before any worker starts).
        OSError: ``router.listen`` cannot be bound.
    """
    create_app(settings, config_path=config_path)  # reads every file a worker will read
    scheme = "ws" if server_context(settings.router) is None else "wss"
    count = settings.router.workers
    balanced = reuse_port_balances()
    if not balanced:
        logger.warning(
            "SO_REUSEPORT is missing or does not spread connections on %s (it does on"
            " Linux): the %d workers share one listening socket, and one of them may take"
            " most connections",
            sys.platform,
            count,
        )
    host, port = settings.router.address
    listeners = Listeners(host, port, balanced=balanced)
    loop = asyncio.get_running_loop()
    with (
        contextlib.closing(listeners),
        tempfile.TemporaryDirectory(prefix="acp-router-") as folder,
        StopSignals().installed() as signals,
    ):
        supervisor = Supervisor(command, count, Path(folder), listeners)
        sockets = [sibling_socket(Path(folder), index) for index in range(count)]
        async with contextlib.AsyncExitStack() as stack:
            if settings.router.metrics_address is not None:
                await serve_metrics(
                    stack,
                    WorkersExposition(sockets),
                    *settings.router.metrics_address,
                    what="metrics of every worker",
                )
            loop.add_signal_handler(signal.SIGHUP, supervisor.reload)
            stack.callback(loop.remove_signal_handler, signal.SIGHUP)
            logger.info("starting %d workers on %s:%d", count, host, listeners.port)
            url = f"{scheme}://{host}:{listeners.port}/acp"
            status = await supervisor.run(signals, lambda: on_listening(url))
    logger.info("stopped")
    return status
