"""Losing a backend of reference agents with probes in flight logs warnings, not errors
(tests/server/test_client_errors.py: every error the router answers, counted)."""

from __future__ import annotations

import asyncio
import gc
import logging
from pathlib import Path

import pytest

from tests.fleet import backends_of, start_fleet, start_router
from tests.support import AcpClient


async def test_losing_a_backend_logs_warnings_not_errors(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    async with (
        start_fleet(tmp_path, 2) as agents,
        start_router(backends_of(agents), probe={"timeout_ms": 200}) as router,
        AcpClient.connect(router.url) as client,
    ):
        await client.initialize()
        session_id = await client.new_session()
        # probes in flight on both control links while one backend dies outright
        statuses = [asyncio.create_task(client.status(f"sess_{n}")) for n in range(50)]
        agents[0].cli.process.kill()
        await router.wait_backends(1)
        answers = await asyncio.gather(*statuses)
        assert all(("result" in a) != ("error" in a) for a in answers)
        assert "result" in await client.status(session_id)
    gc.collect()  # a future whose failure nobody read is reported when it is collected
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
    down = [r for r in caplog.records if r.getMessage() == f"backend {agents[0].agent_id} is down"]
    assert [r.levelno for r in down] == [logging.WARNING]
