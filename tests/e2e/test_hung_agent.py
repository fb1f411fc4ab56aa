"""A hung agent costs nobody (issue 32): one of three reference agents is SIGSTOPped (it
accepts TCP and answers nothing). New sessions are answered elsewhere within seconds,
sessions on the other agents resume as always, the copy the hung agent makes when it
wakes is closed, and the control link's heartbeat marks it without any traffic."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Iterator
from pathlib import Path

from router.core.health import Health
from router.protocol.ids import BackendId
from tests.fleet import start_fleet, start_router
from tests.support import WAIT, AcpClient, AgentProcess, answered_by, resume, watching

#: the bound of the issue: each session/new answered within this, a frozen agent among three
ANSWERED_WITHIN = 3.0


@contextlib.contextmanager
def frozen(agent: AgentProcess) -> Iterator[None]:
    """SIGSTOP ``agent`` for the block (SIGCONT after, so it can be stopped as usual)."""
    pid = agent.cli.process.pid
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


async def test_new_sessions_and_resumes_carry_on_beside_a_frozen_agent(tmp_path: Path) -> None:
    async with start_fleet(tmp_path, 3) as agents:
        backends = [(a.agent_id, a.url) for a in agents]
        async with start_router(backends) as router:
            # sessions on each agent first, made while all three answer
            homes: dict[str, str] = {}
            async with AcpClient.connect(router.url) as maker:
                await maker.initialize()
                while len(set(homes.values())) < 3:
                    session_id = await maker.new_session()
                    homes[session_id] = await answered_by(maker, session_id)
            others = {s: home for s, home in homes.items() if home != "agent-1"}

            with frozen(agents[0]):
                for n in range(6):
                    async with AcpClient.connect(router.url) as client:
                        await client.initialize()
                        async with asyncio.timeout(ANSWERED_WITHIN):
                            made = await client.request(
                                "session/new", {"cwd": "/work/project", "mcpServers": []}
                            )
                        assert "sessionId" in made.get("result", {}), (n, made)
                        assert await answered_by(client, made["result"]["sessionId"]) != "agent-1"
                for session_id, home in others.items():
                    async with AcpClient.connect(router.url) as client:
                        await client.initialize()
                        async with asyncio.timeout(ANSWERED_WITHIN):
                            assert "result" in await resume(client, session_id)
                        assert await answered_by(client, session_id, "still here") == home
            assert router.pool.health(BackendId("agent-1")) is not Health.GONE  # frozen is not gone


async def test_the_copy_a_frozen_agent_makes_when_it_wakes_is_closed(tmp_path: Path) -> None:
    async with (
        start_fleet(tmp_path, 2) as agents,
        start_router(
            [(a.agent_id, a.url) for a in agents], router={"connect_timeout_ms": 8000}
        ) as router,
        AcpClient.connect(router.url) as client,
    ):
        await client.initialize()
        with (
            watching("placed on agent-2 instead") as replaced,
            watching("closed the stale copy of session") as closed,
        ):
            with frozen(agents[0]):
                # equal backends alternate: one of the first two goes to agent-1
                for _ in range(2):
                    async with asyncio.timeout(ANSWERED_WITHIN):
                        made = await client.new_session()
                    assert await answered_by(client, made) == "agent-2"
                async with asyncio.timeout(WAIT):
                    await replaced.seen.wait()
            # awake within its link's deadline: it answers the session/new that link held
            async with asyncio.timeout(WAIT):
                await closed.seen.wait()
        (line,) = closed.messages
        late = line.split("session ", 1)[1].split(" ", 1)[0]
        async with AcpClient.connect(agents[0].url) as direct:
            await direct.initialize()
            assert (await direct.status(late))["result"]["status"] == "inactive"
        assert router.metric("acp_router_split_brain_resolved_total", how="unanswered") == 1
        assert router.metric("acp_router_new_sessions_replaced_total", backend="agent-1") == 1
        assert len(client.drain_incoming()) == 0  # nothing of the late copy reached the client


async def test_the_heartbeat_marks_a_frozen_control_link_within_a_few_beats(
    tmp_path: Path,
) -> None:
    beat = 0.5
    async with start_fleet(tmp_path, 3) as agents:
        backends = [(a.agent_id, a.url) for a in agents]
        async with start_router(backends, control={"heartbeat_seconds": beat}) as router:
            with frozen(agents[0]):
                # nothing is asked of it: only the heartbeat can tell
                async with asyncio.timeout(4 * beat):
                    await router.wait_health("agent-1", Health.UNKNOWN)
                assert router.pool.health(BackendId("agent-2")) is Health.UP
