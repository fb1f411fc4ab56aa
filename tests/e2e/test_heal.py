"""After a fault ends, the fleet comes back to one live copy of each session (issue 23):
real reference agents on separate stores, each behind a relay, real routers.

The home of a session is partitioned (its relay refuses and cuts) for longer than the
grace; failover resumes the session on another agent (its store has a copy of the
session's file: separate stores, so nothing fences the two copies but the router). The
partition heals: the home comes back as the same process, still holding its copy.
Within a few seconds exactly one agent reports the session ``active``, and resumes
through this router and through a fresh replica land where the session's holder is.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from router.core.health import Health
from tests.e2e.support import NAMES, active_ones, relayed_fleet, share_session
from tests.fleet import RouterUnderTest, start_router
from tests.support import AcpClient, answered_by, direct_statuses, resume

#: short enough for a test, long against the reconnects (router_settings: 20-200 ms)
CONTROL: dict[str, Any] = {
    "down_grace_ms": 1500,
    "reconnect_initial_ms": 20,
    "reconnect_max_ms": 100,
}


@pytest.mark.parametrize("hinted_ids", [False, True])
async def test_a_backend_given_up_and_back_keeps_no_live_copy_of_what_moved(
    tmp_path: Path, hinted_ids: bool
) -> None:
    async with relayed_fleet(tmp_path) as (agents, relays):
        direct = {a.agent_id: a.url for a in agents}
        backends = [(name, relays[name].url) for name in NAMES]
        router_section: dict[str, Any] = {"hinted_ids": hinted_ids}
        failover = {"enabled": True}
        async with start_router(
            backends, control=CONTROL, failover=failover, router=router_section
        ) as router:
            async with AcpClient.connect(router.url) as client:
                await client.initialize()
                session_id = await client.new_session()
                home = await answered_by(client, session_id)
                agent_session = session_id.split("@", 1)[0]
                share_session(tmp_path, agent_session, home)

                await relays[home].refuse()  # partitioned past the grace: given up
                holder = await answered_by(client, session_id, "again")  # failover
                assert holder != home
                assert active_ones(await direct_statuses(direct, agent_session)) == sorted(
                    [home, holder]
                )  # the home's copy lives on behind the partition

                await relays[home].open()  # healed: the same process, its copy still live
                await _wait_health(router, home, Health.UP)  # fenced first, then up
                assert active_ones(await direct_statuses(direct, agent_session)) == [holder]
                assert router.metric("acp_router_split_brain_resolved_total", how="fenced") == 1
                assert await answered_by(client, session_id, "still") == holder

            async with AcpClient.connect(router.url) as again:
                await again.initialize()
                assert "result" in await resume(again, session_id)
                assert await answered_by(again, session_id, "here") == holder

        # a fresh replica knows nothing of the fault: it finds the one live copy
        async with start_router(
            backends, control=CONTROL, failover=failover, router=router_section
        ) as fresh:
            async with AcpClient.connect(fresh.url) as client:
                await client.initialize()
                assert "result" in await resume(client, session_id)
                assert await answered_by(client, session_id, "fresh") == holder
            assert fresh.metric("acp_router_split_brain_detected_total") == 0
        assert active_ones(await direct_statuses(direct, agent_session)) == [holder]


async def _wait_health(router: RouterUnderTest, backend: str, health: Health) -> None:
    await router.wait_health(backend, health)
