"""The router's log, as an operator reads it: ``--log-format json`` and no access log."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aiohttp

from tests.fleet import start_fleet
from tests.support import AcpClient, run_cli
from tests.test_cli import wait_backends_up, write_config

SECRET = "the prompt text must never reach a log line"


def json_lines(text: str) -> list[dict[str, Any]]:
    """Every stderr line, each of which must be one JSON object."""
    records = [json.loads(line) for line in text.splitlines() if line.strip()]
    assert all(isinstance(record, dict) for record in records)
    return records


async def test_json_logs_say_which_connection_backend_and_outcome(tmp_path: Path) -> None:
    async with start_fleet(tmp_path / "store", 1) as agents:
        config = write_config(tmp_path / "router.toml", 'listen = "127.0.0.1:0"', agents)
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
