"""Interop over ACP's remote transport with the official Python SDK on both ends: its
two clients (Streamable HTTP, ``acp.http.create_http_stream``; WebSocket,
``acp.ws.create_websocket_stream``) through the router, in front of a fleet of agents
served by the SDK's own ASGI app under uvicorn (:mod:`tests.agents.sdk_served_agent`).

Each agent process tags its replies with its pid, so a test can tell which process
answered. SDK 0.12.1's server offers session/load, not session/resume (its unstable
flag is off), so the second connection loads. Between the SDK's own HTTP client and
server that fails (the server does not learn the loaded session, and answers the
next prompt's POST 404); through the router it works (docs/transport.md).
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections import defaultdict
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any, cast

import acp
import pytest
from acp.client.connection import ClientSideConnection
from acp.http import create_http_stream
from acp.schema import (
    AgentMessageChunk,
    AllowedOutcome,
    PermissionOption,
    RequestPermissionResponse,
    TextContentBlock,
)
from acp.ws import create_websocket_stream

from router.protocol.ids import SessionId
from tests.fleet import RouterUnderTest, start_router
from tests.hosted import pid_of
from tests.support import CWD, WAIT, CliProcess

#: how long a served agent may take to start (it imports the SDK and uvicorn)
START = 30.0


class Recorder:
    """An SDK client that records the text of agent message chunks per session and
    allows every permission request."""

    def __init__(self) -> None:
        self.said: defaultdict[str, list[str]] = defaultdict(list)
        self.asked: list[str] = []
        self._changed = asyncio.Condition()

    async def session_update(self, session_id: str, update: Any, **kwargs: Any) -> None:
        if isinstance(update, AgentMessageChunk) and isinstance(update.content, TextContentBlock):
            async with self._changed:
                self.said[session_id].append(update.content.text)
                self._changed.notify_all()

    async def request_permission(
        self, session_id: str, tool_call: Any, options: list[PermissionOption], **kwargs: Any
    ) -> RequestPermissionResponse:
        self.asked.append(session_id)
        allow = next(option for option in options if option.kind == "allow_once")
        return RequestPermissionResponse(
            outcome=AllowedOutcome(outcome="selected", option_id=allow.option_id)
        )

    async def said_ending(self, session_id: str, text: str) -> str:
        """Wait for a chunk ending with ``text`` (chunks and the prompt's answer may come
        on two event streams, so the answer can arrive first); the chunk."""

        def found() -> str | None:
            return next((s for s in self.said[session_id] if s.endswith(text)), None)

        async with asyncio.timeout(WAIT), self._changed:
            await self._changed.wait_for(lambda: found() is not None)
        chunk = found()
        assert chunk is not None
        return chunk


@asynccontextmanager
async def start_sdk_agent() -> AsyncIterator[str]:
    """An SDK-served agent process on a free loopback port; its ws:// URL."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.agents.sdk_served_agent",
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    agent = CliProcess(process)
    try:
        line = await agent.read_first_line(START)
        prefix = "sdk agent listening on "
        assert line.startswith(prefix), line
        yield line.removeprefix(prefix)
    finally:
        await agent.stop()
        assert "Traceback" not in agent.stderr.text, agent.stderr.text


@asynccontextmanager
async def sdk_fleet(count: int) -> AsyncIterator[RouterUnderTest]:
    """``count`` SDK-served agents behind the router."""
    async with AsyncExitStack() as stack:
        urls = await asyncio.gather(
            *(stack.enter_async_context(start_sdk_agent()) for _ in range(count))
        )
        backends = [(f"sdk-{n}", url) for n, url in enumerate(urls, start=1)]
        yield await stack.enter_async_context(start_router(backends))


@asynccontextmanager
async def over_http(router: RouterUnderTest, client: Recorder) -> AsyncIterator[Any]:
    transport = create_http_stream(f"{router.base}/acp")
    conn = acp.connect_to_agent(cast(acp.Client, client), transport)
    try:
        yield conn
    finally:
        await conn.close()  # DELETE


@asynccontextmanager
async def over_websocket(router: RouterUnderTest, client: Recorder) -> AsyncIterator[Any]:
    async with asyncio.timeout(WAIT):
        transport = await create_websocket_stream(router.url)
    conn = acp.connect_to_agent(cast(acp.Client, client), transport)
    try:
        yield conn
    finally:
        await conn.close()


PROFILES = {"http": over_http, "websocket": over_websocket}


async def prompt(
    conn: ClientSideConnection, client: Recorder, session_id: str, text: str, reply: str = ""
) -> int:
    """Prompt through the SDK; the pid of the agent process that answered (with
    ``reply``, or the echo of ``text``)."""
    async with asyncio.timeout(WAIT):
        response = await conn.prompt(session_id=session_id, prompt=[acp.text_block(text)])
    assert response.stop_reason == "end_turn"
    return pid_of(await client.said_ending(session_id, f"] {reply or text}"))


async def new_session_off_its_default(
    router: RouterUnderTest, conn: ClientSideConnection, client: Recorder
) -> tuple[str, int]:
    """A session that lives where the hash default would not put it (so only the
    router finds it again), prompted once; its id and its agent's pid."""
    for _ in range(30):
        async with asyncio.timeout(WAIT):
            session_id = (await conn.new_session(cwd=CWD, mcp_servers=[])).session_id
        owner = await prompt(conn, client, session_id, "hello")
        (where,) = router.pool.directory.attachments[SessionId(session_id)]
        if where != router.first_ranked(session_id):
            return session_id, owner
    pytest.fail("every new session landed on its hash default")


@pytest.mark.parametrize(
    ("first", "second"), [("http", "http"), ("websocket", "websocket"), ("http", "websocket")]
)
async def test_the_sdk_clients_create_prompt_and_load_through_the_router(
    first: str, second: str
) -> None:
    async with sdk_fleet(2) as router:
        creator = Recorder()
        async with PROFILES[first](router, creator) as conn:
            async with asyncio.timeout(WAIT):
                init = await conn.initialize(protocol_version=acp.PROTOCOL_VERSION)
            caps = init.agent_capabilities
            assert caps is not None
            assert caps.load_session is True
            assert caps.session_capabilities is None or caps.session_capabilities.resume is None
            session_id, owner = await new_session_off_its_default(router, conn, creator)

        loader = Recorder()
        async with PROFILES[second](router, loader) as conn:
            async with asyncio.timeout(WAIT):
                await conn.initialize(protocol_version=acp.PROTOCOL_VERSION)
                await conn.load_session(session_id=session_id, cwd=CWD, mcp_servers=[])
            # the history replayed, from the process that holds it
            assert pid_of(await loader.said_ending(session_id, "] hello")) == owner
            assert await prompt(conn, loader, session_id, "again") == owner
            # agent -> router -> the SDK client's request_permission -> router -> agent
            allowed = await prompt(conn, loader, session_id, "/permission", "permission: allow")
            assert allowed == owner
            assert loader.asked == [session_id]
        await router.wait_detached()
        await router.wait_clients(0)  # each connection counted out once ended in full
        assert router.metric("acp_router_active_connections") == 0
