"""A running router's /metrics (and that of a router with workers) serves the families the
metrics table of docs/operations.md documents, with their HELP, and no ``*_created`` series
(tests/server/test_metrics.py: the families themselves and the table)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from router.server.observability.metrics import WORKER_UP
from tests.fleet import start_fleet
from tests.server.support import documented_metrics
from tests.support import WAIT, run_cli


def served(exposition: str) -> dict[str, str]:
    """The families a scrape holds (counters named with ``_total``), with their HELP;
    every sample checked for a ``_created`` series."""
    families = {}
    for family in text_string_to_metric_families(exposition):
        for sample in family.samples:
            assert not sample.name.endswith("_created"), sample
        name = family.name + ("_total" if family.type == "counter" else "")
        families[name] = family.documentation
    return families


async def scrape(url: str) -> str:
    async with aiohttp.ClientSession() as http, asyncio.timeout(WAIT):
        async with http.get(url) as response:
            assert response.status == 200
            return await response.text()


@pytest.mark.parametrize("workers", [1, 2])
async def test_metrics_serves_the_documented_families_and_nothing_else(
    tmp_path: Path, workers: int
) -> None:
    documented = documented_metrics()
    async with start_fleet(tmp_path / "store", 1) as agents:
        config = tmp_path / "router.toml"
        # with workers, the parent's metrics_listen: every worker's series, merged
        config.write_text(
            f'[router]\nlisten = "127.0.0.1:0"\nworkers = {workers}\n'
            'metrics_listen = "127.0.0.1:0"\n'
            f'[[backends]]\nid = "agent-1"\nurl = "{agents[0].url}"\n'
        )
        async with run_cli("serve", "--config", str(config)) as router:
            line = await router.wait_for_log("/metrics")
            families = served(await scrape(line.rsplit(" ", 1)[-1].strip()))
            assert await router.stop() == 0
    expected = set(documented) - ({WORKER_UP} if workers == 1 else set())
    ours = {name for name in families if name.startswith("acp_router_")}
    assert ours == expected, (sorted(ours - expected), sorted(expected - ours))
    assert {name.split("_")[0] for name in set(families) - ours} == {"process"}
    for name in ours:
        assert families[name] == documented[name][1], name
