"""A reload that removes a token closes the connections that came with it.

A real ``acp-router serve`` subprocess with ``[auth]`` and ``[admin]`` tokens, a
scripted backend, and clients on real sockets: after ``POST /admin/reload`` (or SIGHUP)
drops a client token, its open connections are closed with 1008 within a second while
the others carry on; admin tokens reload the same way.
"""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path

from websockets.exceptions import ConnectionClosed

from tests.e2e.support import post_reload, router_url, upgrade_status, write_config
from tests.fleet import inactive, start_scripted
from tests.support import WAIT, AcpClient, run_cli


def secured(tokens: Path, admin: str) -> str:
    """The ``[auth]`` and ``[admin]`` tables: client tokens from ``tokens``, one admin token."""
    return f'[auth]\ntokens_file = "{tokens}"\n[admin]\ntokens = ["{admin}"]\n'


async def closed_with(client: AcpClient) -> tuple[int, str]:
    """The close code and reason the router ends ``client``'s connection with."""
    async with asyncio.timeout(WAIT):
        await client.ws.wait_closed()
    assert client.ws.close_code is not None
    return client.ws.close_code, client.ws.close_reason or ""


async def test_removing_a_token_closes_its_connections_and_no_other(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text("keep\ngone\n")
    config = tmp_path / "router.toml"
    async with start_scripted("a", inactive) as backend:
        write_config(config, [("a", backend.url)], extra=secured(tokens, "admin-1"))
        async with run_cli("serve", "--config", str(config)) as serve:
            url = router_url(serve)
            await serve.wait_for_log("backend a is up")
            async with (
                AcpClient.connect(url, token="keep") as kept,
                AcpClient.connect(url, token="gone") as revoked,
                AcpClient.connect(url, token="gone") as revoked_too,
            ):
                for client in (kept, revoked, revoked_too):
                    assert "result" in await client.initialize()
                    assert "result" in await client.request("session/list", {})

                tokens.write_text("keep\n")
                status, body = await post_reload(url, "admin-1")
                assert status == 200, body
                started = time.monotonic()
                closes = await asyncio.gather(closed_with(revoked), closed_with(revoked_too))
                assert list(closes) == [(1008, "token revoked")] * 2
                assert time.monotonic() - started < 1.0  # within a second of the reload
                for _ in range(5):  # the other token's connection is untouched
                    assert "result" in await kept.request("session/list", {})
                assert kept.ws.close_code is None
            assert await upgrade_status(url, "gone") == 401
            assert await upgrade_status(url, "keep") == 101
            await serve.wait_for_log("closed 2 client connection(s) whose token a reload removed")


async def test_admin_tokens_reload_on_sighup(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text("client\n")
    config = tmp_path / "router.toml"
    async with start_scripted("a", inactive) as backend:
        write_config(config, [("a", backend.url)], extra=secured(tokens, "admin-1"))
        async with run_cli("serve", "--config", str(config)) as serve:
            url = router_url(serve)
            await serve.wait_for_log("backend a is up")
            async with AcpClient.connect(url, token="client") as client:
                assert "result" in await client.initialize()
                write_config(config, [("a", backend.url)], extra=secured(tokens, "admin-2"))
                lines = len(serve.stderr.lines)
                serve.process.send_signal(signal.SIGHUP)
                await serve.wait_for_log("config reloaded", start=lines)
                assert (await post_reload(url, "admin-1"))[0] == 401
                status, body = await post_reload(url, "admin-2")
                assert status == 200, body
                assert body["restartRequired"] == []
                # a client token that stayed keeps its connection
                assert "result" in await client.request("session/list", {})
            assert "Traceback" not in serve.stderr.text


async def test_a_revoked_connection_gets_no_more_answers(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text("gone\n")
    config = tmp_path / "router.toml"
    async with start_scripted("a", inactive) as backend:
        write_config(config, [("a", backend.url)], extra=secured(tokens, "admin-1"))
        async with run_cli("serve", "--config", str(config)) as serve:
            url = router_url(serve)
            await serve.wait_for_log("backend a is up")
            async with AcpClient.connect(url, token="gone") as client:
                assert "result" in await client.initialize()
                tokens.write_text("another\n")
                assert (await post_reload(url, "admin-1"))[0] == 200
                assert await closed_with(client) == (1008, "token revoked")
                try:
                    await client.request("session/new", {"cwd": "/w", "mcpServers": []})
                except (ConnectionClosed, ConnectionError):
                    pass
                else:
                    raise AssertionError("a revoked connection was answered")
