"""deploy/prometheus and deploy/grafana, run: the rules pass promtool, every metric a rule
or a panel uses is exported by a running router, and a real Prometheus scrapes the compose
topology, evaluates the rules and fires an alert on a real fault
(tests/server/test_deploy_monitoring.py: the files read)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from router.server.config import load_settings
from tests.monitoring import (
    PROMETHEUS_DIR,
    check_one_backend_down,
    is_backend_down,
    panel_answers,
    prometheus_config,
    rules,
)
from tests.prometheus_server import PROMETHEUS, PROMTOOL, receive_alerts, run_prometheus
from tests.server.support import used_metrics
from tests.support import WAIT
from tests.topology import Topology, router_config_file, run_compose_topology

#: series Prometheus makes itself for every target
SYNTHETIC = {"up"}

needs_promtool = pytest.mark.skipif(
    PROMTOOL is None,
    reason="promtool not installed (Debian package prometheus; .ci/run installs it)",
)
needs_prometheus = pytest.mark.skipif(
    PROMETHEUS is None,
    reason="prometheus not installed (Debian package prometheus; .ci/run installs it)",
)


# -- promtool -----------------------------------------------------------------------------------


async def _promtool(*args: str) -> tuple[int, str]:
    assert PROMTOOL is not None
    process = await asyncio.create_subprocess_exec(
        PROMTOOL, *args, cwd=PROMETHEUS_DIR,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    async with asyncio.timeout(30):
        output, _ = await process.communicate()
    assert process.returncode is not None
    return process.returncode, output.decode()


@needs_promtool
async def test_promtool_checks_the_rules() -> None:
    returncode, output = await _promtool("check", "rules", "alerts.yml")
    assert returncode == 0, output
    assert f"SUCCESS: {len(rules())} rules found" in output


@needs_promtool
async def test_promtool_unit_tests_pass() -> None:
    returncode, output = await _promtool("test", "rules", "alerts_test.yml")
    assert returncode == 0, output
    assert "SUCCESS" in output


# -- against a running router -------------------------------------------------------------------


def exported_names(exposition: str) -> set[str]:
    """Every sample name the exposition's families can carry, whether or not a labelled
    family has a sample yet (a counter of locates shows none before the first locate)."""
    suffixes = {
        "counter": ("_total",),
        "histogram": ("_bucket", "_sum", "_count"),
        "summary": ("", "_sum", "_count"),
    }
    names: set[str] = set()
    for family in text_string_to_metric_families(exposition):
        names.update(family.name + suffix for suffix in suffixes.get(family.type, ("",)))
    return names


async def _scrape(topology: Topology) -> str:
    async with aiohttp.ClientSession() as http, asyncio.timeout(WAIT):
        async with http.get(f"{topology.base}/metrics") as response:
            assert response.status == 200
            return await response.text()


async def test_every_metric_of_the_rules_and_dashboard_is_exported(tmp_path: Path) -> None:
    async with run_compose_topology(tmp_path) as topology:
        exposition = await _scrape(topology)
    exported = exported_names(exposition) | SYNTHETIC
    uses = used_metrics()
    missing = {name: sorted(where) for name, where in uses.items() if name not in exported}
    assert not missing, f"used but not exported by the router: {missing}"
    assert len(uses) >= 20  # the extraction found the metrics, not just a few words
    limit = load_settings(router_config_file()).router.max_connections
    assert f"acp_router_max_connections {float(limit)}" in exposition


# -- a real Prometheus --------------------------------------------------------------------------


@needs_prometheus
@pytest.mark.timeout(120)  # four processes and Prometheus on a shared 2-core machine
async def test_prometheus_scrapes_the_router_and_fires_an_alert(tmp_path: Path) -> None:
    async with run_compose_topology(tmp_path) as topology, receive_alerts() as alertmanager:
        config = prometheus_config(topology.address, alertmanager.url, tmp_path)
        async with run_prometheus(config, tmp_path) as prometheus:
            stopped = topology.agents[-1]
            assert await stopped.stop() == 0  # a real fault: one agent goes away
            # Prometheus re-sends a firing alert after each evaluation of its group (resend
            # delay 1 s): the second notice comes after a whole evaluation of every rule.
            down = await alertmanager.wait_for(is_backend_down, count=2)
            [up] = (await prometheus.api("query", query='up{job="acp-router"}'))["result"]
            groups = (await prometheus.api("rules"))["groups"]
            answers = await panel_answers(prometheus)
    assert up["metric"]["instance"] == topology.address
    assert up["value"][1] == "1"
    assert {alert["labels"]["backend"] for alert in down} == {stopped.agent_id}
    assert down[0]["labels"]["instance"] == topology.address
    assert down[0]["labels"]["severity"] == "warning"
    # the backend panel shows all three
    backend_up = check_one_backend_down(stopped.agent_id, alertmanager.received, groups, answers)
    assert backend_up == {"agent-1": "1", "agent-2": "1", "agent-3": "0"}
