"""Session ids that say where their session lives (``router.hinted_ids``) on real agents:
a fresh replica finds a session with one probe instead of a fan-out, and forged ids cost
what a backend confirms (tests/core/test_hinted_ids.py: the id itself)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from router.core.hinted_ids import hinted, read
from tests.core.support import forged
from tests.fleet import RouterUnderTest, backends_of, start_fleet, start_router
from tests.support import CWD, AcpClient, answered_by, direct_statuses, resume

HINTED = {"hinted_ids": True}


# -- on real agents -----------------------------------------------------------------------------


async def test_a_fresh_replica_finds_a_hinted_session_with_one_probe(tmp_path: Path) -> None:
    async with start_fleet(tmp_path, 3) as agents:
        urls = {a.agent_id: a.url for a in agents}
        async with start_router(backends_of(agents), router=HINTED) as first:
            async with AcpClient.connect(first.url) as client:
                await client.initialize()
                client_id = await client.new_session(CWD)
                session_id, home = read(client_id) or ("", "")
                assert home in urls, client_id
                assert await answered_by(client, client_id) == home
                # the agent knows its own id only
                statuses = await direct_statuses(urls, session_id)
                assert statuses[home] == "active"
        # a replica that never saw it (a restart, another pod): one probe, at home
        async with start_router(backends_of(agents), router=HINTED) as fresh:
            async with AcpClient.connect(fresh.url) as client:
                await client.initialize()
                assert (await resume(client, client_id)).get("result") == {}
                # the resume asked its home alone (on the old main: a fan-out over all 3); the
                # audit that looks for a second copy runs off the request path
                assert fresh.metric("acp_router_probe_fanout_size_sum") == 1
                assert await answered_by(client, client_id, "again") == home
                assert fresh.metric("acp_router_locate_cache_requests_total", result="audit") == 1
                # the router's status speaks of it by the client's id too
                assert (await client.status(client_id))["result"] == {"status": "active"}


async def test_sessions_made_directly_on_agents_keep_their_ids(tmp_path: Path) -> None:
    async with (
        start_fleet(tmp_path, 2) as agents,
        start_router(backends_of(agents), router=HINTED) as router,
    ):
        async with AcpClient.connect(agents[1].url) as direct:
            await direct.initialize()
            session_id = await direct.new_session(CWD)
        async with AcpClient.connect(router.url) as client:
            await client.initialize()
            assert (await resume(client, session_id)).get("result") == {}
            assert await answered_by(client, session_id) == agents[1].agent_id
            assert router.probes() == 2  # no hint in it: the pool is asked


async def test_hinted_ids_are_sealed_when_sessions_are_bound(tmp_path: Path) -> None:
    auth = {"tokens": ["alice-token"], "bind_sessions": True, "session_secret": "s" * 32}
    async with (
        start_fleet(tmp_path, 2) as agents,
        start_router(backends_of(agents), router=HINTED, auth=auth) as router,
    ):
        async with AcpClient.connect(router.url, token="alice-token") as client:
            await client.initialize()
            sealed = await client.new_session(CWD)
            hinted_id, _, _ = sealed.rpartition(".")
            assert read(hinted_id) is not None, sealed
            owner = await answered_by(client, sealed)
            _, home = read(hinted_id) or ("", "")
            assert home == owner


async def test_a_crafted_hinted_id_is_answered_and_the_connection_goes_on(tmp_path: Path) -> None:
    async with (
        start_fleet(tmp_path, 1) as agents,
        start_router(backends_of(agents), router=HINTED) as router,
        AcpClient.connect(router.url) as client,
    ):
        await client.initialize()
        client_id = await client.new_session(CWD)
        turn = asyncio.create_task(client.prompt(client_id, "/slow 1"))
        await client.next_incoming()  # the turn is under way: its first chunk
        # a home that is not base64url, with a valid check (on the old main: close 1011)
        crafted = await client.prompt(forged("sess_x", "\u00e9"), "hi")
        assert crafted["error"]["code"] in (-32002, -32010), crafted
        assert (await turn)["result"] == {"stopReason": "end_turn"}
        assert client.ws.close_code is None
        assert (await client.prompt(client_id, "again")).get("result") == {"stopReason": "end_turn"}
    assert router.metric("acp_router_client_errors_total", code="-32603") == 0


# -- a hint from a client is worth what a backend confirms ---------------------------------------


def _hints(router: RouterUnderTest) -> dict[str, str]:
    return {s: h.backend for s, h in router.pool.directory.hints.items()}


async def test_forged_hinted_ids_in_prompts_leave_the_hint_table_as_it_was(tmp_path: Path) -> None:
    """1,500 prompts naming sessions nobody has by hinted ids (no secret makes one): the
    hint table, bounded at 1,000, keeps what it had, so a session found before is found
    again with one probe, not a fan-out."""
    async with start_fleet(tmp_path, 3) as agents:
        async with AcpClient.connect(agents[2].url) as direct:
            await direct.initialize()
            session_id = await direct.new_session(CWD)  # a plain id, made on agent-3
        cache = {"max_entries": 1000}
        async with start_router(backends_of(agents), router=HINTED, cache=cache) as router:
            async with AcpClient.connect(router.url) as client:
                await client.initialize()
                assert (await resume(client, session_id)).get("result") == {}
            kept = _hints(router)
            assert kept == {session_id: "agent-3"}
            probes, fanouts = router.probes(), router.metric("acp_router_probe_fanouts_total")
            async with AcpClient.connect(router.url) as forger:
                await forger.initialize()
                for n in range(1500):
                    frame = {"jsonrpc": "2.0", "id": n, "method": "session/prompt"}
                    home = agents[n % 3].agent_id
                    frame["params"] = {"sessionId": hinted(f"forged-{n}", home), "prompt": []}
                    await forger.ws.send(json.dumps(frame))
                last = await forger.request("session/prompt", {"sessionId": hinted("x", "agent-1")})
                assert last["error"]["code"] == -32010, last  # each one: not attached here
            # on the code before: 1,000 forged homes, and the session found before pushed out
            assert _hints(router) == kept
            assert (router.probes(), router.metric("acp_router_probe_fanouts_total")) == (
                probes,
                fanouts,
            )
            async with AcpClient.connect(router.url) as client:
                await client.initialize()
                assert (await resume(client, session_id)).get("result") == {}
            assert router.probes() == probes + 1  # its hint: agent-3 alone
            assert router.metric("acp_router_probe_fanouts_total") == fanouts


async def test_forged_hinted_ids_in_resumes_cost_a_locate_each_and_plant_nothing(
    tmp_path: Path,
) -> None:
    """What routing.md says a forged hinted id costs: one locate of the forger's budget
    (its home, then the pool, as any id nobody knows costs: 3 probes in a pool of 3), and
    nothing once the budget is spent; the home it names is remembered nowhere."""
    budget = {**HINTED, "locates_per_minute_per_connection": 50}
    async with (
        start_fleet(tmp_path, 3) as agents,
        start_router(backends_of(agents), router=budget) as router,
        AcpClient.connect(router.url) as forger,
    ):
        await forger.initialize()
        for n in range(50):
            answer = await resume(forger, hinted(f"forged-{n}", "agent-1"))
            assert answer["error"]["code"] == -32002, answer
        assert router.probes() == 150
        assert router.metric("acp_router_probe_fanouts_total") == 50
        for n in range(50, 100):
            over = await resume(forger, hinted(f"forged-{n}", "agent-1"))
            assert over["error"]["code"] == -32014, over  # the budget is spent
        assert router.probes() == 150
        assert _hints(router) == {}  # on the code before: 50 hints at agent-1, for free
