"""deploy/prometheus and deploy/grafana, read: the metric names of every rule, panel and
variable, a unit test for every alert both ways, and every alert in the docs
(tests/e2e/test_deploy_monitoring.py: promtool, a running router, a real Prometheus)."""

from __future__ import annotations

import re
from collections.abc import Iterator

import yaml

from tests.monitoring import PROMETHEUS_DIR, dashboard, panel_expressions, rules
from tests.topology import REPO

# -- reading the expressions --------------------------------------------------------------------

_PROMQL_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and",
                 "or", "unless", "offset", "inf", "nan"}  # fmt: skip


def metric_names(expression: str) -> set[str]:
    """The metric names a PromQL expression selects (Grafana variables allowed)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expression)  # label values may look like names
    text = re.sub(r"\$\w+", "", text)
    text = re.sub(r"\{[^}]*\}|\[[^\]]*\]", "", text)  # matchers and ranges
    text = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", text)
    names = set()
    for match in re.finditer(r"(?<![\w.])[A-Za-z_:][\w:]*", text):  # not the m of 1m
        is_function = text[match.end() :].lstrip().startswith("(")
        if not is_function and match.group().lower() not in _PROMQL_WORDS:
            names.add(match.group())
    return names


def variable_expressions() -> Iterator[tuple[str, str]]:
    """(variable name, the selector of its ``label_values(selector, label)`` query)."""
    for variable in dashboard()["templating"]["list"]:
        match = re.fullmatch(r"label_values\((.*),\s*\w+\)", variable["query"]["query"])
        assert match, variable["name"]
        yield variable["name"], match.group(1)


def used_metrics() -> dict[str, set[str]]:
    """Metric name -> where it is used."""
    uses: dict[str, set[str]] = {}
    sources = [(f"rule {r['alert']}", r["expr"]) for r in rules()]
    sources += [(f"panel {t}", e) for t, e in panel_expressions()]
    sources += [(f"variable {n}", e) for n, e in variable_expressions()]
    for where, expression in sources:
        names = metric_names(expression)
        assert names, f"{where}: no metric in {expression!r}"
        for name in names:
            uses.setdefault(name, set()).add(where)
    return uses


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
