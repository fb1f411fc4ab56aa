"""The dashboard and the alert rules on a router with two workers: a real Prometheus
scrapes the compose topology run with ``workers = 2`` (every series with a ``worker``
label), every panel's query answers, the per-backend panel shows each backend once, and
a stopped agent fires ``AcpRouterBackendDown`` for that backend alone."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.monitoring import (
    check_one_backend_down,
    is_backend_down,
    panel_answers,
    prometheus_config,
)
from tests.prometheus_server import PROMETHEUS, receive_alerts, run_prometheus
from tests.support import run_cli
from tests.topology import (
    Topology,
    agent_services,
    command_of,
    compose,
    localized_config,
    start_compose_agent,
    with_option,
)


@contextlib.asynccontextmanager
async def compose_topology_with_workers(workdir: Path) -> AsyncIterator[Topology]:
    """The compose topology (tests/topology.py), its router with two workers."""
    store = workdir / "store"
    store.mkdir()
    async with contextlib.AsyncExitStack() as stack:
        agents = [
            await stack.enter_async_context(start_compose_agent(command_of(service), store))
            for service in agent_services().values()
        ]
        text = localized_config(agents)
        assert "\nworkers = 1 " in text, "config/compose.toml sets router.workers"
        config = workdir / "router.toml"
        config.write_text(text.replace("\nworkers = 1 ", "\nworkers = 2 "))
        command = with_option(command_of(compose()["services"]["router"]), "--config", str(config))
        router = await stack.enter_async_context(run_cli(*command))
        for worker in range(2):
            for agent in agents:
                up = f"backend {agent.agent_id} is up"
                await router.wait_for_log(f"worker {worker} router.server.links.control: {up}")
        url = router.first_line.removeprefix("acp-router listening on ")
        yield Topology(router, url, agents)


@pytest.mark.skipif(PROMETHEUS is None, reason="prometheus not installed (Debian package)")
@pytest.mark.timeout(120)  # five processes and Prometheus on a shared 2-core machine
async def test_dashboard_and_alerts_work_on_a_router_with_workers(tmp_path: Path) -> None:
    async with (
        compose_topology_with_workers(tmp_path) as topology,
        receive_alerts() as alertmanager,
    ):
        config = prometheus_config(topology.address, alertmanager.url, tmp_path)
        async with run_prometheus(config, tmp_path) as prometheus:
            stopped = topology.agents[-1]
            assert await stopped.stop() == 0
            # both workers' links to the stopped agent are down: one alert each, sent twice
            down = await alertmanager.wait_for(is_backend_down, count=4)
            workers = await prometheus.api("query", query="acp_router_worker_up")
            groups = (await prometheus.api("rules"))["groups"]
            answers = await panel_answers(prometheus)
        assert await topology.router.stop() == 0
    assert {sample["metric"]["worker"]: sample["value"][1] for sample in workers["result"]} == {
        "0": "1",
        "1": "1",
    }
    assert {alert["labels"]["backend"] for alert in down} == {stopped.agent_id}
    assert {alert["labels"]["worker"] for alert in down} == {"0", "1"}
    # summed over the workers, as over replicas: one line per backend, one replica
    backend_up = check_one_backend_down(stopped.agent_id, alertmanager.received, groups, answers)
    assert backend_up == {"agent-1": "1", "agent-2": "1", "agent-3": "0"}
    [replicas] = answers["Router replicas up"]["result"]
    assert replicas["value"][1] == "1"
    cpu = answers["CPU"]["result"]
    assert sorted(sample["metric"]["worker"] for sample in cpu) == ["0", "1"]
