"""The front door speaks ACP's remote transport as its RFD writes it, checked raw (aiohttp
and websockets clients, no SDK): ``Acp-Connection-Id`` on the WebSocket's 101 and on
``initialize``'s 200, binary WebSocket frames ignored, and Streamable HTTP end to end
(POST, event streams, DELETE, keepalives, the statuses, the door, the deadlines);
tests/server/test_streamable_http.py: the pieces."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from router.core import hinted_ids
from router.protocol.ids import ConnectionId
from router.server.door.app_keys import CLIENTS, HTTP_FRONT, OpenClients
from router.server.door.http_connection import HttpConnection
from router.server.process.shutdown import close_spread
from tests.e2e.support import EVENTS, INITIALIZE, JSON, HttpClient, rpc
from tests.fleet import RouterUnderTest, backends_of, start_fleet, start_router
from tests.raw_http import raw_connection, raw_post, status_of
from tests.server.support import TOKEN
from tests.support import CWD, WAIT, AcpClient

OTHER = "tok-bravo-93d0e7"


def http_url(router: RouterUnderTest) -> str:
    return f"{router.base}/acp"


def connection_of(router: RouterUnderTest, client: HttpClient) -> HttpConnection:
    return router.app[HTTP_FRONT].connections[ConnectionId(client.connection_id)]


async def ended(connection: HttpConnection) -> str:
    """Wait until ``connection`` has ended; why."""
    async with asyncio.timeout(WAIT):
        await connection.done.wait()
    return connection.reason


@contextlib.asynccontextmanager
async def one_agent(tmp_path: Path, **router: Any) -> AsyncIterator[RouterUnderTest]:
    async with (
        start_fleet(tmp_path, 1) as agents,
        start_router(backends_of(agents), router=router) as under_test,
    ):
        yield under_test


# -- the WebSocket profile -----------------------------------------------------------------


async def test_the_101_names_the_connection_and_binary_frames_are_ignored(tmp_path: Path) -> None:
    async with one_agent(tmp_path) as router:
        async with AcpClient.connect(router.url) as first, AcpClient.connect(router.url) as second:
            responses = [c.ws.response for c in (first, second)]
            ids = [r.headers["Acp-Connection-Id"] for r in responses if r is not None]
            assert len(ids) == 2
            assert ids[0] != ids[1]
            assert all(len(i) >= 32 for i in ids)
            await first.ws.send(b"\x00\x01 not text")
            await first.ws.send(b"")
            assert "result" in await first.initialize()  # the connection carries on
            session_id = await first.new_session(CWD)
            assert (await first.prompt(session_id, "hello"))["result"] == {"stopReason": "end_turn"}
        assert router.metric("acp_router_client_frames_ignored_total", reason="binary") == 2


# -- Streamable HTTP ------------------------------------------------------------------------


async def test_a_streamable_http_client_end_to_end(tmp_path: Path) -> None:
    async with one_agent(tmp_path) as router, aiohttp.ClientSession() as http:
        client = HttpClient(http, http_url(router))
        answer = await client.initialize()
        assert answer["id"] == 0
        assert answer["result"]["protocolVersion"] == 1
        assert len(client.connection_id) >= 32
        assert router.metric("acp_router_active_connections") == 1
        # a frame before the connection stream is open waits for it
        assert await client.post(rpc(1, "session/new", {"cwd": CWD, "mcpServers": []})) == 202
        async with client.stream() as connection_stream:
            created = await connection_stream.message()
            assert created["id"] == 1
            session_id = created["result"]["sessionId"]
            async with client.stream(session_id) as session_stream:
                prompt = rpc(2, "session/prompt", {"sessionId": session_id, "prompt": []})
                prompt["params"]["prompt"] = [{"type": "text", "text": "hello"}]
                assert await client.post(prompt, session_id) == 202
                said = await session_stream.message()
                assert said["method"] == "session/update"
                assert said["params"]["update"]["content"]["text"] == "[agent-1] hello"
                assert (await session_stream.message()) == {
                    "jsonrpc": "2.0",
                    "id": 2,
                    "result": {"stopReason": "end_turn"},
                }
                # an agent's request comes on the session stream; the answer is a POST
                prompt["id"] = 3
                prompt["params"]["prompt"] = [{"type": "text", "text": "/permission"}]
                assert await client.post(prompt, session_id) == 202
                ask = await session_stream.message()
                assert ask["method"] == "session/request_permission"
                option = ask["params"]["options"][0]["optionId"]
                outcome = {"outcome": {"outcome": "selected", "optionId": option}}
                reply = {"jsonrpc": "2.0", "id": ask["id"], "result": outcome}
                assert await client.post(reply) == 202
                said = await session_stream.message()
                assert said["params"]["update"]["content"]["text"].endswith(option)
                assert (await session_stream.message())["id"] == 3
                # the router's own answers go by the same rules (session/list: none)
                assert await client.post(rpc(4, "session/list")) == 202
                assert (await connection_stream.message())["id"] == 4
                assert router.metric("acp_router_http_streams_open") == 2

                assert await client.delete() == 202
                await connection_stream.ended()
                await session_stream.ended()
        assert await client.post(rpc(5, "session/list")) == 404
        assert router.metric("acp_router_active_connections") == 0
        assert router.metric("acp_router_http_streams_open") == 0
        assert router.metric("acp_router_http_connections_ended_total", reason="deleted") == 1
        assert router.metric("acp_router_http_requests_total", method="POST", status="202") == 5
        assert router.metric("acp_router_connections_total", result="accepted") == 1


async def test_idle_event_streams_get_keepalive_comments(tmp_path: Path) -> None:
    async with (
        one_agent(tmp_path, http_keepalive_seconds=0.05, http_idle_seconds=0.2) as router,
        aiohttp.ClientSession() as http,
    ):
        client = HttpClient(http, http_url(router))
        await client.initialize()
        async with client.stream() as events:
            # more keepalives than the idle deadline lasts: an open stream keeps it alive
            for _ in range(6):
                assert await events.next() == ": keepalive"
            assert client.connection_id in router.app[HTTP_FRONT].connections
            assert await client.post(rpc(1, "session/list")) == 202
            assert (await events.message())["id"] == 1


async def test_a_client_gone_from_its_stream_is_noticed_and_frames_wait_for_the_next(
    tmp_path: Path,
) -> None:
    async with (
        one_agent(tmp_path, http_keepalive_seconds=0.05) as router,
        aiohttp.ClientSession() as http,
    ):
        client = HttpClient(http, http_url(router))
        await client.initialize()
        connection = connection_of(router, client)
        async with client.stream() as events:
            assert await events.next() == ": keepalive"
            (writer,) = connection.writers.values()
        # the client went without a word: the next keepalive finds out
        async with asyncio.timeout(WAIT):
            await writer.ended.wait()
        assert router.metric("acp_router_http_streams_open") == 0
        assert await client.post(rpc(1, "session/list")) == 202
        async with client.stream() as events:
            assert (await events.message())["id"] == 1


async def test_a_second_get_for_a_stream_replaces_the_first(tmp_path: Path) -> None:
    async with one_agent(tmp_path) as router, aiohttp.ClientSession() as http:
        client = HttpClient(http, http_url(router))
        await client.initialize()
        async with client.stream() as first:
            async with client.stream() as second:
                await first.ended()
                assert await client.post(rpc(1, "session/list")) == 202
                assert (await second.message())["id"] == 1
                assert router.metric("acp_router_http_streams_open") == 1


async def test_session_streams_are_bounded(tmp_path: Path) -> None:
    async with (
        one_agent(tmp_path, max_sessions_per_connection=1) as router,
        aiohttp.ClientSession() as http,
    ):
        client = HttpClient(http, http_url(router))
        await client.initialize()
        async with client.stream("s1"), client.stream("s2"):  # not known yet: now they are
            async with http.get(client.url, headers=client.headers("s3", **EVENTS)) as response:
                assert response.status == 429


async def test_a_connection_with_no_stream_and_no_post_is_reaped(tmp_path: Path) -> None:
    async with (
        one_agent(tmp_path, http_idle_seconds=0.1) as router,
        aiohttp.ClientSession() as http,
    ):
        client = HttpClient(http, http_url(router))
        await client.initialize()
        assert await ended(connection_of(router, client)) == "idle"
        assert await client.post(rpc(1, "session/list")) == 404
        assert router.metric("acp_router_http_connections_ended_total", reason="idle") == 1
        assert router.metric("acp_router_active_connections") == 0


async def test_frames_held_for_an_unopened_stream_are_bounded(tmp_path: Path) -> None:
    async with (
        one_agent(tmp_path, http_held_frames=2) as router,
        aiohttp.ClientSession() as http,
    ):
        client = HttpClient(http, http_url(router))
        await client.initialize()
        connection = connection_of(router, client)
        for n in range(1, 4):  # answered on the connection stream, which is never opened
            assert await client.post(rpc(n, "session/list")) in (202, 404)
        assert await ended(connection) == "overflow"
        assert router.metric("acp_router_http_connections_ended_total", reason="overflow") == 1


async def test_stopping_the_router_ends_the_event_streams(tmp_path: Path) -> None:
    async with one_agent(tmp_path) as router, aiohttp.ClientSession() as http:
        client = HttpClient(http, http_url(router))
        await client.initialize()
        async with client.stream() as events:
            open_clients: OpenClients = router.app[CLIENTS]
            await close_spread(list(open_clients), 0.0, asyncio.Event())  # what a stop does
            await events.ended()
        assert router.metric("acp_router_http_connections_ended_total", reason="closed") == 1
        assert router.metric("acp_router_active_connections") == 0


async def test_the_rfd_statuses(tmp_path: Path) -> None:
    async with one_agent(tmp_path) as router, aiohttp.ClientSession() as http:
        url = http_url(router)
        client = HttpClient(http, url)

        async def status(method: str, data: str = "", **headers: str) -> int:
            async with http.request(method, url, data=data, headers=headers) as response:
                return response.status

        initialize = json.dumps(INITIALIZE)
        assert await status("POST", initialize, **{"Content-Type": "text/plain"}) == 415
        assert await status("POST", f"[{initialize}]", **JSON) == 501  # batches
        assert await status("POST", "{not json", **JSON) == 400
        async with http.post(url, data=b'{"\xff": 1}', headers=JSON) as response:
            assert response.status == 400  # not UTF-8
        assert await status("POST", '"a string"', **JSON) == 400
        assert await status("POST", json.dumps(rpc(1, "session/list")), **JSON) == 400  # no id
        unknown = {"Acp-Connection-Id": "no-such-connection"}
        assert await status("POST", json.dumps(rpc(1, "session/list")), **JSON, **unknown) == 404
        assert await status("GET", Accept="application/json") == 406
        assert await status("GET", **EVENTS) == 400
        assert await status("GET", **EVENTS, **unknown) == 404
        assert await status("DELETE") == 400
        assert await status("DELETE", **unknown) == 404
        assert await status("PUT", initialize, **JSON) == 405
        assert await status("HEAD", **EVENTS, **unknown) == 405

        await client.initialize()
        prompt = rpc(1, "session/prompt", {"sessionId": "s1", "prompt": []})
        assert await client.post(prompt) == 400  # Acp-Session-Id is required
        assert await client.post(prompt, "s1") == 404  # not a session of this connection
        assert await client.post(rpc(2, "session/list"), "s1") == 202  # not needed, harmless
        # a frame that is not JSON-RPC is the routing core's: -32600 on the connection stream
        assert await client.post({"jsonrpc": "1.0", "id": 3}) == 202
        async with client.stream() as events:
            answers = {m["id"]: m for m in [await events.message(), await events.message()]}
            assert "sessions" in answers[2]["result"]
            assert answers[3]["error"]["code"] == -32600


async def test_crafted_ids_get_answers_and_the_connection_goes_on(tmp_path: Path) -> None:
    home = "\u00e9"  # not base64url, with the check it needs (no secret is)
    crafted = f"sess_x@{home}.{hinted_ids._check('sess_x', home)}"
    async with one_agent(tmp_path, hinted_ids=True) as router, aiohttp.ClientSession() as http:
        client = HttpClient(http, http_url(router))
        await client.initialize()
        async with client.stream() as events:
            # on the old main: 500, and the connection ended
            assert await client.post(rpc(1, "session/status", {"sessionId": crafted})) == 202
            assert (await events.message())["error"]["code"] == -32002
            assert await client.post(rpc(2, "session/list")) == 202
            assert "sessions" in (await events.message())["result"]
        for tagged in ("9" * 5000 + ".x", "\u00b2.x", "0." + "\u00e9" * 40):
            stranger = HttpClient(http, http_url(router))
            stranger.connection_id = tagged.encode().decode("latin-1")  # as sent on the wire
            assert await stranger.post(rpc(3, "session/list")) == 404


async def test_bodies_are_read_within_max_held_bytes(tmp_path: Path) -> None:
    most = 256 * 1024
    async with (
        one_agent(tmp_path, max_message_bytes=most, max_held_bytes=most) as router,
        raw_connection(router.base) as (first, first_writer),
        raw_connection(router.base) as (second, second_writer),
        aiohttp.ClientSession() as http,
    ):
        budget = router.app[HTTP_FRONT].budget
        for writer in (first_writer, second_writer):  # both being read, neither whole
            writer.write(raw_post("c", most) + b"{" * 1000)
        # one body fits: the other is refused before it is read
        answers = [asyncio.create_task(status_of(reader)) for reader in (first, second)]
        done, pending = await asyncio.wait(answers, return_when=asyncio.FIRST_COMPLETED)
        status, headers = done.pop().result()
        assert (status, headers["retry-after"]) == (503, "1")
        assert budget.held == most
        assert router.metric("acp_router_limited_total", limit="held_bytes") == 1
        (held,) = pending
        held.cancel()
        for writer in (first_writer, second_writer):
            writer.close()
        client = HttpClient(http, http_url(router))
        await client.initialize()  # the budget is given back: bodies are read again
        assert budget.held == 0


async def test_the_door_checks_every_request(tmp_path: Path) -> None:
    async with (
        start_fleet(tmp_path, 1) as agents,
        start_router(
            backends_of(agents),
            auth={"tokens": [TOKEN, OTHER]},
            router={"max_connections_per_principal": 1, "allowed_origins": ["https://ok.example"]},
        ) as router,
        aiohttp.ClientSession() as http,
    ):
        url = http_url(router)
        async with http.post(url, json=INITIALIZE) as response:
            assert response.status == 401
            assert response.headers["WWW-Authenticate"] == "Bearer"
        headers = {"Origin": "https://evil.example", "Authorization": f"Bearer {TOKEN}"}
        async with http.post(url, json=INITIALIZE, headers=headers) as response:
            assert response.status == 403
        client = HttpClient(http, url, TOKEN)
        await client.initialize()
        # one connection per token: the next is 429, on either profile
        async with http.post(url, json=INITIALIZE, headers=client.auth) as response:
            assert response.status == 429
        with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
            await http.ws_connect(router.url, headers=client.auth)
        assert refused.value.status == 429
        assert router.metric("acp_router_limited_total", limit="connections_per_principal") == 2
        # the connection answers only the token that opened it
        assert await HttpClient(http, url, OTHER).post(rpc(1, "session/list")) == 400
        stranger = HttpClient(http, url, OTHER)
        stranger.connection_id = client.connection_id
        assert await stranger.post(rpc(1, "session/list")) == 404
        stranger.auth = {}
        assert await stranger.post(rpc(1, "session/list")) == 401
        async with http.get(url, headers=stranger.headers(**EVENTS)) as response:
            assert response.status == 401
        assert await stranger.delete() == 401
        assert await client.post(rpc(1, "session/list")) == 202
        # every attempt that got past the token counts (the 429s too: the WebSocket
        # upgrade's rule); the requests of an open connection do not
        assert router.metric("acp_router_auth_total", outcome="ok") == 3
        assert router.metric("acp_router_auth_total", outcome="missing") == 4
        assert await client.delete() == 202
        async with http.post(url, json=INITIALIZE, headers=client.auth) as response:
            assert response.status == 200  # its place is free again


async def test_http_and_websocket_connections_share_max_connections(tmp_path: Path) -> None:
    # no keep-alive: a TCP connection the HTTP client keeps open would count on its own
    async with (
        one_agent(tmp_path, max_connections=2) as router,
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as http,
    ):
        client = HttpClient(http, http_url(router))
        await client.initialize()
        connection = connection_of(router, client)
        async with AcpClient.connect(router.url) as ws_client:
            assert "result" in await ws_client.initialize()
            # two client connections, one of each profile; the HTTP one has no stream open
            # and no POST under way: it is idle, and its place goes to a newcomer (on the
            # old main: 503 until it had been idle for 300 s)
            async with AcpClient.connect(router.url) as again:
                assert "result" in await again.initialize()
                assert await ended(connection) == "reclaimed"
                # two in use: a third of either is refused
                with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
                    await http.ws_connect(router.url)
                assert refused.value.status == 503
                async with http.post(http_url(router), json=INITIALIZE) as response:
                    assert response.status == 503
        assert router.metric("acp_router_connections_total", result="rejected") == 2
        assert router.metric("acp_router_http_connections_ended_total", reason="reclaimed") == 1


async def test_one_token_cannot_lock_out_another_from_its_address(tmp_path: Path) -> None:
    # token A opens 1,000 HTTP connections (its share) and keeps them: token B, from the
    # same address, is served on both profiles (on the old main: 429 for 300 s)
    async with (
        start_fleet(tmp_path, 1) as agents,
        start_router(backends_of(agents), auth={"tokens": [TOKEN, OTHER]}) as router,
        aiohttp.ClientSession() as http,
    ):
        url = http_url(router)
        lock = asyncio.Semaphore(32)
        bearer = {"Authorization": f"Bearer {TOKEN}"}

        async def opened() -> int:
            async with lock, http.post(url, json=INITIALIZE, headers=bearer) as response:
                return response.status

        statuses = await asyncio.gather(*(opened() for _ in range(1001)))
        assert sorted(statuses) == [200] * 1000 + [429]  # a principal has its own share
        async with AcpClient.connect(router.url, token=OTHER) as ws_client:
            assert "result" in await ws_client.initialize()
            session_id = await ws_client.new_session(CWD)
            assert (await ws_client.prompt(session_id, "hi"))["result"]["stopReason"] == "end_turn"
        client = HttpClient(http, url, OTHER)
        await client.initialize()
        async with client.stream() as events:
            assert await client.post(rpc(1, "session/list")) == 202
            assert "sessions" in (await events.message())["result"]


async def test_an_event_stream_the_client_does_not_read_is_dropped_at_its_deadline(
    tmp_path: Path,
) -> None:
    keepalive = 0.1  # a write may wait twice this on a client that does not read
    async with (
        one_agent(tmp_path, http_keepalive_seconds=keepalive) as router,
        aiohttp.ClientSession() as http,
    ):
        client = HttpClient(http, http_url(router))
        await client.initialize()
        connection = connection_of(router, client)
        assert await client.post(rpc(1, "session/new", {"cwd": CWD, "mcpServers": []})) == 202
        async with client.stream() as events:
            session_id = (await events.message())["result"]["sessionId"]
            # the session's stream on a socket that reads its headers and then nothing
            before = set(connection.writers.values())
            port = int(router.base.rsplit(":", 1)[1])
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            try:
                writer.write(
                    "GET /acp HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: text/event-stream\r\n"
                    f"Acp-Connection-Id: {client.connection_id}\r\n"
                    f"Acp-Session-Id: {session_id}\r\n\r\n".encode()
                )
                async with asyncio.timeout(WAIT):
                    assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200")
                (stream,) = set(connection.writers.values()) - before
                # echoes of 1 MB prompts: far more than the sockets' buffers take
                text = [{"type": "text", "text": "x" * 1_000_000}]
                for n in range(2, 30):
                    prompt = rpc(n, "session/prompt", {"sessionId": session_id, "prompt": text})
                    assert await client.post(prompt, session_id) == 202
                    if stream.ended.is_set():
                        break
                async with asyncio.timeout(WAIT):
                    await stream.ended.wait()  # dropped, not waited on for ever
                # the connection goes on: its own stream still answers
                assert await client.post(rpc(99, "session/list")) == 202
                while (await events.message()).get("id") != 99:
                    pass
            finally:
                writer.close()
