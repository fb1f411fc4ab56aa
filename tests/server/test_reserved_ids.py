"""The router's own request ids (``acp-router:...``) are reserved everywhere: a client may
not use one in a request, nor name one in a ``$/cancel_request`` (README: the errors the
router answers). A real router and a scripted backend that records every frame: a
failover's resume is in flight, and a client tries to cancel it.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from tests.fleet import CLOSE, ScriptedBackend, active, start_router, start_scripted
from tests.support import CWD, WAIT, AcpClient

FAILOVER = "acp-router:failover:"


def failover_resumes(backend: ScriptedBackend) -> list[dict[str, Any]]:
    return [
        m
        for m in backend.received
        if m.get("method") == "session/resume" and str(m.get("id")).startswith(FAILOVER)
    ]


def cancel_requests(backend: ScriptedBackend) -> list[dict[str, Any]]:
    return [m for m in backend.received if m.get("method") == "$/cancel_request"]


async def test_a_cancel_naming_a_failovers_resume_is_refused_and_never_forwarded() -> None:
    async with (
        start_scripted("agent-1", active) as backend,
        start_router([("agent-1", backend.url)], failover={"enabled": True}) as router,
        AcpClient.connect(router.url) as client,
    ):
        await client.initialize()
        resumed = await client.request("session/resume", {"sessionId": "s1", "cwd": CWD})
        assert resumed.get("result") == {}, resumed
        # the client's link breaks on its next prompt; the failover's resume then waits
        # for the test, so it is in flight
        backend.scripted["session/prompt"] = [CLOSE]
        backend.held["session/resume"] = release = asyncio.Event()
        lost = await client.prompt("s1", "hello")
        assert lost["error"]["code"] == -32013, lost
        async with asyncio.timeout(WAIT):
            await backend.until(lambda: bool(failover_resumes(backend)))
        (resume,) = failover_resumes(backend)
        params = {"requestId": resume["id"]}
        cancel = {"jsonrpc": "2.0", "method": "$/cancel_request", "params": params}
        refused = asyncio.create_task(client.send_raw(json.dumps(cancel), expect_id=None))
        forwarded = asyncio.create_task(backend.until(lambda: bool(cancel_requests(backend))))
        done, _ = await asyncio.wait({refused, forwarded}, return_when=asyncio.FIRST_COMPLETED)
        forwarded.cancel()
        await asyncio.gather(forwarded, return_exceptions=True)
        assert refused in done, cancel_requests(backend)  # on the code before: forwarded
        error = (await refused)["error"]
        assert error["code"] == -32600, error
        assert "reserved" in error["message"], error
        # the failover ends as it would have: the session's next frame, held behind its
        # resume, goes to the backend on the same link, after anything sent before it
        await client.notify("session/cancel", {"sessionId": "s1"})
        release.set()
        async with asyncio.timeout(WAIT):
            await backend.until(
                lambda: any(m.get("method") == "session/cancel" for m in backend.received)
            )
        assert cancel_requests(backend) == []
        assert router.metric("acp_router_failovers_total", result="ok") == 1
