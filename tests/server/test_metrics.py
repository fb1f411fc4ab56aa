"""The /metrics exposition follows the Prometheus naming rules the dashboard relies on, and
the metrics table of docs/operations.md says what each family's HELP says
(tests/e2e/test_metrics.py: a running router serves those families)."""

from __future__ import annotations

from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.parser import text_string_to_metric_families

from router.server.observability.metrics import (
    LATENCY_BUCKETS,
    TO_BACKEND,
    TO_CLIENT,
    WORKER_LABEL,
    WORKER_UP,
    WORKER_UP_HELP,
    Metrics,
)
from tests.server.support import documented_metrics

FORBIDDEN_LABELS = {"session", "session_id", "sessionId", "client", "request_id"}


def exposed() -> list[tuple[str, str, list[tuple[str, dict[str, str], float]]]]:
    metrics = Metrics()
    metrics.declare_backends(["agent-1", "agent-2"])
    metrics.count_frame(TO_BACKEND, "{}")
    metrics.count_frame(TO_CLIENT, '{"é":1}')
    metrics.locate_duration.labels("active").observe(0.0002)
    metrics.probe_duration.labels("agent-1").observe(0.0002)
    text = metrics.exposition().decode()
    return [
        (family.name, family.type, [(s.name, s.labels, s.value) for s in family.samples])
        for family in text_string_to_metric_families(text)
    ]


def test_router_families_follow_the_naming_rules() -> None:
    families = [f for f in exposed() if f[0].startswith("acp_router_")]
    assert len(families) >= 15
    for name, kind, samples in families:
        if kind == "counter":
            assert all(s[0].endswith("_total") for s in samples), name
        else:
            assert not name.endswith("_total"), name
        for _, labels, _ in samples:
            assert not FORBIDDEN_LABELS & set(labels), (name, labels)


def test_latency_histograms_resolve_sub_millisecond_times() -> None:
    assert LATENCY_BUCKETS[0] <= 0.0001
    families = {name: samples for name, _, samples in exposed()}
    buckets = [
        s
        for s in families["acp_router_probe_duration_seconds"]
        if s[0].endswith("_bucket") and s[1]["le"] == "0.00025"
    ]
    assert buckets[0][2] == 1.0  # a 200 us probe lands below 250 us, not in a 5 ms bucket


def test_bytes_are_counted_in_utf8() -> None:
    families = {name: samples for name, _, samples in exposed()}
    sent = {s[1]["direction"]: s[2] for s in families["acp_router_message_bytes"]}
    assert sent == {TO_BACKEND: 2.0, TO_CLIENT: 8.0}


def test_frames_counted_between_readings_are_all_in_the_next_reading() -> None:
    metrics = Metrics()

    def frames() -> dict[str, float]:
        text = metrics.exposition().decode()
        families = {f.name: f.samples for f in text_string_to_metric_families(text)}
        return {
            s.labels["direction"]: s.value
            for s in families["acp_router_messages"]
            if s.name.endswith("_total")
        }

    assert frames() == {TO_BACKEND: 0.0, TO_CLIENT: 0.0}  # both series from the start
    for _ in range(3):
        metrics.count_frame(TO_CLIENT, "{}")
    assert frames() == {TO_BACKEND: 0.0, TO_CLIENT: 3.0}
    assert frames() == {TO_BACKEND: 0.0, TO_CLIENT: 3.0}  # a reading adds nothing twice
    metrics.count_frame(TO_BACKEND, "{}")
    metrics.count_frame(TO_CLIENT, "{}")
    assert frames() == {TO_BACKEND: 1.0, TO_CLIENT: 4.0}


def test_backends_are_declared_up_front() -> None:
    families = {name: samples for name, _, samples in exposed()}
    up = {s[1]["backend"]: s[2] for s in families["acp_router_backend_up"]}
    assert up == {"agent-1": 0.0, "agent-2": 0.0}


# -- the documented table --------------------------------------------------------------------------


def router_metrics() -> dict[str, tuple[tuple[str, ...], str]]:
    """Every acp_router_ family a router exports, and the one the scrape of a router with
    workers adds: its name as queried (counters with ``_total``), its label names and its
    HELP."""
    metrics = Metrics()
    metrics.watch_cache(lambda: 0)
    labels = {
        metric._name: tuple(metric._labelnames)
        for metric in vars(metrics).values()
        if isinstance(metric, MetricWrapperBase)
    }
    found: dict[str, tuple[tuple[str, ...], str]] = {WORKER_UP: ((WORKER_LABEL,), WORKER_UP_HELP)}
    for family in metrics.registry.collect():
        if family.name.startswith("acp_router_"):
            name = family.name + ("_total" if family.type == "counter" else "")
            found[name] = (labels.get(family.name, ()), family.documentation)
    return found


def test_the_docs_list_every_metric_with_its_help_text() -> None:
    documented, exported = documented_metrics(), router_metrics()
    assert len(exported) >= 25
    assert sorted(documented) == sorted(exported), "the table and the router's metrics"
    for name, (labels, help_text) in exported.items():
        assert documented[name][1] == help_text, f"{name}: the table and the HELP text differ"
        assert documented[name][0] == labels, f"{name}: the table and the labels differ"
