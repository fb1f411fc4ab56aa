"""Two replicas agree on one home after a fault only one of them saw (issue 32): real
reference agents on separate stores, two real routers sharing nothing.

The first replica reaches the agents through relays, the second directly. The session's
home is partitioned from the first replica only, for longer than the grace: the first
replica fails the session over to another agent, while a client of the second replica
stays attached to the home's copy, which the second replica sees alive. The copies'
epochs (the fencing token every resume carries, kept by the agents) tell both replicas
which copy is the home: within a heartbeat the second replica finds its client on the
stale copy, closes that copy and tells the client to resume again, and every resume,
through either replica, lands on the one live copy.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from router.core.health import Health
from router.protocol.ids import SessionId
from tests.e2e.support import NAMES, active_ones, relayed_fleet, share_session
from tests.fleet import start_router
from tests.support import WAIT, AcpClient, answered_by, direct_statuses, resume, watching

CONTROL: dict[str, Any] = {
    "down_grace_ms": 1500,
    "reconnect_initial_ms": 20,
    "reconnect_max_ms": 100,
    "heartbeat_seconds": 0.3,
}


async def test_two_replicas_route_to_one_home_after_a_partition_one_of_them_saw(
    tmp_path: Path,
) -> None:
    async with relayed_fleet(tmp_path) as (agents, relays):
        direct = {a.agent_id: a.url for a in agents}
        relayed = [(name, relays[name].url) for name in NAMES]
        straight = [(name, direct[name]) for name in NAMES]
        async with (
            start_router(relayed, control=CONTROL) as first,
            start_router(straight, control=CONTROL) as second,
            AcpClient.connect(first.url) as one,
            AcpClient.connect(second.url) as other,
        ):
            await one.initialize()
            await other.initialize()
            session_id = await one.new_session()
            home = await answered_by(one, session_id)
            share_session(tmp_path, session_id, home)
            assert "result" in await resume(other, session_id)
            assert await answered_by(other, session_id, "me too") == home

            with watching(f"attached here, has stale copies on {home}") as found:
                await relays[home].refuse()  # seen by the first replica only
                moved = await answered_by(one, session_id, "again")  # failed over
                assert moved != home
                # the second replica finds its client on the stale copy within a beat
                async with asyncio.timeout(WAIT):
                    await found.seen.wait()
            refused = await other.prompt(session_id, "still there?")
            assert refused["error"]["code"] == -32010, refused
            assert "result" in await resume(other, session_id)
            assert await answered_by(other, session_id, "and now") == moved
            assert active_ones(await direct_statuses(direct, session_id)) == [moved]

            # a fresh client of either replica lands there too, partition or not
            for router in (first, second):
                async with AcpClient.connect(router.url) as fresh:
                    await fresh.initialize()
                    assert "result" in await resume(fresh, session_id)
                    assert await answered_by(fresh, session_id, "fresh") == moved

            await relays[home].open()  # healed: the home is back as the same process
            await first.wait_health(home, Health.UP)
            assert active_ones(await direct_statuses(direct, session_id)) == [moved]
            assert await answered_by(one, session_id, "after") == moved
            assert await answered_by(other, session_id, "after too") == moved
            assert second.metric("acp_router_split_brain_resolved_total", how="epoch") == 1


async def test_a_session_closed_on_its_agent_by_someone_else_is_let_go_within_a_beat(
    tmp_path: Path,
) -> None:
    async with relayed_fleet(tmp_path) as (agents, _):
        direct = {a.agent_id: a.url for a in agents}
        async with (
            start_router(list(direct.items()), control=CONTROL) as router,
            AcpClient.connect(router.url) as client,
        ):
            await client.initialize()
            session_id = await client.new_session()
            home = await answered_by(client, session_id)
            with watching("is no longer in memory there") as let_go:
                async with AcpClient.connect(direct[home]) as other:  # another replica, say
                    await other.initialize()
                    assert "result" in await resume(other, session_id)
                    closed = await other.request("session/close", {"sessionId": session_id})
                    assert closed.get("result") == {}, closed
                async with asyncio.timeout(WAIT):
                    await let_go.seen.wait()
            assert router.metric("acp_router_attached_checks_total", result="denied") == 1
            assert router.pool.directory.attached_to(SessionId(session_id)) == set()
            refused = await client.prompt(session_id, "still mine?")
            assert refused["error"]["code"] == -32010, refused
