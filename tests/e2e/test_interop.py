"""Interop with the official ACP Python SDK (``agent-client-protocol``, import name ``acp``).

The SDK is a real, independent client here: its own WebSocket transport
(``acp.ws.create_websocket_stream``), its own JSON-RPC connection and its own pydantic
models talk to the router in front of a fleet of reference agents, and to one agent
directly. Only two things here look at raw JSON: an SDK observer that watches what the
SDK sent and received, and the final ``session/status`` check, a method SDK 0.12.1 does
not have. The SDK emits no warnings on these paths, so no warning filter is needed.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import cast

import acp
import pytest

from tests.e2e.support import (
    RecordingClient,
    Wire,
    prompt_of,
    sdk_answered_by,
    sdk_connection,
)
from tests.fleet import backends_of, start_fleet, start_router
from tests.support import CWD, WAIT, AcpClient, start_agent

# -- through the router ------------------------------------------------------------------------


async def test_the_sdk_client_through_the_router(tmp_path: Path) -> None:
    async with start_fleet(tmp_path, 3) as agents, start_router(backends_of(agents)) as router:
        agent_ids = {agent.agent_id for agent in agents}
        first, wire = RecordingClient(), Wire()
        async with sdk_connection(router.url, first, wire) as conn:
            async with asyncio.timeout(WAIT):
                init = await conn.initialize(protocol_version=acp.PROTOCOL_VERSION)
            assert init.protocol_version == acp.PROTOCOL_VERSION
            caps = init.agent_capabilities
            assert caps is not None
            assert caps.load_session is True
            session_caps = caps.session_capabilities
            assert session_caps is not None
            assert session_caps.resume is not None
            assert session_caps.list is not None
            assert session_caps.close is not None
            # SDK 0.12.1's schema (v1.19.0) has no `status` capability and its models drop
            # unknown fields, so check the router's advertisement on the raw reply the SDK got.
            raw_caps = wire.result_of("initialize")["agentCapabilities"]["sessionCapabilities"]
            assert {"status", "resume", "list", "close"} <= raw_caps.keys()
            assert all(raw_caps[name] == {} for name in ("status", "resume", "list", "close"))

            # Keep the first session that lives where the hash default would NOT put it:
            # only the router's status probe can find that one for the second connection.
            for _ in range(30):
                async with asyncio.timeout(WAIT):
                    session_id = (await conn.new_session(cwd=CWD, mcp_servers=[])).session_id
                owner = await sdk_answered_by(conn, first, session_id, "hello")
                assert owner in agent_ids
                if router.first_ranked(session_id) != owner:
                    break
            else:
                pytest.fail("every new session landed on its hash default")

        second = RecordingClient()
        async with sdk_connection(router.url, second) as conn:
            async with asyncio.timeout(WAIT):
                await conn.initialize(protocol_version=acp.PROTOCOL_VERSION)
                await conn.resume_session(session_id=session_id, cwd=CWD)
            assert second.take(session_id) == [], "resume does not replay the history"
            assert await sdk_answered_by(conn, second, session_id, "again") == owner
            assert router.metric("acp_router_locate_total", outcome="active") == 1

            async with asyncio.timeout(WAIT):
                listed = await conn.list_sessions(cwd=CWD)
            assert session_id in {info.session_id for info in listed.sessions}
            assert all(info.cwd == CWD for info in listed.sessions)

            # agent -> router -> SDK client's request_permission -> router -> agent
            async with asyncio.timeout(WAIT):
                asked = await conn.prompt(session_id=session_id, prompt=prompt_of("/permission"))
            assert asked.stop_reason == "end_turn"
            assert second.permission_asks == [session_id]
            assert second.take(session_id) == [
                ("agent_message_chunk", f"[{owner}] permission: allow")
            ]

            async with asyncio.timeout(WAIT):
                await conn.close_session(session_id=session_id)

        # SDK 0.12.1 has no session/status: ask with the raw client that the close landed
        async with AcpClient.connect(router.url) as raw:
            await raw.initialize()
            assert (await raw.status(session_id)).get("result") == {"status": "inactive"}


# -- straight to one reference agent ---------------------------------------------------------


async def test_the_sdk_client_against_one_agent(tmp_path: Path) -> None:
    async with start_agent(tmp_path, "agent-1") as agent:
        first = RecordingClient()
        async with sdk_connection(agent.url, first) as conn:
            async with asyncio.timeout(WAIT):
                init = await conn.initialize(protocol_version=acp.PROTOCOL_VERSION)
            assert init.agent_capabilities is not None
            assert init.agent_capabilities.load_session is True
            assert init.agent_info is not None
            assert init.agent_info.name == "acp-router-reference-agent"
            async with asyncio.timeout(WAIT):
                session_id = (await conn.new_session(cwd=CWD, mcp_servers=[])).session_id
            assert await sdk_answered_by(conn, first, session_id, "one") == "agent-1"
            assert await sdk_answered_by(conn, first, session_id, "two") == "agent-1"

        second, wire = RecordingClient(), Wire()
        async with sdk_connection(agent.url, second, wire) as conn:
            async with asyncio.timeout(WAIT):
                await conn.initialize(protocol_version=acp.PROTOCOL_VERSION)
                await conn.load_session(session_id=session_id, cwd=CWD, mcp_servers=[])
            # on the wire: the whole history as session/update, then the load reply
            load_reply = wire.reply_index("session/load")
            updates = [
                i for i, m in enumerate(wire.incoming) if m.get("method") == "session/update"
            ]
            assert len(updates) == 4
            assert max(updates) < load_reply
            assert second.take(session_id) == [
                ("user_message_chunk", "one"),
                ("agent_message_chunk", "[agent-1] one"),
                ("user_message_chunk", "two"),
                ("agent_message_chunk", "[agent-1] two"),
            ]
            assert await sdk_answered_by(conn, second, session_id, "three") == "agent-1"


async def test_the_sdk_over_stdio_through_the_connect_bridge(tmp_path: Path) -> None:
    """An editor that launches agents as subprocesses: the SDK's own stdio transport
    runs ``acp-router connect URL`` as its "agent" and so reaches the whole fleet."""
    async with start_fleet(tmp_path, 2) as agents, start_router(backends_of(agents)) as router:
        client = RecordingClient()
        async with acp.spawn_agent_process(
            cast(acp.Client, client), sys.executable, "-m", "router", "connect", router.url
        ) as (conn, process):
            async with asyncio.timeout(WAIT):
                init = await conn.initialize(protocol_version=acp.PROTOCOL_VERSION)
                assert init.agent_capabilities is not None
                assert init.agent_capabilities.load_session is True
                session_id = (await conn.new_session(cwd=CWD, mcp_servers=[])).session_id
                owner = await sdk_answered_by(conn, client, session_id, "hello")
                assert owner in {a.agent_id for a in agents}
                asked = await conn.prompt(session_id=session_id, prompt=prompt_of("/permission"))
                assert asked.stop_reason == "end_turn"
                assert client.permission_asks == [session_id]
                assert client.take(session_id)[-1][1] == f"[{owner}] permission: allow"
        assert process.returncode == 0  # stdin closed: the bridge ended by itself, cleanly
