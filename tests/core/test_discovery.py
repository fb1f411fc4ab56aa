"""DNS discovery's sans-I/O part (``router.core.discovery``): backend ids and URLs from a
DNS answer (tests/e2e/test_discovery.py: a real router asking a real DNS server)."""

from __future__ import annotations

from router.core.discovery import Discovered, Found, backend_id, discovered
from router.protocol.ids import BackendId


def test_ids_come_from_the_reverse_name_else_the_address() -> None:
    assert backend_id(Found("10.0.0.7", "agent-0.agents.acp.svc.cluster.local")) == "agent-0"
    assert backend_id(Found("10.0.0.7", "agent-0.")) == "agent-0"
    assert backend_id(Found("10.0.0.7")) == "10.0.0.7"
    assert backend_id(Found("10.0.0.7", ".")) == "10.0.0.7"


def test_an_answer_is_a_set_of_backends_by_id() -> None:
    answer = [
        Found("10.0.0.8", "agent-1.agents"),
        Found("10.0.0.7", "agent-0.agents"),
        Found("10.0.0.9", "agent-0.other"),  # the same first label: known by its address
        Found("10.0.0.7", "agent-0.agents"),  # a repeat
        Found("fd00::1"),
    ]
    assert discovered(answer, scheme="ws", port=9001, path="/acp") == (
        Discovered(BackendId("10.0.0.9"), "ws://10.0.0.9:9001/acp"),
        Discovered(BackendId("agent-0"), "ws://10.0.0.7:9001/acp"),
        Discovered(BackendId("agent-1"), "ws://10.0.0.8:9001/acp"),
        Discovered(BackendId("fd00::1"), "ws://[fd00::1]:9001/acp"),
    )
