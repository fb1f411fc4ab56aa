"""Running the router: its application served on the listening sockets until a stop
signal, then drained and its clients closed (:mod:`router.server.process.shutdown`), as the
process itself or as one worker of several (:mod:`router.server.process.workers`).
docs/operations.md says how ("Draining and rolling the router", "Workers: more than one
core per router").
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import platform
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from aiohttp import web
from aiohttp.log import access_logger

from router import native
from router.server.config import Settings
from router.server.door.accepting import listen, listen_on
from router.server.door.app_keys import (
    CLIENTS,
    DRAINING,
    EXPOSITION,
    GUARD,
    HTTP_FRONT,
    METRICS,
    POOL,
    SETTINGS,
    OpenClients,
)
from router.server.links.tls import server_context
from router.server.loops import running_loop
from router.server.observability.metrics import WorkersExposition
from router.server.operator.operator_endpoints import serve_metrics
from router.server.process.app import RELOADER, create_app, sibling_app
from router.server.process.shutdown import (
    StopSignals,
    close_spread,
    reloading_on_hangup,
    wait_unless,
)
from router.server.process.workers import (
    Affinity,
    ParentChannel,
    WorkerRole,
    ready_to_serve,
    serving_siblings,
)

logger = logging.getLogger(__name__)


def announce(url: str) -> None:
    print(f"acp-router listening on {url}", flush=True)  # noqa: T201


async def serve(
    settings: Settings,
    on_listening: Callable[[str], None] = announce,
    *,
    config_path: Path | None = None,
    worker: WorkerRole | None = None,
) -> None:
    """Run the router until SIGINT or SIGTERM, reloading ``config_path`` on SIGHUP;
    ``on_listening`` gets the bound ws:// URL.

    ``worker``: run as one worker of a router with ``router.workers`` above 1
    (:mod:`router.server.process.workers`): on the listening sockets the parent handed over, with
    ``/metrics`` answering for every worker, and telling the parent, not
    ``on_listening``, once it listens.

    The stop sequence is :mod:`router.server.process.shutdown`'s; the signals stay handled until
    the process is done, so a signal during clean-up cannot kill it halfway.
    """
    app = create_app(settings, config_path=config_path)
    affinity = None if worker is None else _as_worker(app, worker)
    tls = server_context(settings.router)
    access_log = access_logger if settings.router.access_log else None
    runner = app_runner(app, access_log=access_log)
    with StopSignals().installed() as signals:
        await runner.setup()
        async with contextlib.AsyncExitStack() as stack:
            stack.push_async_callback(runner.cleanup)
            host, port = settings.router.address
            if worker is not None and affinity is not None:
                await stack.enter_async_context(affinity)
                await ready_to_serve(app[POOL], settings.router.connect_timeout_ms / 1000)
                await listen_on(runner, app[GUARD], worker.listening_sockets(), tls)
                await stack.enter_async_context(serving_siblings(worker, sibling_app(app)))
                channel = await stack.enter_async_context(ParentChannel(worker))
                on_listening = channel.listening
            else:
                await listen(runner, app[GUARD], host, port, tls)
                if settings.router.metrics_address is not None:
                    await serve_metrics(stack, app[EXPOSITION], *settings.router.metrics_address)
            if settings.auth is None and (worker is None or worker.index == 0):
                logger.warning(
                    "no [auth] section: any client that reaches %s may use the agents", host
                )
            await stack.enter_async_context(reloading_on_hangup(app[RELOADER].reload))
            loop = running_loop()
            app[METRICS].event_loop.labels(loop).set(1)
            python = platform.python_version()
            logger.info("event loop: %s, Python %s, %s modules", loop, python, native.describe())
            scheme = "ws" if tls is None else "wss"
            on_listening(f"{scheme}://{host}:{runner.addresses[0][1]}/acp")
            await signals.stop.wait()
            sys.stdout.flush()
            await drain(app, settings.router.drain_seconds, signals.hurry)
            spread = settings.router.close_spread_seconds
            open_clients: OpenClients = app[CLIENTS]
            await close_spread(list(open_clients), spread, signals.hurry)
    logger.info("stopped")


def _as_worker(app: web.Application, worker: WorkerRole) -> Affinity:
    """Make ``app`` one worker's front door (before its runner is set up): ``/metrics``
    answers for every worker, and Streamable HTTP requests reach the worker that holds
    their connection (the middleware returned, to be entered for the serving)."""
    every_worker: Callable[[], Awaitable[bytes]] = WorkersExposition(
        worker.sockets, own=(worker.index, app[METRICS])
    )
    app[EXPOSITION] = every_worker
    affinity = Affinity(worker, app[HTTP_FRONT])
    app.middlewares.append(affinity.middleware)
    return affinity


def app_runner(app: web.Application, **kwargs: Any) -> web.AppRunner:
    """The runner of the router's application: an idle HTTP keep-alive connection is
    closed after ``router.handshake_timeout_ms`` too (aiohttp's default is an hour).
    Start its site with :func:`router.server.door.accepting.listen`."""
    keepalive = app[SETTINGS].router.handshake_timeout_ms / 1000
    return web.AppRunner(app, handle_signals=False, keepalive_timeout=keepalive, **kwargs)


async def drain(app: web.Application, seconds: float, hurry: asyncio.Event | None = None) -> None:
    """Stop taking clients and report not-ready for ``seconds`` (so load balancers and
    Kubernetes take this replica out), while connected clients carry on; the caller
    then closes them. ``hurry`` (a second stop signal) cuts the window short."""
    app[DRAINING].set()
    if seconds > 0:
        logger.info("draining for %.1f s", seconds)
        await wait_unless(hurry or asyncio.Event(), seconds)
