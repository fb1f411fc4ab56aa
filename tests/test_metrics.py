"""The /metrics exposition follows the Prometheus naming rules the dashboard relies on."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from router.server.metrics import LATENCY_BUCKETS, TO_BACKEND, TO_CLIENT, Metrics

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
            assert all(s[0].endswith(("_total", "_created")) for s in samples), name
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


def test_backends_are_declared_up_front() -> None:
    families = {name: samples for name, _, samples in exposed()}
    up = {s[1]["backend"]: s[2] for s in families["acp_router_backend_up"]}
    assert up == {"agent-1": 0.0, "agent-2": 0.0}
