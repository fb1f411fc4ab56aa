"""Agents written elsewhere, put into the fleet with ``acp-router host``.

* The official Python SDK on both ends: its client, launched the way an editor launches
  an agent (``acp-router connect URL`` as the agent command), reaches an SDK agent
  behind ``host`` through the router, disconnects, comes back and resumes its session
  on the same agent process.
* The official Python SDK client over its own WebSocket transport straight to ``host``.
* The official TypeScript SDK (node) as an agent behind ``host``, answering the SDK's
  unstable ``session/status`` in its own dialect (``open``/``saved``), which the host
  turns into the RFD's values.
* The official JSON Schema shipped in the TypeScript SDK package checks every frame
  the router and the host write.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any, cast

import acp
from acp.client.connection import ClientSideConnection

from router.host.multiplex import Multiplexer
from router.protocol.acp import EPOCH_META_KEY as EPOCH
from tests.acp_schema import AcpSchema
from tests.e2e.support import RecordingClient, Wire, sdk_answered_by, sdk_connection
from tests.fleet import start_router, start_scripted
from tests.hosted import SDK_AGENT, node_command, pid_of, start_host
from tests.support import CWD, WAIT, AcpClient, text_chunks

CONNECT = (sys.executable, "-m", "router", "connect")


@asynccontextmanager
async def editor_via_connect(
    url: str,
) -> AsyncIterator[tuple[RecordingClient, ClientSideConnection]]:
    """An SDK client that launches ``acp-router connect URL`` as its agent, as an editor
    would; the bridge must exit 0 when the client closes its stdin."""
    editor = RecordingClient()
    async with acp.spawn_agent_process(cast(acp.Client, editor), *CONNECT, url) as (conn, bridge):
        yield editor, conn
    assert bridge.returncode == 0


async def test_an_editor_resumes_its_session_on_the_same_agent_process_behind_host() -> None:
    async with AsyncExitStack() as stack:
        hosts = [
            await stack.enter_async_context(start_host(f"host-{n}", *SDK_AGENT)) for n in (1, 2)
        ]
        router = await stack.enter_async_context(start_router([(h.host_id, h.url) for h in hosts]))
        async with editor_via_connect(router.url) as (editor, conn):
            async with asyncio.timeout(WAIT):
                await conn.initialize(protocol_version=acp.PROTOCOL_VERSION)
                session_id = (await conn.new_session(cwd=CWD, mcp_servers=[])).session_id
            process = await sdk_answered_by(conn, editor, session_id, "hello")

        # a new editor process, a new bridge, a new router connection
        async with editor_via_connect(router.url) as (editor, conn):
            async with asyncio.timeout(WAIT):
                await conn.initialize(protocol_version=acp.PROTOCOL_VERSION)
                await conn.resume_session(session_id=session_id, cwd=CWD)
            assert await sdk_answered_by(conn, editor, session_id, "again") == process
        # found by the status probe (the host said active), not by a guess
        assert router.metric("acp_router_locate_total", outcome="active") == 1


async def test_the_typescript_sdk_agent_behind_host_speaks_open_and_saved() -> None:
    async with start_host("ts", *node_command()) as host:
        async with AcpClient.connect(host.url) as client:
            init = (await client.initialize())["result"]
            assert init["agentInfo"]["name"] == "ts-status-agent"
            assert init["agentCapabilities"]["sessionCapabilities"]["status"] == {}
            session_id = await client.new_session()
            said = await client.prompt(session_id, "hello")
            assert said["result"] == {"stopReason": "end_turn"}
            [(_, text)] = text_chunks(client.drain_incoming())
            pid = pid_of(text)
            # the agent says "open"; the host answers the RFD's "active", with the
            # session's epoch (0: no router resumed it)
            kept = {"_meta": {EPOCH: 0}}
            assert (await client.status(session_id))["result"] == {"status": "active", **kept}
            assert (await client.request("session/close", {"sessionId": session_id}))[
                "result"
            ] == {}
            # "saved" -> "inactive"
            assert (await client.status(session_id))["result"] == {"status": "inactive", **kept}
            # the SDK's -32002 names the session as data.uri; the host's names data.sessionId
            unknown = await client.status("sess_nobody")
            assert unknown["error"]["code"] == -32002
            assert unknown["error"]["data"] == {"sessionId": "sess_nobody"}

        # through a router: a reconnecting client resumes the saved session there
        async with start_router([("ts", host.url)]) as router:
            async with AcpClient.connect(router.url) as client:
                await client.initialize()
                assert (await client.status(session_id))["result"] == {"status": "inactive"}
                resumed = await client.request(
                    "session/resume", {"sessionId": session_id, "cwd": CWD}
                )
                assert resumed.get("result") == {}, resumed
                assert (await client.status(session_id))["result"] == {"status": "active"}
                await client.prompt(session_id, "back")
                [(_, text)] = text_chunks(client.drain_incoming())
                assert pid_of(text) == pid


async def test_every_frame_the_router_and_the_host_write_matches_the_official_schema() -> None:
    node_command()  # the schema comes with the TypeScript SDK package
    schema = AcpSchema()
    bad_status = {"jsonrpc": "2.0", "id": 1, "result": {"status": 5}}
    assert schema.check_frames([bad_status], {1: "session/status"}) != []  # it can say no
    problems: list[str] = []

    # the host's own initialize to the agent it runs
    handshake = json.loads(Multiplexer().handshake({}))
    problems += schema.check_frames([handshake], {})

    async def knows_it(session_id: str) -> dict[str, Any] | None:
        return {"status": "inactive"}

    async with AsyncExitStack() as stack:
        host = await stack.enter_async_context(start_host("h", *SDK_AGENT))
        router = await stack.enter_async_context(start_router([("h", host.url)]))
        for url in (router.url, host.url):
            async with AcpClient.connect(url) as client:
                asked: dict[Any, str] = {}

                async def ask(
                    method: str,
                    params: dict[str, Any],
                    client: AcpClient = client,
                    asked: dict[Any, str] = asked,
                ) -> dict[str, Any]:
                    response = await client.request(method, params)
                    asked[response["id"]] = method
                    return response

                await ask("initialize", {"protocolVersion": 1, "clientCapabilities": {}})
                created = await ask("session/new", {"cwd": CWD, "mcpServers": []})
                session_id = created["result"]["sessionId"]
                prompt = [{"type": "text", "text": "hello"}]
                await ask("session/prompt", {"sessionId": session_id, "prompt": prompt})
                await ask("session/status", {"sessionId": session_id})
                await ask("session/status", {"sessionId": "sess_nobody"})
                await ask("session/list", {})
                await ask("session/resume", {"sessionId": session_id, "cwd": CWD})
                await ask("session/close", {"sessionId": session_id})
                await ask("session/status", {"sessionId": session_id})
                await ask("session/prompt", {"sessionId": "sess_x", "prompt": prompt})
                await ask("session/status", {})
                await client.send_raw("{oops", expect_id=None)
                received = [json.loads(frame) for frame in client.raw_frames]
                assert len(received) >= 13
                problems += schema.check_frames(received, asked)

        # what a router sends a backend: its control link's and its client links' frames
        scripted = await stack.enter_async_context(start_scripted("scripted", knows_it))
        router = await stack.enter_async_context(start_router([("scripted", scripted.url)]))
        async with AcpClient.connect(router.url) as client:
            await client.initialize()
            await client.status("sess_1")
            await client.request("session/list", {"cwd": CWD})
            await client.request("session/resume", {"sessionId": "sess_1", "cwd": CWD})
        sent = [json.loads(frame) for frame in scripted.frames]
        assert {"initialize", "session/status", "session/list", "session/resume"} <= {
            frame.get("method") for frame in sent
        }
        problems += schema.check_frames(sent, {})
    assert problems == []


async def test_the_sdk_client_over_websocket_resumes_on_the_same_process_behind_host() -> None:
    """The SDK's own WebSocket transport straight to ``host``: no router, no bridge."""
    async with start_host("h", *SDK_AGENT) as host:
        first, wire = RecordingClient(), Wire()
        async with sdk_connection(host.url, first, wire) as conn:
            async with asyncio.timeout(WAIT):
                await conn.initialize(protocol_version=acp.PROTOCOL_VERSION)
                session_id = (await conn.new_session(cwd=CWD, mcp_servers=[])).session_id
            process = await sdk_answered_by(conn, first, session_id, "hello")
            caps = wire.result_of("initialize")["agentCapabilities"]["sessionCapabilities"]
            assert caps["status"] == {}  # added by the host; SDK 0.12.1 models drop it

        second = RecordingClient()
        async with sdk_connection(host.url, second) as conn:
            async with asyncio.timeout(WAIT):
                await conn.initialize(protocol_version=acp.PROTOCOL_VERSION)
                await conn.resume_session(session_id=session_id, cwd=CWD)
            assert await sdk_answered_by(conn, second, session_id, "again") == process
