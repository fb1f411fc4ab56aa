"""A backend can only hurt what is routed to it (issue 8): one client connection with
sessions on several backends, one of them misbehaving on a real socket.

Each backend link has its own outbox and writer, so the client's read loop never
waits on a backend; a link that breaks, cannot open within
``router.connect_timeout_ms`` or cannot keep up is given up alone: its requests are
answered ``-32013``, its agent requests are withdrawn with ``$/cancel_request``, and
the client connection carries on.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path

from websockets.asyncio.client import connect
from websockets.protocol import State

from tests.fleet import RouterUnderTest, backends_of, start_fleet, start_router
from tests.hostile import LINK_INITIALIZE, start_hostile
from tests.support import WAIT, AcpClient, AgentProcess, JsonObject, answered_by, start_agent

CWD = "/work/project"
NEW = {"cwd": CWD, "mcpServers": []}


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


async def test_a_backend_that_never_completes_its_upgrade_fails_within_the_deadline() -> None:
    async with (
        start_hostile("stuck", stall_upgrades_from=1) as stuck,  # the control link gets in
        start_router([("stuck", stuck.url)], router={"connect_timeout_ms": 300}) as router,
        AcpClient.connect(router.url) as client,
    ):
        await client.initialize()
        for attempt in (1, 2):  # a later request is not stuck behind the first either
            failed = await client.request("session/new", NEW)
            assert failed["error"]["code"] == -32013, failed
            assert "not open within 300 ms" in failed["error"]["data"]["reason"]
            assert stuck.upgrades == 1 + attempt
        assert client.ws.state is State.OPEN


async def test_a_control_link_whose_upgrade_stalls_gives_up_and_retries() -> None:
    async with (
        start_hostile("stuck", stall_upgrades_from=0) as stuck,
        start_router([("stuck", stuck.url)], wait_for=0, router={"connect_timeout_ms": 200}),
        asyncio.timeout(WAIT),
    ):
        await stuck.wait_for(lambda: stuck.upgrades >= 2)


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


async def test_frames_to_one_backend_leave_in_the_order_the_client_sent_them() -> None:
    gate = asyncio.Event()
    async with (
        start_hostile("only", gate=gate) as backend,
        start_router([("only", backend.url)]) as router,
        AcpClient.connect(router.url) as client,
    ):
        await client.initialize()
        sent = [json.dumps({"jsonrpc": "2.0", "id": "new", "method": "session/new", "params": NEW})]
        for n in range(400):  # the first half queue up while the link opens
            if n % 3:
                call = {"jsonrpc": "2.0", "id": n, "method": "_vendor/seq", "params": {"n": n}}
                sent.append(json.dumps(call))
            else:
                sent.append(json.dumps({"jsonrpc": "2.0", "method": "_vendor/note", "params": [n]}))
        for text in sent[:200]:
            await client.ws.send(text)
        # the router reads frames in order: once it refuses a repeat of id 1 (still in
        # flight), the 200 frames before are queued on the link that is still opening
        repeat = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "_vendor/seq"})
        assert (await client.send_raw(repeat, expect_id=1))["error"]["code"] == -32600
        async with asyncio.timeout(WAIT):  # only the link's initialize, held at the gate
            await backend.wait_for(lambda: len(backend.link_frames) == 1)
        gate.set()
        for text in sent[200:]:
            await client.ws.send(text)
        async with asyncio.timeout(WAIT):
            await backend.wait_for(lambda: len(backend.link_frames) > len(sent))
        assert backend.link_frames[1:] == sent


async def test_frames_written_at_once_and_frames_queued_keep_one_order() -> None:
    """Small frames go straight to the link's socket while nothing waits; a large one (or
    one behind a full send buffer) is queued, and every frame after it queues behind it
    until the writer has drained them: one order either way."""
    async with (
        start_hostile("only") as backend,
        start_router([("only", backend.url)]) as router,
        AcpClient.connect(router.url) as client,
    ):
        await client.initialize()
        sent = [json.dumps({"jsonrpc": "2.0", "id": "new", "method": "session/new", "params": NEW})]
        for n in range(300):
            pad = "x" * (256 * 1024 if n % 25 == 0 else 8)  # some far above the direct limit
            sent.append(
                json.dumps({"jsonrpc": "2.0", "method": "_vendor/note", "params": [n, pad]})
            )
        for text in sent:
            await client.ws.send(text)
        async with asyncio.timeout(WAIT):
            await backend.wait_for(lambda: len(backend.link_frames) > len(sent))
        assert backend.link_frames[1:] == sent


async def test_the_client_connection_closes_only_for_its_own_faults() -> None:
    async with (
        start_hostile("only") as backend,
        start_router([("only", backend.url)], router={"max_message_bytes": 4096}) as router,
    ):
        # a binary frame is not one: the transport RFD says to ignore it (and it is counted)
        async with AcpClient.connect(router.url) as client:
            await client.ws.send(b"\x00 not text")
            assert "result" in await client.initialize()
            assert router.metric("acp_router_client_frames_ignored_total", reason="binary") == 1
            assert client.ws.state is State.OPEN
        async with connect(router.url, max_size=None) as ws:
            await ws.send("x" * 5000)
            async with asyncio.timeout(WAIT):
                await ws.wait_closed()
            assert ws.close_code == 1009
