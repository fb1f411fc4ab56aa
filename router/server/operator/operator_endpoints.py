"""The operator endpoints: ``/metrics`` (on the router's own port, or alone on
``router.metrics_listen``), ``/healthz`` and ``/readyz`` (docs/security.md, "Operator
endpoints").
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable

from aiohttp import web

from router.server.door.app_keys import DRAINING, EXPOSITION, POOL
from router.server.observability.metrics import CONTENT_TYPE, Metrics

logger = logging.getLogger(__name__)


def create_metrics_app(exposition: Callable[[], Awaitable[bytes]]) -> web.Application:
    """``/metrics`` alone, for ``router.metrics_listen``."""
    app = web.Application()
    app[EXPOSITION] = exposition
    app.router.add_get("/metrics", metrics_page)
    return app


def exposition_of(metrics: Metrics) -> Callable[[], Awaitable[bytes]]:
    async def exposition() -> bytes:
        return metrics.exposition()

    return exposition


async def metrics_page(request: web.Request) -> web.Response:
    body = await request.app[EXPOSITION]()
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})


async def healthz(request: web.Request) -> web.Response:
    return web.Response(text="ok\n")


async def readyz(request: web.Request) -> web.Response:
    if request.app[DRAINING].is_set():
        return web.Response(status=503, text="draining\n")
    ready = request.app[POOL].ready()
    if not ready:
        return web.Response(status=503, text="no backend is up\n")
    return web.Response(text=f"ready: {len(ready)} backend(s) up\n")


async def serve_metrics(
    stack: contextlib.AsyncExitStack,
    exposition: Callable[[], Awaitable[bytes]],
    host: str,
    port: int,
    *,
    what: str = "metrics",
) -> None:
    """Serve ``/metrics`` alone on ``host:port`` (``router.metrics_address``) until
    ``stack`` closes; the log says where, as ``what``."""
    runner = web.AppRunner(create_metrics_app(exposition), handle_signals=False, access_log=None)
    await runner.setup()
    stack.push_async_callback(runner.cleanup)
    await web.TCPSite(runner, host, port).start()
    logger.info("%s on http://%s:%d/metrics", what, host, runner.addresses[0][1])
