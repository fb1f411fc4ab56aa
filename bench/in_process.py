"""A router in the bench's own process (its event loop is the one a bench measures, and
its pool and metrics can be read directly), in front of the given backends."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

from router.server.config import settings_from
from router.server.door.accepting import listen
from router.server.door.app_keys import GUARD, POOL
from router.server.observability.metrics import Metrics
from router.server.pool.backends import Pool
from router.server.process.app import create_app
from router.server.process.serving import app_runner

#: how long the backends may take to come up
UP_SECONDS = 60


@dataclass(frozen=True, slots=True)
class InProcess:
    url: str
    port: int
    pool: Pool
    metrics: Metrics


@contextlib.asynccontextmanager
async def in_process_router(
    backends: Sequence[tuple[str, str]], **sections: dict[str, Any]
) -> AsyncIterator[InProcess]:
    """The router on 127.0.0.1:0 (``sections`` are config tables; ``router`` is merged
    with the listen address), once every backend is up."""
    router = {"listen": "127.0.0.1:0", **sections.pop("router", {})}
    settings = settings_from(
        {"router": router, "backends": [{"id": b, "url": u} for b, u in backends], **sections}
    )
    metrics = Metrics()
    app = create_app(settings, metrics)
    runner = app_runner(app, access_log=None)
    await runner.setup()
    try:
        await listen(runner, app[GUARD], "127.0.0.1", 0)
        pool = app[POOL]
        await up(pool, len(backends))
        port: int = runner.addresses[0][1]
        yield InProcess(f"ws://127.0.0.1:{port}/acp", port, pool, metrics)
    finally:
        await runner.cleanup()


async def up(pool: Pool, count: int) -> None:
    """Wait until exactly ``count`` backends are up."""
    async with asyncio.timeout(UP_SECONDS):
        while len(pool.ready()) != count:
            await pool.ready_changed.wait()
