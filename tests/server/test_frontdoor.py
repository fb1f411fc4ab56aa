"""The front door with real sockets in one process: bearer tokens (inline, file, environment,
re-read), Origin and connections per address. Every refusal happens at the WebSocket
upgrade, before any ACP frame (tests/e2e/test_frontdoor.py: TLS both ways, /metrics on its
own address, the demo with a token)."""

from __future__ import annotations

import logging
from pathlib import Path

import aiohttp
import pytest
import websockets
from websockets.asyncio.client import connect

from router.server.door.app_keys import TOKENS
from tests.fleet import inactive, start_router, start_scripted
from tests.server.support import TOKEN, bearer
from tests.support import WAIT, AcpClient

OTHER = "tok-bravo-93d0e7"


async def upgrade_status(url: str, headers: dict[str, str] | None = None) -> int:
    """The HTTP status the router answers an upgrade with (101 when it is accepted)."""
    try:
        async with connect(url, additional_headers=headers, open_timeout=WAIT):
            return 101
    except websockets.InvalidStatus as exc:
        return exc.response.status_code


# -- tokens --------------------------------------------------------------------------------------


async def test_no_token_and_a_wrong_token_get_401_and_the_right_one_gets_in(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="router")
    caplog.set_level(logging.DEBUG, logger="aiohttp")
    async with (
        start_scripted("a", inactive) as backend,
        start_router([("a", backend.url)], auth={"tokens": [TOKEN, OTHER]}) as router,
    ):
        assert await upgrade_status(router.url) == 401
        assert await upgrade_status(router.url, bearer("tok-alpha-5f1c2b")) == 401
        assert await upgrade_status(router.url, {"Authorization": TOKEN}) == 401  # not Bearer
        assert await upgrade_status(router.url, {"Authorization": f"Basic {TOKEN}"}) == 401
        async with aiohttp.ClientSession() as http:
            async with http.get(router.url.replace("ws", "http", 1)) as response:
                assert response.status == 401
                assert response.headers["WWW-Authenticate"] == "Bearer"
        for token in (TOKEN, OTHER):
            async with AcpClient.connect(router.url, token=token) as client:
                assert "result" in await client.initialize()
        assert await upgrade_status(router.url, {"Authorization": f"bearer {TOKEN}"}) == 101
        assert router.metric("acp_router_auth_total", outcome="missing") == 4
        assert router.metric("acp_router_auth_total", outcome="wrong") == 1
        assert router.metric("acp_router_auth_total", outcome="ok") == 3
        # the plain GET asked for an event stream, not a connection: it is refused and
        # its credentials counted, but it is not one of the connections refused
        assert router.metric("acp_router_connections_total", result="unauthorized") == 4
    router_side = [
        r.getMessage() for r in caplog.records if r.name.startswith(("router", "aiohttp"))
    ]
    assert any("refused a client" in line for line in router_side)
    assert not [line for line in router_side if TOKEN in line or OTHER in line]


async def test_refused_initializes_count_as_unauthorized_connections_on_both_transports() -> None:
    initialize = {
        "jsonrpc": "2.0",
        "id": 0,
        "method": "initialize",
        "params": {"protocolVersion": 1},
    }
    async with (
        start_scripted("a", inactive) as backend,
        start_router([("a", backend.url)], auth={"tokens": [TOKEN]}) as router,
        aiohttp.ClientSession() as http,
    ):
        endpoint = router.url.replace("ws", "http", 1)
        assert await upgrade_status(router.url) == 401  # WebSocket: no token
        assert await upgrade_status(router.url, bearer(OTHER)) == 401  # WebSocket: wrong
        for headers in ({}, bearer(OTHER)):  # Streamable HTTP: initialize, no token or wrong
            async with http.post(endpoint, json=initialize, headers=headers) as response:
                assert response.status == 401
        # a request of a connection (it names one) is not a connection refused
        named = {"Acp-Connection-Id": "conn_x", **bearer(OTHER)}
        async with http.post(endpoint, json=initialize, headers=named) as response:
            assert response.status == 401
        async with http.post(endpoint, json=initialize, headers=bearer(TOKEN)) as response:
            assert response.status == 200
        assert router.metric("acp_router_connections_total", result="unauthorized") == 4
        assert router.metric("acp_router_connections_total", result="accepted") == 1


async def test_tokens_from_a_file_are_read_again_on_reload(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text(f"# client tokens\n{TOKEN}\n\n", encoding="utf-8")
    async with (
        start_scripted("a", inactive) as backend,
        start_router([("a", backend.url)], auth={"tokens_file": str(tokens)}) as router,
    ):
        assert await upgrade_status(router.url, bearer(TOKEN)) == 101
        assert await upgrade_status(router.url, bearer(OTHER)) == 401
        tokens.write_text(f"{OTHER}\n", encoding="utf-8")
        assert await upgrade_status(router.url, bearer(OTHER)) == 401  # not before the reload
        reloaded = router.app[TOKENS].reload()
        assert reloaded is not None
        assert len(reloaded) == 1
        assert await upgrade_status(router.url, bearer(OTHER)) == 101
        assert await upgrade_status(router.url, bearer(TOKEN)) == 401


async def test_tokens_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACP_ROUTER_TEST_TOKENS", f"{TOKEN}, {OTHER}")
    async with (
        start_scripted("a", inactive) as backend,
        start_router([("a", backend.url)], auth={"token_env": "ACP_ROUTER_TEST_TOKENS"}) as router,
    ):
        assert await upgrade_status(router.url, bearer(OTHER)) == 101
        assert await upgrade_status(router.url, bearer(TOKEN)) == 101
        assert await upgrade_status(router.url, bearer("nope")) == 401


# -- origin --------------------------------------------------------------------------------------


async def test_a_cross_site_origin_is_refused() -> None:
    router_section = {"allowed_origins": ["https://editor.example", "http://localhost:3000"]}
    async with (
        start_scripted("a", inactive) as backend,
        start_router([("a", backend.url)], router=router_section) as router,
    ):
        assert await upgrade_status(router.url, {"Origin": "https://evil.example"}) == 403
        assert await upgrade_status(router.url, {"Origin": "null"}) == 403
        assert await upgrade_status(router.url, {"Origin": "https://editor.example.evil"}) == 403
        assert await upgrade_status(router.url, {"Origin": "https://EDITOR.example:443"}) == 101
        assert await upgrade_status(router.url, {"Origin": "http://localhost:3000"}) == 101
        assert await upgrade_status(router.url) == 101  # no Origin: not a browser
        assert router.metric("acp_router_connections_total", result="forbidden_origin") == 3
    async with start_router([("a", backend.url)], wait_for=0) as default:
        assert await upgrade_status(default.url, {"Origin": "http://127.0.0.1:8765"}) == 403


# -- limits per address ---------------------------------------------------------------------------


async def test_connections_per_address_are_limited_and_come_back() -> None:
    async with (
        start_scripted("a", inactive) as backend,
        start_router([("a", backend.url)], router={"max_connections_per_address": 2}) as router,
    ):
        async with AcpClient.connect(router.url) as one, AcpClient.connect(router.url) as two:
            assert "result" in await one.initialize()
            assert await upgrade_status(router.url) == 429
            assert "result" in await two.initialize()
        # both closed (a client's close waits for the router to drop the TCP connection,
        # which it does after counting the connection out): the address has room again
        async with AcpClient.connect(router.url) as three:
            assert "result" in await three.initialize()
        assert router.metric("acp_router_limited_total", limit="connections_per_address") == 1
        assert router.metric("acp_router_connections_total", result="address_limit") == 1
