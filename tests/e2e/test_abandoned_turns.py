"""A prompt turn whose client is gone is cancelled on its backend (docs/configuration.md: Abandoned turns).

Real routers (in this process, and ``acp-router serve`` subprocesses stopped by SIGTERM),
real reference agents, real sockets: a client drops mid-turn, or the router stops
mid-turn, and the session's next prompt, sent again after a resume, is answered rather
than refused because the abandoned turn still runs (tests/server/test_abandoned_turns.py:
what a scripted backend is sent).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.e2e.support import write_config
from tests.fleet import backends_of, start_fleet, start_router
from tests.server.support import cancels, dropped, prompting, turns_never_end
from tests.support import CWD, WAIT, AcpClient, CliProcess, JsonObject, free_port, run_cli

#: the issue's promise: the prompt sent again is answered this soon
RETRY_WITHIN = 2.0


async def turn_running(client: AcpClient, session_id: str, text: str) -> asyncio.Task[JsonObject]:
    """A prompt turn of ``session_id`` under way: ``text`` sent and its first update in."""
    turn = asyncio.create_task(client.prompt(session_id, text, timeout=WAIT * 3))
    await client.next_incoming()
    return turn


async def resumed_and_answered(url: str, session_id: str) -> JsonObject:
    """A new client connection resumes ``session_id`` and prompts it: the answer."""
    async with AcpClient.connect(url) as client:
        await client.initialize()
        resumed = await client.request("session/resume", {"sessionId": session_id, "cwd": CWD})
        assert "result" in resumed, resumed
        return await client.prompt(session_id, "hello")


async def test_a_client_that_drops_mid_turn_leaves_no_turn_running(tmp_path: Path) -> None:
    async with (
        start_fleet(tmp_path / "store", 1) as agents,
        start_router(backends_of(agents)) as router,
    ):
        async with AcpClient.connect(router.url) as first:
            await first.initialize()
            session_id = await first.new_session(CWD)
            turn = await turn_running(first, session_id, "/slow 30")
            dropped(first)
            with pytest.raises(ConnectionError):
                await turn
        async with asyncio.timeout(RETRY_WITHIN):
            await router.wait_detached()  # the router saw the client go
            answer = await resumed_and_answered(router.url, session_id)
        # on the old main: -32602 "already has a prompt turn running", for 30 s
        assert answer.get("result") == {"stopReason": "end_turn"}, answer
        assert router.metric("acp_router_turns_cancelled_total", reason="client_gone") == 1


# -- the router stopping ---------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def serving(config: Path, backends: list[tuple[str, str]]) -> AsyncIterator[CliProcess]:
    async with run_cli("serve", "--config", str(config)) as router:
        for backend, _ in backends:
            await router.wait_for_log(f"backend {backend} is up")
        yield router


async def stopped(router: CliProcess) -> None:
    """SIGTERM, then wait for a clean exit."""
    router.process.send_signal(signal.SIGTERM)
    async with asyncio.timeout(WAIT):
        assert await router.process.wait() == 0
    assert "Traceback" not in router.stderr.text, router.stderr.text


async def test_a_router_stopped_mid_turn_cancels_it_on_the_backend(tmp_path: Path) -> None:
    async with turns_never_end() as backend:
        backends = [("agent-1", backend.url)]
        port = free_port()
        config = write_config(
            tmp_path / "router.toml", backends, f'listen = "127.0.0.1:{port}"\ndrain_seconds = 0.0'
        )
        async with serving(config, backends) as router:
            async with AcpClient.connect(f"ws://127.0.0.1:{port}/acp") as client:
                turn = await prompting(client, backend)
                await stopped(router)
                assert (await turn)["error"]["code"] == -32013
        (cancel,) = cancels(backend)  # sent, and received, before the router exited
        assert cancel["params"] == {"sessionId": "s1"}
        assert "cancelled the turn of session s1 on backend agent-1" in router.stderr.text


async def test_a_router_stopped_mid_turn_cancels_a_turn_two_connections_hold(
    tmp_path: Path,
) -> None:
    """Every connection closes with the router: the other holder does not keep the turn
    (before, neither connection cancelled it, and it ran on)."""
    async with turns_never_end() as backend:
        backends = [("agent-1", backend.url)]
        port = free_port()
        config = write_config(
            tmp_path / "router.toml", backends, f'listen = "127.0.0.1:{port}"\ndrain_seconds = 0.0'
        )
        url = f"ws://127.0.0.1:{port}/acp"
        async with serving(config, backends) as router:
            async with AcpClient.connect(url) as prompter, AcpClient.connect(url) as watching:
                turn = await prompting(prompter, backend)
                await watching.initialize()
                held = await watching.request("session/resume", {"sessionId": "s1", "cwd": CWD})
                assert "result" in held, held
                await stopped(router)
                assert (await turn)["error"]["code"] == -32013
        (cancel,) = cancels(backend)  # sent, and received, before the router exited
        assert cancel["params"] == {"sessionId": "s1"}


async def test_after_a_stop_mid_turn_the_next_router_answers_the_prompt(tmp_path: Path) -> None:
    async with start_fleet(tmp_path / "store", 1) as agents:
        backends = backends_of(agents)
        port = free_port()
        url = f"ws://127.0.0.1:{port}/acp"
        config = write_config(
            tmp_path / "router.toml", backends, f'listen = "127.0.0.1:{port}"\ndrain_seconds = 0.0'
        )
        async with serving(config, backends) as router:
            async with AcpClient.connect(url) as client:
                await client.initialize()
                session_id = await client.new_session(CWD)
                turn = await turn_running(client, session_id, "/slow 30")
                await stopped(router)
                cut = await turn
                assert cut["error"]["code"] == -32013, cut
        async with serving(config, backends):  # the same port: the client comes back there
            async with asyncio.timeout(RETRY_WITHIN):
                answer = await resumed_and_answered(url, session_id)
        # on the old main: -32602 "already has a prompt turn running", for 30 s
        assert answer.get("result") == {"stopReason": "end_turn"}, answer
