"""deploy/prometheus and deploy/grafana, read: the metric names of every rule, panel and
variable, a unit test for every alert both ways, and every alert in the docs
(tests/e2e/test_deploy_monitoring.py: promtool, a running router, a real Prometheus)."""

from __future__ import annotations

import re

import yaml

from tests.monitoring import PROMETHEUS_DIR, rules
from tests.server.support import metric_names
from tests.topology import REPO

# -- reading the expressions --------------------------------------------------------------------


def test_metric_names_are_read_from_promql() -> None:
    expression = (
        'sum by (job, le) (rate(acp_router_x_bucket{backend=~"a|b", instance=~"$instance"}[5m]))'
        " / on (job) group_left sum(acp_router_y) > bool 0.5 and $__all unless up offset 1m"
    )
    assert metric_names(expression) == {"acp_router_x_bucket", "acp_router_y", "up"}


# -- the alerts ---------------------------------------------------------------------------------


def test_every_alert_has_a_unit_test_that_fires_it_and_one_that_does_not() -> None:
    tests = yaml.safe_load((PROMETHEUS_DIR / "alerts_test.yml").read_text())
    assert tests["rule_files"] == ["alerts.yml"]
    cases = [case for test in tests["tests"] for case in test["alert_rule_test"]]
    for rule in rules():
        outcomes = {bool(c["exp_alerts"]) for c in cases if c["alertname"] == rule["alert"]}
        assert outcomes == {True, False}, rule["alert"]
        assert rule["annotations"]["summary"], rule["alert"]
        assert rule["labels"]["severity"] in ("warning", "critical"), rule["alert"]


def test_the_docs_list_every_alert() -> None:
    docs = (REPO / "docs" / "operations.md").read_text()
    listed = set(re.findall(r"^\| `(AcpRouter\w+)` \|", docs, flags=re.MULTILINE))
    assert listed == {rule["alert"] for rule in rules()}
