"""Stopping the router as an operator does: real ``acp-router serve`` processes, real signals.

SIGTERM drains (``/readyz`` 503, no new clients) for ``drain_seconds``, then closes the
clients with 1012, spread over ``close_spread_seconds``; a second SIGTERM cuts that short.
"""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path

import aiohttp
import pytest

from tests.fleet import start_fleet
from tests.support import WAIT, AcpClient, CliProcess, run_cli
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
