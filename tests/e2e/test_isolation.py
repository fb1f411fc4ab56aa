"""A backend can only hurt what is routed to it (issue 8): one client connection with
sessions on several backends, one of them misbehaving on a real socket.

Each backend link has its own outbox and writer, so the client's read loop never
waits on a backend; a link that breaks, cannot open within
``router.connect_timeout_ms`` or cannot keep up is given up alone: its requests are
answered ``-32013``, its agent requests are withdrawn with ``$/cancel_request``, and
the client connection carries on (tests/server/test_isolation.py: against hostile
backends alone).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path

from websockets.protocol import State

from tests.fleet import RouterUnderTest, backends_of, start_fleet, start_router
from tests.hostile import LINK_INITIALIZE, start_hostile
from tests.server.support import NEW
from tests.support import CWD, WAIT, AcpClient, AgentProcess, JsonObject, answered_by, start_agent


@contextlib.asynccontextmanager
async def two_agents(
    store: Path, *agent_args: str
) -> AsyncIterator[tuple[list[AgentProcess], RouterUnderTest, AcpClient, dict[str, str]]]:
    """Two reference agents behind the router, and a client with a session on each
    (the second new session goes to the less loaded agent), keyed by agent id."""
    async with (
        start_fleet(store, 2, *agent_args) as agents,
        start_router(backends_of(agents)) as router,
        AcpClient.connect(router.url) as client,
    ):
        await client.initialize()
        created = [await client.new_session(CWD) for _ in agents]
        sessions = {await answered_by(client, session): session for session in created}
        assert sorted(sessions) == ["agent-1", "agent-2"]
        yield agents, router, client, sessions


async def session_on(client: AcpClient, agent_url: str) -> str:
    """A session made directly on the agent at ``agent_url``, then resumed through the
    router (which locates it there): a session on a chosen backend, whatever placement
    would have chosen."""
    async with AcpClient.connect(agent_url) as direct:
        await direct.initialize()
        session = await direct.new_session(CWD)
    resumed = await client.request("session/resume", {"sessionId": session, "cwd": CWD})
    assert resumed.get("result") == {}, resumed
    return session


async def next_with_method(client: AcpClient, method: str) -> JsonObject:
    """The next incoming message calling ``method`` (updates on the way are skipped)."""
    while (message := await client.next_incoming()).get("method") != method:
        pass
    return message


async def test_an_oversize_prompt_fails_alone_and_the_connection_carries_on(
    tmp_path: Path,
) -> None:
    # the agents take frames up to 4 MiB; the router up to 16 MiB
    agent_limit = ("--max-message-bytes", str(4 * 1024 * 1024))
    async with two_agents(tmp_path, *agent_limit) as (_, router, client, sessions):
        first, second = sessions["agent-1"], sessions["agent-2"]
        huge = asyncio.create_task(client.prompt(first, "x" * (5 * 1024 * 1024)))
        small = asyncio.create_task(client.prompt(second, "hello"))
        failed, answered = await huge, await small

        assert failed["error"]["code"] == -32013, failed
        assert failed["error"]["data"]["backend"] == "agent-1"
        assert failed["error"]["data"]["retryable"] is True
        assert answered["result"] == {"stopReason": "end_turn"}
        # the session lives on: resumed, it answers a prompt of a size its agent takes
        resumed = await client.request("session/resume", {"sessionId": first, "cwd": CWD})
        assert resumed.get("result") == {}, resumed
        assert (await client.prompt(first, "smaller"))["result"] == {"stopReason": "end_turn"}
        assert client.ws.state is State.OPEN
        assert router.metric("acp_router_client_errors_total", code="-32013") == 1


async def test_a_slow_to_open_backend_does_not_delay_another(tmp_path: Path) -> None:
    gate = asyncio.Event()
    async with (
        start_agent(tmp_path, "a-healthy") as healthy,
        start_hostile("b-slow", gate=gate) as slow,
        start_router([("a-healthy", healthy.url), ("b-slow", slow.url)]) as router,
        AcpClient.connect(router.url) as client,
    ):
        await client.initialize()
        session = await session_on(client, healthy.url)
        held = asyncio.create_task(client.request("session/new", NEW))  # b-slow, less loaded
        async with asyncio.timeout(WAIT):
            await slow.wait_for(lambda: any(LINK_INITIALIZE in f for f in slow.link_frames))
        # b-slow's link is held open mid-handshake until the gate opens: the healthy
        # session's prompt is answered meanwhile
        assert (await client.prompt(session, "hello"))["result"] == {"stopReason": "end_turn"}
        assert not held.done()
        assert not gate.is_set()
        gate.set()
        created = await held
        assert created["result"]["sessionId"].startswith("sess_b-slow"), created


async def test_a_backend_killed_during_a_permission_request_withdraws_it(
    tmp_path: Path,
) -> None:
    async with two_agents(tmp_path) as (agents, _, client, sessions):
        doomed, survivor = sessions["agent-1"], sessions["agent-2"]
        turn = asyncio.create_task(client.prompt(doomed, "/permission"))
        asked = await next_with_method(client, "session/request_permission")
        agents[0].cli.process.kill()

        withdrawn = await next_with_method(client, "$/cancel_request")
        assert withdrawn == {
            "jsonrpc": "2.0",
            "method": "$/cancel_request",
            "params": {"requestId": asked["id"]},
        }
        failed = await turn
        assert failed["error"]["code"] == -32013
        # the client's late answer is dropped quietly; the connection carries on
        await client.respond(asked["id"], {"outcome": {"outcome": "selected", "optionId": "allow"}})
        assert (await client.prompt(survivor, "hi"))["result"] == {"stopReason": "end_turn"}
        assert [m for m in client.drain_incoming() if "method" not in m] == []
        assert client.ws.state is State.OPEN


async def test_a_backend_that_stops_reading_loses_its_link_not_the_connection(
    tmp_path: Path,
) -> None:
    megabyte = 1024 * 1024
    async with (
        start_agent(tmp_path, "a-healthy") as healthy,
        start_hostile("b-deaf", deaf=True) as deaf,
        start_router(
            [("a-healthy", healthy.url), ("b-deaf", deaf.url)],
            router={"max_message_bytes": 2 * megabyte},
        ) as router,
        AcpClient.connect(router.url) as client,
    ):
        await client.initialize()
        session = await session_on(client, healthy.url)
        stuck = asyncio.create_task(client.request("session/new", NEW))  # b-deaf, less loaded
        note = json.dumps(
            {"jsonrpc": "2.0", "method": "_vendor/note", "params": {"pad": "x" * megabyte}}
        )
        while not stuck.done():  # to b-deaf, the last backend used, until its link gives up
            await client.ws.send(note)
            await asyncio.sleep(0)  # let the answer in, if it came
        failed = await stuck
        assert failed["error"]["code"] == -32013, failed
        assert "not reading fast enough" in failed["error"]["data"]["reason"]
        assert (await client.prompt(session, "hello"))["result"] == {"stopReason": "end_turn"}
        assert client.ws.state is State.OPEN
