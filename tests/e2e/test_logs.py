"""The router's log, as an operator reads it: ``--log-format json`` and no access log."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aiohttp

from tests.e2e.support import wait_backends_up, write_config
from tests.fleet import start_fleet
from tests.support import AcpClient, run_cli

SECRET = "the prompt text must never reach a log line"


def json_lines(text: str) -> list[dict[str, Any]]:
    """Every stderr line, each of which must be one JSON object."""
    records = [json.loads(line) for line in text.splitlines() if line.strip()]
    assert all(isinstance(record, dict) for record in records)
    return records


async def test_json_logs_say_which_connection_backend_and_outcome(tmp_path: Path) -> None:
    async with start_fleet(tmp_path / "store", 1) as agents:
        config = write_config(tmp_path / "router.toml", agents)
        args = ("--log-format", "json", "--log-level", "DEBUG", "serve", "--config", str(config))
        async with run_cli(*args) as router:
            await wait_backends_up(router, agents)
            url = router.first_line.removeprefix("acp-router listening on ")
            base = url.removesuffix("/acp").replace("ws://", "http://")
            async with AcpClient.connect(url) as client:
                await client.initialize()
                session_id = await client.new_session("/work")
                assert (await client.prompt(session_id, SECRET)).get("result") is not None
                async with aiohttp.ClientSession() as http:
                    for path in ("/metrics", "/healthz", "/readyz"):
                        async with http.get(base + path) as response:
                            assert response.status == 200
                agents[0].cli.process.kill()
                await router.wait_for_log('"message": "link to backend agent-1 ended')
                await router.wait_for_log('"message": "backend agent-1 is down"')
            assert await router.stop() == 0

    records = json_lines(router.stderr.text)
    assert SECRET not in router.stderr.text
    assert not [r for r in records if r["logger"] == "aiohttp.access"], "access log is off"
    (ended,) = [r for r in records if r["message"].startswith("link to backend agent-1 ended")]
    assert ended["connection"] >= 1
    assert ended["backend"] == "agent-1"
    assert ended["outcome"]
    (down,) = [r for r in records if r["message"] == "backend agent-1 is down"]
    assert (down["level"], down["backend"]) == ("WARNING", "agent-1")
    assert "connection" not in down  # a control link belongs to no client connection
    for record in records:
        assert {"time", "level", "logger", "message"} <= record.keys()


async def test_the_request_log_writes_one_json_line_per_request(tmp_path: Path) -> None:
    client_trace, client_span = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
    meta = {"traceparent": f"00-{client_trace}-{client_span}-01"}
    async with start_fleet(tmp_path / "store", 1) as agents:
        config = write_config(tmp_path / "router.toml", agents, REQUEST_LOG)
        args = ("--log-format", "json", "serve", "--config", str(config))
        # no span exporter: the trace ids reach the request log all the same
        async with run_cli(*args, env={"OTEL_TRACES_EXPORTER": "none"}) as router:
            await wait_backends_up(router, agents)
            url = router.first_line.removeprefix("acp-router listening on ")
            async with AcpClient.connect(url) as client:
                await client.initialize()
                session_id = await client.new_session("/work")
                params = {"sessionId": session_id, "_meta": meta, "prompt": [_text(SECRET)]}
                assert (await client.request("session/prompt", params)).get("result")
                await router.wait_for_log('"method": "session/prompt"')
            assert await router.stop() == 0

    assert SECRET not in router.stderr.text
    lines = [r for r in json_lines(router.stderr.text) if r["logger"] == "acp_router.requests"]
    assert [line["method"] for line in lines] == ["initialize", "session/new", "session/prompt"]
    created, prompted = lines[1], lines[2]
    assert (created["session"], created["backend"], created["outcome"]) == (
        session_id,
        "agent-1",
        "result",
    )
    assert "trace_id" not in created  # it named no trace
    assert prompted["level"] == "INFO"
    assert prompted["connection"] >= 1
    assert (prompted["session"], prompted["backend"]) == (session_id, "agent-1")
    assert (prompted["outcome"], prompted["trace_id"]) == ("result", client_trace)
    assert len(prompted["span_id"]) == 16
    assert prompted["span_id"] != client_span
    assert prompted["duration_ms"] > 0
    assert prompted["message"].startswith("session/prompt result in ")


REQUEST_LOG = 'listen = "127.0.0.1:0"\nrequest_log = "on"'


def _text(text: str) -> dict[str, str]:
    return {"type": "text", "text": text}
