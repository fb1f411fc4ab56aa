"""A session has one home, and the router says where it is truthfully (issue 15), on real
agents and real sockets:

* a backend behind a proxy that refuses new connections, while this router's own client
  link still carries a turn there, keeps its session: no resume lands elsewhere, and the
  turn completes;
* the router's ``session/status`` after a close is the agents' ``inactive``;
* a link opened ahead of a resume while ``authenticate`` is in flight joins it;
* new sessions spread by distinct sessions, after earlier traffic too;
* the router's own request ids are refused.

tests/server/test_one_home.py: a resume whose link is lost, and a backend's own
``session/list`` error, against scripted backends.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

from tests.fleet import backends_of, start_fleet, start_router
from tests.relay import start_relay
from tests.support import (
    CWD,
    WAIT,
    AcpClient,
    answered_by,
    direct_statuses,
    resume,
    start_agent,
)


async def _session_on(url: str) -> str:
    """A session created directly on the agent at ``url`` (active in its memory)."""
    async with AcpClient.connect(url) as direct:
        await direct.initialize()
        return await direct.new_session(CWD)


async def test_a_refusing_backend_whose_link_carries_a_turn_keeps_its_session(
    tmp_path: Path,
) -> None:
    async with start_fleet(tmp_path, 2) as agents, start_relay(agents[0].url) as relay:
        urls = {a.agent_id: a.url for a in agents}
        backends = [("agent-1", relay.url), ("agent-2", agents[1].url)]
        # a short grace: past it, only the live client link keeps agent-1 from being gone
        control = {"down_grace_ms": 200, "reconnect_initial_ms": 20, "reconnect_max_ms": 50}
        async with start_router(backends, control=control) as router:
            await router.wait_backends(2)  # the relay's first connection: the control link
            session_id = await _session_on(agents[0].url)
            async with AcpClient.connect(router.url) as holder:
                await holder.initialize()
                assert (await resume(holder, session_id)).get("result") == {}
                turn = asyncio.create_task(holder.prompt(session_id, "/slow 2", timeout=30))
                await holder.next_incoming()  # the turn is streaming through the relay

                # the proxy refuses new connections and drops only the control link
                relay.stop_listening()
                relay.cut_one(0)
                await router.wait_backends(1)
                refused_since = router.pool.now()
                trials = 0
                async with asyncio.timeout(WAIT):
                    # six trials at least, and on until past the grace
                    while trials < 6 or router.pool.now() - refused_since < 0.4:
                        trials += 1
                        async with AcpClient.connect(router.url) as other:
                            await other.initialize()
                            answer = await resume(other, session_id)
                        # it is active on agent-1 (the live link says so); the new link
                        # there is refused: retryable, never a second life on agent-2
                        assert answer["error"]["code"] == -32013, (trials, answer)
                        assert answer["error"]["data"]["retryable"] is True
                        assert answer["error"]["data"]["backend"] == "agent-1"
                assert (await direct_statuses({"agent-2": urls["agent-2"]}, session_id)) == {
                    "agent-2": "inactive"
                }
                # the router's own status says where it lives
                assert (await holder.status(session_id))["result"] == {"status": "active"}

                done = await turn
                assert done.get("result") == {"stopReason": "end_turn"}, done
            assert await direct_statuses(urls, session_id) == {
                "agent-1": "active",
                "agent-2": "inactive",
            }
            assert router.metric("acp_router_split_brain_detected_total") == 0
            assert router.metric("acp_router_resume_total", backend="agent-2", result="ok") == 0


async def test_the_routers_status_after_a_close_is_inactive(tmp_path: Path) -> None:
    async with start_fleet(tmp_path, 2) as agents, start_router(backends_of(agents)) as router:
        urls = {a.agent_id: a.url for a in agents}
        async with (
            AcpClient.connect(router.url) as owner,
            AcpClient.connect(router.url) as closer,
        ):
            await owner.initialize()
            await closer.initialize()
            session_id = await owner.new_session(CWD)
            assert (await owner.status(session_id))["result"] == {"status": "active"}
            # closed through another connection of the router: the owner is still attached
            closed = await closer.request("session/close", {"sessionId": session_id})
            assert closed.get("result") == {}, closed
            assert set((await direct_statuses(urls, session_id)).values()) == {"inactive"}
            # on the old main the attachment overrode every agent: "active"
            assert (await owner.status(session_id))["result"] == {"status": "inactive"}
            assert (await closer.status(session_id))["result"] == {"status": "inactive"}
            # closed through the connection that has it attached: detached at once
            assert (await resume(owner, session_id)).get("result") == {}
            assert (await owner.request("session/close", {"sessionId": session_id}))["result"] == {}
            assert (await owner.status(session_id))["result"] == {"status": "inactive"}
            await asyncio.sleep(0)
        await router.wait_detached()


async def test_a_link_opened_ahead_during_authenticate_joins_the_round(tmp_path: Path) -> None:
    key = {"methodId": "key"}
    async with (
        start_fleet(tmp_path, 2, "--require-auth", "key") as agents,
        start_router(backends_of(agents)) as router,
    ):
        async with AcpClient.connect(router.url) as first:
            await first.initialize()
            assert "result" in await first.request("authenticate", key)
            session_id = await first.new_session(CWD)
            home = await answered_by(first, session_id)
            async with AcpClient.connect(router.url) as client:
                await client.initialize()
                # pipelined: authenticate goes to where a new session would go now (the
                # other backend, the less loaded), and the resume's link to the session's
                # home opens ahead while the round is in flight
                authenticated, resumed = await asyncio.gather(
                    client.request("authenticate", key),
                    client.request("session/resume", {"sessionId": session_id, "cwd": CWD}),
                )
                assert "result" in authenticated, authenticated
                # on the old main: -32000 from an agent that was never authenticated
                assert resumed.get("result") == {}, resumed
                assert await answered_by(client, session_id) == home
                assert router.pool.directory.pinned == {"agent-1": 2, "agent-2": 2}


async def test_twelve_one_session_clients_after_earlier_traffic_land_evenly(
    tmp_path: Path,
) -> None:
    async with start_fleet(tmp_path, 3) as agents, start_router(backends_of(agents)) as router:
        # earlier traffic: one session, created, then resumed from another connection,
        # both still attached
        async with (
            AcpClient.connect(router.url) as maker,
            AcpClient.connect(router.url) as resumer,
        ):
            await maker.initialize()
            earlier = await maker.new_session(CWD)
            await resumer.initialize()
            assert (await resume(resumer, earlier)).get("result") == {}
            landed: Counter[str] = Counter()
            for _ in range(12):
                async with AcpClient.connect(router.url) as client:
                    await client.initialize()
                    landed[await answered_by(client, await client.new_session(CWD))] += 1
        # on the old main the earlier session weighed three times: 5/5/2
        assert all(3 <= n <= 5 for n in landed.values()), landed


async def test_the_routers_own_request_ids_are_refused(tmp_path: Path) -> None:
    async with (
        start_agent(tmp_path, "agent-1") as agent,
        start_router(backends_of([agent])) as router,
    ):
        async with AcpClient.connect(router.url) as client:
            await client.initialize()
            answer = await client.request(
                "session/new",
                {"cwd": CWD, "mcpServers": []},
                request_id="acp-router:authenticate:1",
            )
            assert answer["error"]["code"] == -32600, answer
            assert answer["id"] == "acp-router:authenticate:1"
            # the connection carries on
            assert await answered_by(client, await client.new_session(CWD)) == "agent-1"
