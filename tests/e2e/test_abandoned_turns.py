"""A prompt turn whose client is gone is cancelled on its backend (docs/configuration.md: Abandoned turns).

Real routers (in this process, and ``acp-router serve`` subprocesses stopped by SIGTERM),
real reference agents, real sockets: a client drops mid-turn, or the router stops
mid-turn, and the session's next prompt, sent again after a resume, is answered rather
than refused because the abandoned turn still runs. A scripted backend, which never
ends a turn by itself, shows what the router sends it: one ``session/cancel`` for the
session, and none while another client connection of the router holds the session.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.fleet import ScriptedBackend, backends_of, start_fleet, start_router, start_scripted
from tests.relay import start_relay
from tests.support import WAIT, AcpClient, CliProcess, JsonObject, run_cli

CWD = "/work/project"
#: frames the client queues on a link the backend does not read: more than the socket
#: buffers between the router and a held relay hold (a few MiB), each under the scripted
#: backend's frame limit (1 MiB)
PADS, PAD_CHARS = 12, 800_000
#: the issue's promise: the prompt sent again is answered this soon
RETRY_WITHIN = 2.0


def dropped(client: AcpClient) -> None:
    """Cut the client's connection as a crash or a network fault does: no close frame."""
    client.ws.transport.abort()


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


# -- what the backend is sent ------------------------------------------------------------------


async def active(session_id: str) -> dict[str, Any] | None:
    return {"status": "active"}


@contextlib.asynccontextmanager
async def turns_never_end() -> AsyncIterator[ScriptedBackend]:
    """A backend that has every session active, resumes it, and never answers a prompt
    (its turn runs until it is cancelled, and a cancel ends nothing)."""
    async with start_scripted("agent-1", active) as backend:
        backend.scripted["session/prompt"] = []
        yield backend


def cancels(backend: ScriptedBackend) -> list[dict[str, Any]]:
    return [m for m in backend.received if m.get("method") == "session/cancel"]


def prompts_in(backend: ScriptedBackend) -> list[dict[str, Any]]:
    return [m for m in backend.received if m.get("method") == "session/prompt"]


async def prompting(client: AcpClient, backend: ScriptedBackend) -> asyncio.Task[JsonObject]:
    """Resume ``s1`` over ``client`` and prompt it; the prompt's answer to come, once the
    backend has the prompt."""
    await client.initialize()
    resumed = await client.request("session/resume", {"sessionId": "s1", "cwd": CWD})
    assert "result" in resumed, resumed
    prompts = len(prompts_in(backend))
    turn = asyncio.create_task(client.prompt("s1", "hello", timeout=WAIT * 3))
    async with asyncio.timeout(WAIT):
        await backend.until(lambda: len(prompts_in(backend)) > prompts)
    return turn


async def test_the_backend_gets_one_cancel_when_the_prompting_client_drops() -> None:
    async with turns_never_end() as backend, start_router([("agent-1", backend.url)]) as router:
        async with AcpClient.connect(router.url) as client:
            turn = await prompting(client, backend)
            dropped(client)
            with pytest.raises(ConnectionError):
                await turn
        async with asyncio.timeout(WAIT):
            await backend.until(lambda: bool(cancels(backend)))
        await router.wait_pinned({})  # the link is closed: nothing more comes on it
        (cancel,) = cancels(backend)
        assert cancel == {
            "jsonrpc": "2.0",
            "method": "session/cancel",
            "params": {"sessionId": "s1"},
        }


async def test_the_cancel_leaves_after_what_was_queued_before_the_link_closes() -> None:
    """A backend slow to read: the link still has frames queued when the client drops,
    and its cancel goes out behind them, before the link closes."""
    async with (
        turns_never_end() as backend,
        start_relay(backend.url) as relay,
        start_router([("agent-1", relay.url)]) as router,
    ):
        async with AcpClient.connect(router.url) as client:
            turn = await prompting(client, backend)
            relay.hold()
            for _ in range(PADS):  # more than the sockets between hold: the link queues
                await client.notify("_test/pad", {"pad": "x" * PAD_CHARS})
            # answered by the router itself after it has read (and queued) every pad
            refused = await client.request("_test/ping", request_id="acp-router:ping")
            assert refused["error"]["code"] == -32600, refused
            dropped(client)
            with pytest.raises(ConnectionError):
                await turn
        await router.wait_detached()  # the cancel is queued now, behind the pads
        relay.release()
        async with asyncio.timeout(WAIT):
            await backend.until(lambda: bool(cancels(backend)))
        await router.wait_pinned({})
        pads = [m for m in backend.received if m.get("method") == "_test/pad"]
        assert len(pads) == PADS
        assert backend.received[-1] == cancels(backend)[0]  # the last frame on the link


async def test_no_cancel_while_another_client_connection_holds_the_session() -> None:
    async with turns_never_end() as backend, start_router([("agent-1", backend.url)]) as router:
        async with AcpClient.connect(router.url) as watching:
            async with AcpClient.connect(router.url) as prompter:
                first = await prompting(prompter, backend)
                second = await prompting(watching, backend)  # s1 held here too
                dropped(prompter)
                with pytest.raises(ConnectionError):
                    await first
            await router.wait_pinned({"agent-1": 1})  # the prompter's link is closed
            assert cancels(backend) == []
            dropped(watching)  # the last holder goes, its own prompt unanswered
            with pytest.raises(ConnectionError):
                await second
        async with asyncio.timeout(WAIT):
            await backend.until(lambda: bool(cancels(backend)))
        await router.wait_pinned({})
        (cancel,) = cancels(backend)
        assert cancel["params"] == {"sessionId": "s1"}


async def test_no_cancel_with_the_setting_off() -> None:
    async with (
        turns_never_end() as backend,
        start_router(
            [("agent-1", backend.url)], router={"cancel_abandoned_turns": False}
        ) as router,
    ):
        async with AcpClient.connect(router.url) as client:
            turn = await prompting(client, backend)
            dropped(client)
            with pytest.raises(ConnectionError):
                await turn
        await router.wait_pinned({})
        assert cancels(backend) == []


# -- the router stopping ---------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def serve_config(path: Path, port: int, backends: list[tuple[str, str]]) -> Path:
    tables = "".join(f'[[backends]]\nid = "{b}"\nurl = "{url}"\n' for b, url in backends)
    path.write_text(f'[router]\nlisten = "127.0.0.1:{port}"\ndrain_seconds = 0.0\n{tables}')
    return path


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
        config = serve_config(tmp_path / "router.toml", port, backends)
        async with serving(config, backends) as router:
            async with AcpClient.connect(f"ws://127.0.0.1:{port}/acp") as client:
                turn = await prompting(client, backend)
                await stopped(router)
                assert (await turn)["error"]["code"] == -32013
        (cancel,) = cancels(backend)  # sent, and received, before the router exited
        assert cancel["params"] == {"sessionId": "s1"}
        assert "cancelled the turn of session s1 on backend agent-1" in router.stderr.text


async def test_after_a_stop_mid_turn_the_next_router_answers_the_prompt(tmp_path: Path) -> None:
    async with start_fleet(tmp_path / "store", 1) as agents:
        backends = backends_of(agents)
        port = free_port()
        url = f"ws://127.0.0.1:{port}/acp"
        config = serve_config(tmp_path / "router.toml", port, backends)
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
