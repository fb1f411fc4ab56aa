"""Stopping the router as an operator does: real ``acp-router serve`` processes, real signals.

SIGTERM drains (``/readyz`` 503, no new clients) for ``drain_seconds``, then closes the
clients with 1012, spread over ``close_spread_seconds``; a second SIGTERM cuts that short.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
import time
from pathlib import Path

import aiohttp
import pytest

from tests.fleet import start_fleet
from tests.support import WAIT, AcpClient, CliProcess, JsonObject, run_cli
from tests.test_cli import wait_backends_up, write_config

SERVICE_RESTART = 1012


async def closed_at(client: AcpClient) -> float:
    """When the router closed ``client``, after checking it closed with 1012."""
    async with asyncio.timeout(WAIT):
        await client.ws.wait_closed()
    assert client.ws.close_code == SERVICE_RESTART, client.ws.close_code
    return time.monotonic()


def router_url(serve: CliProcess) -> str:
    return serve.first_line.removeprefix("acp-router listening on ")


async def test_with_nothing_in_flight_sigterm_stops_at_once_and_says_so(tmp_path: Path) -> None:
    async with start_fleet(tmp_path / "store", 1) as agents:
        config = write_config(tmp_path / "router.toml", 'listen = "127.0.0.1:0"', agents)
        async with run_cli("serve", "--config", str(config)) as router:
            await wait_backends_up(router, agents)
            router.process.send_signal(signal.SIGTERM)
            # generous: it takes a few hundredths of a second (issue 26: it took 1.6 s)
            async with asyncio.timeout(WAIT / 2):
                assert await router.process.wait() == 0
            assert await router.stop() == 0  # the logs read to their end
        last = router.stderr.lines[-2:]
        assert last[0].rstrip().endswith("router.server.shutdown: stopping"), last
        assert last[1].rstrip().endswith("router.server.serving: stopped"), last


#: a process whose event loop gets SIGTERM just after it puts SIGTERM's default action
#: back, as a stop signal that comes while the router lets go of its handlers does
LATE_SIGNAL = """
import asyncio, os, signal
from router.server.shutdown import StopSignals

class LateSignalLoop(asyncio.SelectorEventLoop):
    def remove_signal_handler(self, sig):
        removed = super().remove_signal_handler(sig)
        if sig == signal.SIGTERM:
            os.kill(os.getpid(), signal.SIGTERM)
        return removed

async def main():
    signals = StopSignals()
    with signals.installed():
        os.kill(os.getpid(), signal.SIGTERM)
        await signals.stop.wait()
    print("stopped", flush=True)

with asyncio.Runner(loop_factory=LateSignalLoop) as runner:
    runner.run(main())
"""


async def test_a_signal_while_the_handlers_are_let_go_does_not_kill_a_stopping_process() -> None:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-c", LATE_SIGNAL, stdout=asyncio.subprocess.PIPE
    )
    async with asyncio.timeout(WAIT):
        output, _ = await process.communicate()
    assert (process.returncode, output) == (0, b"stopped\n")  # on the old code: -15, b""


async def test_sigterm_closes_clients_one_by_one_over_the_spread_window(tmp_path: Path) -> None:
    window = 1.5
    async with start_fleet(tmp_path / "store", 1) as agents:
        config = write_config(
            tmp_path / "router.toml",
            f'listen = "127.0.0.1:0"\ndrain_seconds = 0.0\nclose_spread_seconds = {window}',
            agents,
        )
        async with run_cli("serve", "--config", str(config)) as router:
            await wait_backends_up(router, agents)
            url = router_url(router)
            async with (
                AcpClient.connect(url) as first,
                AcpClient.connect(url) as second,
                AcpClient.connect(url) as third,
            ):
                clients = (first, second, third)
                for client in clients:
                    await client.initialize()
                router.process.send_signal(signal.SIGTERM)
                times = sorted(await asyncio.gather(*(closed_at(c) for c in clients)))
                # three clients over 1.5 s: one at once, then one every 0.5 s
                assert times[-1] - times[0] >= window * 2 / 3 * 0.9, times
            # another SIGTERM while it exits (as stop() sends) still ends in a clean exit
            assert await router.stop() == 0
        assert "Traceback" not in router.stderr.text, router.stderr.text


async def test_a_second_sigterm_cuts_the_drain_short(tmp_path: Path) -> None:
    async with start_fleet(tmp_path / "store", 1) as agents:
        config = write_config(
            tmp_path / "router.toml", 'listen = "127.0.0.1:0"\ndrain_seconds = 600.0', agents
        )
        async with run_cli("serve", "--config", str(config)) as router:
            await wait_backends_up(router, agents)
            url = router_url(router)
            base = url.removesuffix("/acp").replace("ws://", "http://")
            async with AcpClient.connect(url) as client:
                await client.initialize()
                router.process.send_signal(signal.SIGTERM)
                await router.wait_for_log("draining for 600.0 s")
                async with aiohttp.ClientSession() as http:
                    async with http.get(f"{base}/readyz") as ready:
                        assert ready.status == 503
                    # no new clients while draining, on either profile of the transport
                    with pytest.raises(aiohttp.WSServerHandshakeError) as upgrade:
                        await http.ws_connect(url)
                    assert upgrade.value.status == 503
                    initialize = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {}}
                    async with http.post(f"{base}/acp", json=initialize) as refused:
                        assert refused.status == 503
                # still connected and served while the replica drains
                assert (await client.request("session/list", {})).get("result") is not None
                router.process.send_signal(signal.SIGTERM)
                await closed_at(client)
            async with asyncio.timeout(WAIT):  # far less than the 600 s drain
                assert await router.process.wait() == 0
        assert "second stop signal" in router.stderr.text
        assert "Traceback" not in router.stderr.text, router.stderr.text


async def _turn_running(
    client: AcpClient, session_id: str, seconds: int
) -> asyncio.Task[JsonObject]:
    """A ``/slow`` turn on ``session_id``, once it is streaming."""
    turn = asyncio.create_task(client.prompt(session_id, f"/slow {seconds}", timeout=WAIT * 3))
    await client.next_incoming()
    return turn


async def test_a_stop_answers_every_request_in_flight_before_closing(tmp_path: Path) -> None:
    async with start_fleet(tmp_path / "store", 2) as agents:
        config = write_config(
            tmp_path / "router.toml", 'listen = "127.0.0.1:0"\ndrain_seconds = 0.0', agents
        )
        async with run_cli("serve", "--config", str(config)) as router:
            await wait_backends_up(router, agents)
            url = router_url(router)
            async with contextlib.AsyncExitStack() as stack:
                clients = [
                    await stack.enter_async_context(AcpClient.connect(url)) for _ in range(5)
                ]
                turns = []
                for client in clients:
                    await client.initialize()
                    turns.append(await _turn_running(client, await client.new_session(), 60))
                router.process.send_signal(signal.SIGTERM)
                # five answers (on the old main: none, and the editors waited forever) ...
                for turn in turns:
                    answer = await turn
                    assert answer["error"]["code"] == -32013, answer
                    assert answer["error"]["data"]["retryable"] is True
                    assert answer["error"]["data"]["reason"] == "the router is stopping"
                # ... then five 1012 closes
                await asyncio.gather(*(closed_at(client) for client in clients))
            assert await router.stop() == 0
        assert "Traceback" not in router.stderr.text, router.stderr.text


async def test_a_turn_that_finishes_within_the_drain_finishes(tmp_path: Path) -> None:
    async with start_fleet(tmp_path / "store", 1) as agents:
        config = write_config(
            tmp_path / "router.toml", 'listen = "127.0.0.1:0"\ndrain_seconds = 3.0', agents
        )
        async with run_cli("serve", "--config", str(config)) as router:
            await wait_backends_up(router, agents)
            url = router_url(router)
            async with AcpClient.connect(url) as short, AcpClient.connect(url) as long:
                await short.initialize()
                await long.initialize()
                quick = await _turn_running(short, await short.new_session(), 1)
                slow = await _turn_running(long, await long.new_session(), 60)
                router.process.send_signal(signal.SIGTERM)
                await router.wait_for_log("draining for 3.0 s")
                assert (await quick).get("result") == {"stopReason": "end_turn"}
                cut = await slow
                assert cut["error"]["data"]["reason"] == "the router is stopping", cut
                await asyncio.gather(closed_at(short), closed_at(long))
            assert await router.stop() == 0
