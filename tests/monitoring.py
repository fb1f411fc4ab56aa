"""The shipped monitoring (deploy/prometheus, deploy/grafana) as the tests read it, and
what a real Prometheus in front of a topology with one agent stopped must show."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from tests.prometheus_server import INTERVAL, Alert, Prometheus
from tests.topology import REPO

PROMETHEUS_DIR = REPO / "deploy" / "prometheus"
DASHBOARD = REPO / "deploy" / "grafana" / "acp-router.json"


def rules() -> list[dict[str, Any]]:
    groups = yaml.safe_load((PROMETHEUS_DIR / "alerts.yml").read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


def dashboard() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return data


def panel_expressions() -> Iterator[tuple[str, str]]:
    """(panel title, PromQL) of every panel target."""
    for panel in dashboard()["panels"]:
        for target in panel.get("targets", []):
            yield panel["title"], target["expr"]


def prometheus_config(target: str, alertmanager: str, workdir: Path) -> dict[str, Any]:
    """deploy/prometheus/prometheus.yml for a local router at ``target`` (HOST:PORT), a
    1 s interval, the rules from alerts.yml with their ``for`` holds removed (promtool's
    unit tests cover those; here the question is whether the expressions work on the
    series a real router exports), and the alerts pushed to ``alertmanager``."""
    config: dict[str, Any] = yaml.safe_load((PROMETHEUS_DIR / "prometheus.yml").read_text())
    config["global"] = {"scrape_interval": INTERVAL, "evaluation_interval": INTERVAL}
    alerts = yaml.safe_load((PROMETHEUS_DIR / "alerts.yml").read_text())
    for group in alerts["groups"]:
        for rule in group["rules"]:
            rule.pop("for", None)
    rule_file = workdir / "alerts.yml"
    rule_file.write_text(yaml.safe_dump(alerts))
    config["rule_files"] = [str(rule_file)]
    [job] = config["scrape_configs"]
    job["static_configs"] = [{"targets": [target]}]
    config["alerting"] = {
        "alertmanagers": [{"api_version": "v2", "static_configs": [{"targets": [alertmanager]}]}]
    }
    return config


def grafana_to_promql(expression: str) -> str:
    """A panel expression with Grafana's variables replaced as Grafana would."""
    for variable, value in {"$__rate_interval": "5s", "$__range": "1m"}.items():
        expression = expression.replace(variable, value)
    return re.sub(r"\$\w+", ".*", expression)


def is_backend_down(alert: Alert) -> bool:
    return bool(alert["labels"]["alertname"] == "AcpRouterBackendDown")


async def panel_answers(prometheus: Prometheus) -> dict[str, Any]:
    """Panel title -> what Prometheus answers to its query now."""
    return {
        title: await prometheus.api("query", query=grafana_to_promql(expression))
        for title, expression in panel_expressions()
    }


def check_one_backend_down(
    stopped: str, received: list[Alert], groups: list[Any], answers: dict[str, Any]
) -> dict[str, str]:
    """Assert what a stopped agent ``stopped`` must leave: only its AcpRouterBackendDown
    fired (backends that stayed up never did, nor anything that needs every backend down),
    every rule healthy, every panel's query answered on the real series. Returns the
    "Backend up" panel: backend -> value."""
    fired = {(a["labels"]["alertname"], a["labels"].get("backend")) for a in received}
    assert fired == {("AcpRouterBackendDown", stopped)}
    [group] = groups
    assert {rule["name"] for rule in group["rules"]} == {rule["alert"] for rule in rules()}
    for rule in group["rules"]:
        assert rule["health"] == "ok", rule
    assert all(answer["resultType"] == "vector" for answer in answers.values())
    return {
        sample["metric"]["backend"]: sample["value"][1]
        for sample in answers["Backend up"]["result"]
    }
