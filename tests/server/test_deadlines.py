"""Deadlines and limits on every connection of the front door, from accept on.

Real sockets throughout: raw TCP clients that say nothing, or send a request line and
never finish it, against a router on loopback (tests/e2e/test_deadlines.py: a router
subprocess started under a low RLIMIT_NOFILE for the descriptor reserve).
"""

from __future__ import annotations

import asyncio
import contextlib
import re

import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from tests.fleet import RouterUnderTest, inactive, start_router, start_scripted
from tests.server.support import raw
from tests.support import WAIT, AcpClient

HANDSHAKE_MS = 300


def _port(router: RouterUnderTest) -> int:
    match = re.search(r":(\d+)/acp$", router.url)
    assert match is not None
    return int(match.group(1))


async def answer_then_close(reader: asyncio.StreamReader) -> bytes:
    """Everything the router writes until it closes the connection."""
    async with asyncio.timeout(WAIT):
        return await reader.read()


async def test_silent_and_half_sent_requests_are_closed_at_the_deadline() -> None:
    async with (
        start_scripted("a", inactive) as backend,
        start_router([("a", backend.url)], router={"handshake_timeout_ms": HANDSHAKE_MS}) as router,
        contextlib.AsyncExitStack() as stack,
    ):
        port = _port(router)
        silent = [await stack.enter_async_context(raw(port)) for _ in range(20)]
        half = [await stack.enter_async_context(raw(port)) for _ in range(20)]
        for _, writer in half:  # a request line and a header, and the rest never comes
            writer.write(b"GET /acp HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: web")
            await writer.drain()
        answers = await asyncio.gather(*(answer_then_close(r) for r, _ in silent + half))
        assert all(answer.startswith(b"HTTP/1.1 408 Request Timeout") for answer in answers)
        assert all(f"no request within {HANDSHAKE_MS} ms".encode() in a for a in answers)
        assert router.metric("acp_router_connections_total", result="handshake_timeout") == 40
        assert router.metric("acp_router_handshaking_connections") == 0
        # the door is open for a client that speaks up
        async with AcpClient.connect(router.url) as client:
            assert "result" in await client.initialize()


async def test_a_trickling_client_is_closed_at_the_deadline_too() -> None:
    request = b"GET /acp HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"a" * 100_000
    pace = 0.005  # the hostile client's: a byte each time the router has not answered in this

    async with (
        start_scripted("a", inactive) as backend,
        start_router([("a", backend.url)], router={"handshake_timeout_ms": HANDSHAKE_MS}) as router,
        raw(_port(router)) as (reader, writer),
    ):
        answering = asyncio.create_task(answer_then_close(reader))
        for byte in request:  # a byte at a time, never done in time: stops once answered
            writer.write(bytes([byte]))
            done, _ = await asyncio.wait({answering}, timeout=pace)
            if done:
                break
        try:
            answer = await answering
        except ConnectionResetError:  # closed while its bytes kept coming: the 408 may be lost
            answer = b"HTTP/1.1 408 (reset)"
        assert answer.startswith(b"HTTP/1.1 408"), answer
        assert router.metric("acp_router_connections_total", result="handshake_timeout") == 1


async def test_connections_in_the_handshake_count_against_the_limits() -> None:
    limits = {
        "max_connections": 5,
        "max_connections_per_address": 3,
        "handshake_timeout_ms": 60_000,
    }
    async with (
        start_scripted("a", inactive) as backend,
        start_router([("a", backend.url)], router=limits) as router,
        contextlib.AsyncExitStack() as stack,
    ):
        port = _port(router)
        for _ in range(3):  # silent: they never reach a handler
            await stack.enter_async_context(raw(port, "127.0.0.1"))
        async with raw(port, "127.0.0.1") as (reader, _):
            assert (await answer_then_close(reader)).startswith(b"HTTP/1.1 429")
        await stack.enter_async_context(raw(port, "127.0.0.2"))
        await stack.enter_async_context(raw(port, "127.0.0.2"))
        async with raw(port, "127.0.0.3") as (reader, _):
            assert (await answer_then_close(reader)).startswith(b"HTTP/1.1 503")
        assert router.metric("acp_router_open_connections") == 5
        assert router.metric("acp_router_connections_total", result="address_limit") == 1
        assert router.metric("acp_router_connections_total", result="rejected") == 1
        assert router.metric("acp_router_limited_total", limit="connections_per_address") == 1


async def test_a_client_that_never_initializes_is_closed_1008() -> None:
    async with (
        start_scripted("a", inactive) as backend,
        start_router([("a", backend.url)], router={"initialize_timeout_ms": 400}) as router,
        AcpClient.connect(router.url) as initialized,
    ):
        assert "result" in await initialized.initialize()
        async with asyncio.timeout(WAIT), connect(router.url) as silent:
            with pytest.raises(ConnectionClosed) as closed:
                await silent.recv()
        assert closed.value.rcvd is not None
        assert (closed.value.rcvd.code, closed.value.rcvd.reason) == (
            1008,
            "no initialize within 400 ms",
        )
        # the initialized client's deadline passed too (it opened first): still served
        assert "result" in await initialized.request("session/list", {})
        assert router.metric("acp_router_connections_total", result="initialize_timeout") == 1


async def test_a_post_whose_body_never_arrives_is_answered_408_at_the_deadline() -> None:
    async with (
        start_scripted("a", inactive) as backend,
        start_router([("a", backend.url)], router={"handshake_timeout_ms": HANDSHAKE_MS}) as router,
        raw(_port(router)) as (reader, writer),
    ):
        head = b"POST /acp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        writer.write(head + b"Content-Length: 1000\r\n\r\n" + b'{"jsonrpc":')  # and no more
        await writer.drain()
        answer = await answer_then_close(reader)
        assert answer.startswith(b"HTTP/1.1 408"), answer
        assert f"the body did not arrive within {HANDSHAKE_MS} ms".encode() in answer
