"""A real Prometheus (Debian's ``prometheus`` package) for the monitoring tests, and an
Alertmanager stand-in that receives the alerts it fires.

Prometheus pushes firing alerts to its Alertmanagers (``POST /api/v2/alerts``), so a test
waits for an alert on that push instead of polling the query API until the alert shows.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from aiohttp import web

from tests.support import WAIT, CliProcess, free_port

PROMETHEUS = shutil.which("prometheus")
PROMTOOL = shutil.which("promtool")
#: the scrape and rule evaluation interval of the test Prometheus (the compose one uses 15 s)
INTERVAL = "1s"

Alert = dict[str, Any]


@dataclass
class AlertReceiver:
    """Answers Prometheus' ``POST /api/v2/alerts`` and keeps every alert it was sent."""

    url: str = ""
    received: list[Alert] = field(default_factory=list)
    _changed: asyncio.Condition = field(default_factory=asyncio.Condition)

    async def _post(self, request: web.Request) -> web.Response:
        alerts: list[Alert] = await request.json()
        async with self._changed:
            self.received.extend(alerts)
            self._changed.notify_all()
        return web.json_response({})

    async def wait_for(
        self, predicate: Callable[[Alert], bool], count: int = 1, timeout: float = 30.0
    ) -> list[Alert]:
        """The first ``count`` notifications of alerts matching ``predicate``."""

        def matching() -> list[Alert]:
            return [alert for alert in self.received if predicate(alert)]

        try:
            async with asyncio.timeout(timeout), self._changed:
                await self._changed.wait_for(lambda: len(matching()) >= count)
        except TimeoutError:
            raise AssertionError(f"no such alert within {timeout}s; got {self.received}") from None
        return matching()[:count]


@contextlib.asynccontextmanager
async def receive_alerts() -> AsyncIterator[AlertReceiver]:
    receiver = AlertReceiver()
    app = web.Application()
    app.router.add_post("/api/v2/alerts", receiver._post)
    runner = web.AppRunner(app)
    await runner.setup()
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        receiver.url = f"127.0.0.1:{runner.addresses[0][1]}"
        yield receiver
    finally:
        await runner.cleanup()


@dataclass(frozen=True, slots=True)
class Prometheus:
    base: str
    process: CliProcess

    async def api(self, path: str, **params: str) -> Any:
        """``GET /api/v1/<path>``'s ``data``, asserting the call succeeded."""
        async with aiohttp.ClientSession() as http, asyncio.timeout(WAIT):
            async with http.get(f"{self.base}/api/v1/{path}", params=params) as response:
                body = await response.json()
        assert body["status"] == "success", body
        return body["data"]


@contextlib.asynccontextmanager
async def run_prometheus(config: dict[str, Any], workdir: Path) -> AsyncIterator[Prometheus]:
    """Run Prometheus on ``config`` until it says it is ready; stop it (SIGTERM) on exit."""
    assert PROMETHEUS is not None
    config_file = workdir / "prometheus.yml"
    config_file.write_text(yaml.safe_dump(config))
    port = free_port()
    process = await asyncio.create_subprocess_exec(
        PROMETHEUS,
        f"--config.file={config_file}",
        f"--storage.tsdb.path={workdir / 'tsdb'}",
        f"--web.listen-address=127.0.0.1:{port}",
        # re-send firing alerts every evaluation, not once a minute
        "--rules.alert.resend-delay=1s",
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    prometheus = CliProcess(process)
    try:
        await prometheus.wait_for_log("Server is ready to receive web requests", timeout=30.0)
        yield Prometheus(f"http://127.0.0.1:{port}", prometheus)
    finally:
        await prometheus.stop()
