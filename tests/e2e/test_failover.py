"""The router keeps its one promise through ordinary weather, against real processes:
a session runs on one instance, and a client that comes back finds it (issue 7).

* A control link that drops is not a backend that is gone: while a relay holds the
  reconnect silent, resumes fail closed (retryable), and the session comes back on its
  holder afterwards.
* Oversized probe material (a 5 MB ``sessionId`` or ``cwd``) is refused to its sender and
  never reaches the control links.

tests/server/test_failover.py: a split brain is seen, among scripted backends.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

from router.core.health import Health
from tests.fleet import RouterUnderTest, backends_of, start_fleet, start_router
from tests.relay import Relay, start_relay
from tests.support import (
    CWD,
    WAIT,
    AcpClient,
    JsonObject,
    answered_by,
    direct_statuses,
    resume,
    start_agent,
)

FIVE_MB = 5 * 1024 * 1024


async def test_oversized_session_ids_and_cwds_are_refused_without_dropping_a_link(
    tmp_path: Path,
) -> None:
    async with start_fleet(tmp_path, 2) as agents, start_router(backends_of(agents)) as router:
        async with AcpClient.connect(router.url) as client:
            await client.initialize()
            session_id = await client.new_session(CWD)
            huge = "s" * FIVE_MB
            oversized: list[tuple[str, JsonObject]] = [
                ("session/status", {"sessionId": huge}),
                ("session/resume", {"sessionId": huge, "cwd": CWD}),
                ("session/load", {"sessionId": huge, "cwd": CWD, "mcpServers": []}),
                ("session/close", {"sessionId": huge}),
                ("session/list", {"cwd": "/" + "x" * FIVE_MB}),
                ("session/list", {"cursor": "c" * FIVE_MB}),
            ]
            for method, params in oversized:
                answer = await client.request(method, params)
                assert answer["error"]["code"] == -32602, (method, answer["error"])
            # every control link stayed up: the pool still answers from both backends
            assert (await client.status(session_id))["result"] == {"status": "active"}
            listed = await client.request("session/list", {"cwd": CWD})
            assert session_id in {s["sessionId"] for s in listed["result"]["sessions"]}
        for agent in agents:
            assert (
                router.metric(
                    "acp_router_backend_state_changes_total", backend=agent.agent_id, to="down"
                )
                == 0
            )
            assert (
                router.metric("acp_router_probes_total", backend=agent.agent_id, result="unknown")
                == 0
            )


# -- down is not gone --------------------------------------------------------------------------

#: stalled reconnects fail fast, so a test sees several during one outage
FAST_CONTROL = {"connect_timeout_ms": 300}


async def _session_on(url: str) -> str:
    """A session created directly on the agent at ``url``: active in its memory."""
    async with AcpClient.connect(url) as direct:
        await direct.initialize()
        return await direct.new_session(CWD)


async def _cut_and_stall(router: RouterUnderTest, relay: Relay) -> None:
    relay.stall()
    await relay.cut()
    await router.wait_health("agent-1", Health.UNKNOWN)


async def test_a_link_flap_fails_resumes_closed_and_the_session_comes_back_to_its_holder(
    tmp_path: Path,
) -> None:
    async with (
        start_fleet(tmp_path, 2) as agents,
        start_relay(agents[0].url) as relay,
    ):
        urls = {a.agent_id: a.url for a in agents}
        backends = [("agent-1", relay.url), ("agent-2", agents[1].url)]
        # without failover: a client's own resume of the session is answered at once
        off = {"enabled": False}
        async with start_router(backends, router=FAST_CONTROL, failover=off) as router:
            session_id = await _session_on(agents[0].url)
            async with AcpClient.connect(router.url) as client:
                await client.initialize()
                assert (await resume(client, session_id)).get("result") == {}
                assert await answered_by(client, session_id) == "agent-1"

                await _cut_and_stall(router, relay)
                assert (
                    router.metric("acp_router_backend_state", backend="agent-1", state="unknown")
                    == 1
                )
                # the client keeps resuming while the router's reconnects are held silent
                for stalled in range(1, 4):
                    await relay.wait_stalled(stalled, WAIT)
                    answer = await resume(client, session_id)
                    assert answer["error"]["code"] == -32012, answer
                    assert answer["error"]["data"]["retryable"] is True
                    assert answer["error"]["data"]["backends"] == ["agent-1"]
                    assert (await direct_statuses({"agent-2": urls["agent-2"]}, session_id)) == {
                        "agent-2": "inactive"
                    }, "a second instance became active"
                listed = await client.request("session/list", {})
                assert listed["result"]["_meta"] == {"unlistedBackends": ["agent-1"]}

                await relay.open()
                await router.wait_health("agent-1", Health.UP)
                assert (await resume(client, session_id)).get("result") == {}
                assert await answered_by(client, session_id, "after") == "agent-1"
            assert await direct_statuses(urls, session_id) == {
                "agent-1": "active",
                "agent-2": "inactive",
            }
            assert router.metric("acp_router_split_brain_detected_total") == 0
            assert router.metric("acp_router_backend_restarts_total", backend="agent-1") == 0


async def test_a_backend_unreachable_past_the_grace_is_gone(tmp_path: Path) -> None:
    async with start_fleet(tmp_path, 2) as agents, start_relay(agents[0].url) as relay:
        backends = [("agent-1", relay.url), ("agent-2", agents[1].url)]
        control = {"down_grace_ms": 500, "reconnect_max_ms": 150}
        async with start_router(backends, router=FAST_CONTROL, control=control) as router:
            session_id = await _session_on(agents[0].url)
            await _cut_and_stall(router, relay)
            await router.wait_health("agent-1", Health.GONE)  # seen at a failed reconnect
            assert router.metric("acp_router_backend_state", backend="agent-1", state="gone") == 1
            async with AcpClient.connect(router.url) as client:
                await client.initialize()
                assert (await resume(client, session_id)).get("result") == {}
                assert await answered_by(client, session_id) == "agent-2"


async def test_a_backend_that_comes_back_as_a_new_process_is_seen(tmp_path: Path) -> None:
    async with start_fleet(tmp_path, 2) as agents, start_relay(agents[0].url) as relay:
        backends = [("agent-1", relay.url), ("agent-2", agents[1].url)]
        async with start_router(backends, router=FAST_CONTROL) as router:
            session_id = await _session_on(agents[0].url)
            async with AcpClient.connect(router.url) as client:
                await client.initialize()
                assert (await resume(client, session_id)).get("result") == {}
            await _cut_and_stall(router, relay)
            await agents[0].stop()  # the process holding the session dies unseen
            async with start_agent(tmp_path, "agent-1") as reborn:
                await relay.open(int(reborn.url.rsplit(":", 1)[1].split("/")[0]))
                await router.wait_health("agent-1", Health.UP)
                assert router.metric("acp_router_backend_restarts_total", backend="agent-1") == 1
                async with AcpClient.connect(router.url) as client:
                    await client.initialize()
                    # nobody holds it now: it resumes from the shared store, on one instance
                    assert (await resume(client, session_id)).get("result") == {}
                    holder = await answered_by(client, session_id)
                statuses = await direct_statuses(
                    {"agent-1": reborn.url, "agent-2": agents[1].url}, session_id
                )
                assert [a for a, s in statuses.items() if s == "active"] == [holder]


# -- backends without session/status --------------------------------------------------------------


async def test_sessions_on_backends_without_status_are_found_on_resume(tmp_path: Path) -> None:
    # own stores: a session exists only where it was created, as with most real agents
    async with contextlib.AsyncExitStack() as stack:
        agents = [
            await stack.enter_async_context(start_agent(tmp_path / name, name, "--no-status"))
            for name in ("agent-1", "agent-2", "agent-3")
        ]
        async with AcpClient.connect(agents[0].url) as direct:
            caps = (await direct.initialize())["result"]["agentCapabilities"]
            assert "status" not in caps["sessionCapabilities"]
            assert (await direct.status("sess_x"))["error"]["code"] == -32601
        router = await stack.enter_async_context(start_router(backends_of(agents)))
        owners: dict[str, str] = {}
        async with AcpClient.connect(router.url) as first:
            await first.initialize()
            for _ in range(4):
                session_id = await first.new_session(CWD)
                owners[session_id] = await answered_by(first, session_id)
        assert len(set(owners.values())) > 1, "the sessions were spread"

        for session_id, owner in owners.items():
            async with AcpClient.connect(router.url) as client:
                await client.initialize()
                assert (await resume(client, session_id)).get("result") == {}
                assert await answered_by(client, session_id, "again") == owner
                # attached here: active, though no backend can say so
                assert (await client.status(session_id))["result"] == {"status": "active"}
        # the router remembered where it placed each: one try per resume
        assert router.metric("acp_router_resume_attempts_total", attempt="first") == 4
        assert router.metric("acp_router_resume_attempts_total", attempt="retry") == 0
        assert router.metric("acp_router_locate_total", outcome="remembered") == 4

        # a replica that never saw them tries the backends in rendezvous order
        replica = await stack.enter_async_context(start_router(backends_of(agents)))
        for session_id, owner in owners.items():
            async with AcpClient.connect(replica.url) as client:
                await client.initialize()
                assert (await resume(client, session_id)).get("result") == {}
                assert await answered_by(client, session_id, "elsewhere") == owner
        retries = replica.metric("acp_router_resume_attempts_total", attempt="retry")
        assert retries <= 2 * len(owners), "at most one -32002 per other backend"
        assert replica.metric("acp_router_probes_total", backend="agent-1", result="unknown") == 0


# -- [failover]: the router resumes a lost session where it lives now --------------------------------


async def test_with_failover_the_next_prompt_after_a_kill_is_answered_by_another_agent(
    tmp_path: Path,
) -> None:
    failover = {"enabled": True}
    control = {"down_grace_ms": 300, "reconnect_initial_ms": 20, "reconnect_max_ms": 100}
    async with (
        start_fleet(tmp_path, 2) as agents,
        start_router(backends_of(agents), control=control, failover=failover) as router,
    ):
        async with AcpClient.connect(router.url) as client:
            await client.initialize()
            session_id = await client.new_session(CWD)
            owner = await answered_by(client, session_id)
            (dying,) = [a for a in agents if a.agent_id == owner]
            (survivor,) = [a.agent_id for a in agents if a is not dying]
            turn = asyncio.create_task(client.prompt(session_id, "/slow 60"))
            await client.next_incoming()
            dying.cli.process.kill()
            # the one error the client sees: the turn that was in flight
            cut = await turn
            assert cut["error"]["code"] == -32013, cut
            # the next prompt on the same connection waits for the failover, then is
            # answered where the session lives now (the shared store)
            assert await answered_by(client, session_id, "again") == survivor
            assert router.metric("acp_router_failovers_total", result="ok") == 1
            assert router.metric("acp_router_resume_total", backend=survivor, result="ok") == 1
            # and it is attached there: the router's status says active
            assert (await client.status(session_id))["result"] == {"status": "active"}


async def test_without_failover_a_lost_session_must_be_resumed_by_the_client(
    tmp_path: Path,
) -> None:
    off = {"enabled": False}
    async with (
        start_fleet(tmp_path, 2) as agents,
        start_router(backends_of(agents), failover=off) as router,
    ):
        async with AcpClient.connect(router.url) as client:
            await client.initialize()
            session_id = await client.new_session(CWD)
            owner = await answered_by(client, session_id)
            (dying,) = [a for a in agents if a.agent_id == owner]
            dying.cli.process.kill()
            await router.wait_pinned({})
            again = await client.prompt(session_id, "hello")
            assert again["error"]["code"] == -32010, again
            assert router.metric("acp_router_failovers_total", result="ok") == 0


async def test_a_failover_waits_no_longer_than_its_bound(tmp_path: Path) -> None:
    # the backend neither comes back nor lapses (a long grace): the held prompt goes on
    # as for a session not attached, after failover.wait_ms
    failover = {"enabled": True, "wait_ms": 300}
    async with (
        start_fleet(tmp_path, 2) as agents,
        start_router(backends_of(agents), failover=failover) as router,
    ):
        async with AcpClient.connect(router.url) as client:
            await client.initialize()
            session_id = await client.new_session(CWD)
            owner = await answered_by(client, session_id)
            (dying,) = [a for a in agents if a.agent_id == owner]
            dying.cli.process.kill()
            await router.wait_pinned({})  # the client's link to it has ended
            again = await client.prompt(session_id, "hello")
            assert again["error"]["code"] == -32010, again
            assert router.metric("acp_router_failovers_total", result="timeout") == 1
