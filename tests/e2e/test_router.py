"""The router end to end: real router on loopback, real reference-agent processes,
a raw WebSocket client (the ``websockets`` library, not project code)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from router.core.health import Health
from router.core.placement import Node, Ranking
from router.protocol.ids import BackendId
from router.server.process.serving import drain
from tests.fleet import (
    backends_of,
    never_answer,
    start_fleet,
    start_router,
    start_scripted,
)
from tests.support import (
    CWD,
    WAIT,
    AcpClient,
    JsonObject,
    answered_by,
    chunk_texts,
    direct_statuses,
    resume,
    speaker,
    start_agent,
)

# -- routing to where the session is -----------------------------------------------------------


async def test_resume_from_another_connection_lands_on_the_active_instance(tmp_path: Path) -> None:
    async with start_fleet(tmp_path, 3) as agents, start_router(backends_of(agents)) as router:
        owners: dict[str, str] = {}
        async with AcpClient.connect(router.url) as first:
            await first.initialize()
            # Keep creating until one session lives where the hash default would NOT put
            # it: only the probe can find that one.
            while len(owners) < 3 or all(
                router.pool.fleet.ranking.rank(s)[0] == o for s, o in owners.items()
            ):
                assert len(owners) < 30
                session_id = await first.new_session(CWD)
                owners[session_id] = await answered_by(first, session_id)
        assert len(set(owners.values())) == 3, "new sessions are spread over the pool"

        async with AcpClient.connect(router.url) as second:
            await second.initialize()
            for session_id, owner in owners.items():
                assert (await resume(second, session_id)).get("result") == {}
                assert await answered_by(second, session_id, "again") == owner

        urls = {a.agent_id: a.url for a in agents}
        for session_id, owner in owners.items():
            statuses = await direct_statuses(urls, session_id)
            assert [a for a, s in statuses.items() if s == "active"] == [owner]
        assert router.metric("acp_router_locate_total", outcome="active") == len(owners)
        # the router remembered where it placed each session: one probe per resume
        hits = router.metric("acp_router_locate_cache_requests_total", result="hit")
        assert hits == len(owners)
        assert router.metric("acp_router_locate_cache_entries") == len(owners)
        assert router.metric("acp_router_probe_fanout_size_count") == len(owners)
        assert router.metric("acp_router_probe_fanout_size_sum") == len(owners)


async def test_a_stale_hint_is_probed_then_the_pool_fanned_out(tmp_path: Path) -> None:
    async with start_fleet(tmp_path, 3) as agents, start_router(backends_of(agents)) as router:
        async with AcpClient.connect(router.url) as client:
            await client.initialize()
            session_id = await client.new_session(CWD)
            first_owner = await answered_by(client, session_id)
            assert (await client.request("session/close", {"sessionId": session_id}))[
                "result"
            ] == {}
        # behind the router's back, another instance takes the session over
        other = next(a for a in agents if a.agent_id != first_owner)
        async with AcpClient.connect(other.url) as direct:
            await direct.initialize()
            assert (await resume(direct, session_id)).get("result") == {}
            async with AcpClient.connect(router.url) as client:
                await client.initialize()
                assert (await resume(client, session_id)).get("result") == {}
                assert await answered_by(client, session_id) == other.agent_id
                # the link opened ahead to the hinted backend (a wrong guess) is closed;
                # the connection keeps only the link it uses
                await router.wait_pinned({other.agent_id: 1})
        assert router.metric("acp_router_locate_cache_requests_total", result="stale") == 1
        assert router.metric("acp_router_probe_fanout_size_sum") == 3


async def test_load_through_the_router_replays_history_before_answering(tmp_path: Path) -> None:
    async with start_fleet(tmp_path, 2) as agents, start_router(backends_of(agents)) as router:
        async with AcpClient.connect(router.url) as first:
            await first.initialize()
            session_id = await first.new_session(CWD)
            owner = await answered_by(first, session_id, "remember this")
        async with AcpClient.connect(router.url) as second:
            await second.initialize()
            loaded = await second.request(
                "session/load", {"sessionId": session_id, "cwd": CWD, "mcpServers": []}
            )
            assert loaded.get("result") == {}
            replayed = [
                (m["params"]["update"]["sessionUpdate"], m["params"]["update"]["content"]["text"])
                for m in second.drain_incoming()
            ]
            assert replayed == [
                ("user_message_chunk", "remember this"),
                ("agent_message_chunk", f"[{owner}] remember this"),
            ]
            assert await answered_by(second, session_id) == owner


async def test_burst_of_resumes_of_an_inactive_session_lands_on_one_instance(
    tmp_path: Path,
) -> None:
    async with start_fleet(tmp_path, 3) as agents, start_router(backends_of(agents)) as router:
        async with AcpClient.connect(router.url) as creator:
            await creator.initialize()
            session_id = await creator.new_session(CWD)
            await answered_by(creator, session_id)
            closed = await creator.request("session/close", {"sessionId": session_id})
            assert closed.get("result") == {}
        urls = {a.agent_id: a.url for a in agents}
        assert set((await direct_statuses(urls, session_id)).values()) == {"inactive"}

        async def resume_and_prompt() -> str:
            async with AcpClient.connect(router.url) as client:
                await client.initialize()
                assert (await resume(client, session_id)).get("result") == {}
                return await answered_by(client, session_id)

        owners = await asyncio.gather(*(resume_and_prompt() for _ in range(12)))
        assert len(set(owners)) == 1, owners
        assert owners[0] == router.first_ranked(session_id), "the best-ranked knower"
        statuses = await direct_statuses(urls, session_id)
        assert [a for a, s in statuses.items() if s == "active"] == [owners[0]]


async def test_two_router_replicas_agree_without_sharing_state(tmp_path: Path) -> None:
    async with (
        start_fleet(tmp_path, 3) as agents,
        start_router(backends_of(agents)) as one,
        start_router(backends_of(agents)) as other,
    ):
        async with AcpClient.connect(one.url) as creator:
            await creator.initialize()
            session_id = await creator.new_session(CWD)
            await answered_by(creator, session_id)
            assert (await creator.request("session/close", {"sessionId": session_id}))[
                "result"
            ] == {}

        async def through(router_url: str) -> str:
            async with AcpClient.connect(router_url) as client:
                await client.initialize()
                assert (await resume(client, session_id)).get("result") == {}
                return await answered_by(client, session_id)

        owners = await asyncio.gather(*(through(r.url) for r in (one, other) * 6))
        assert len(set(owners)) == 1, owners
        statuses = await direct_statuses({a.agent_id: a.url for a in agents}, session_id)
        assert [a for a, s in statuses.items() if s == "active"] == [owners[0]]


async def test_located_sessions_stay_put_when_a_backend_joins(tmp_path: Path) -> None:
    async with start_fleet(tmp_path, 4) as agents:
        old, joined = agents[:3], agents[3]
        grown = Ranking(Node(BackendId(agent.agent_id)) for agent in agents)
        owners: dict[str, str] = {}
        async with start_router(backends_of(old)) as before:
            async with AcpClient.connect(before.url) as client:
                await client.initialize()
                # until the grown pool's hash would send at least one session elsewhere
                while len(owners) < 3 or all(grown.rank(s)[0] == o for s, o in owners.items()):
                    assert len(owners) < 30
                    session_id = await client.new_session(CWD)
                    owners[session_id] = await answered_by(client, session_id)
        async with start_router(backends_of([*old, joined])) as after:
            async with AcpClient.connect(after.url) as client:
                await client.initialize()
                for session_id, owner in owners.items():
                    assert (await resume(client, session_id)).get("result") == {}
                    assert await answered_by(client, session_id) == owner


async def test_concurrent_resumes_of_one_session_share_one_locate(tmp_path: Path) -> None:
    gate = asyncio.Event()

    async def inactive_when_released(session_id: str) -> dict[str, Any]:
        await gate.wait()
        return {"status": "inactive"}

    async with (
        start_scripted("gated", inactive_when_released) as backend,
        # the probe waits for the test's gate, not for the clock: it must not time out
        # while ten clients connect on a loaded machine
        start_router([("gated", backend.url)], probe={"timeout_ms": 30_000}) as router,
        contextlib.AsyncExitStack() as stack,
    ):
        clients = [
            await stack.enter_async_context(AcpClient.connect(router.url)) for _ in range(10)
        ]
        for client in clients:
            await client.initialize()
        resumes = [asyncio.create_task(resume(client, "sess_shared")) for client in clients]
        # A reply the router makes at once, sent after each resume on the same socket:
        # when it is back, the router has taken that resume up.
        for client in clients:
            await client.initialize()
        gate.set()
        assert all(r.get("result") == {} for r in await asyncio.gather(*resumes))
        probes = [m for m in backend.received if m.get("method") == "session/status"]
        assert len(probes) == 1
        assert sum(m.get("method") == "session/resume" for m in backend.received) == 10


async def test_a_reconnect_storm_is_absorbed_by_single_flight_and_hints(tmp_path: Path) -> None:
    sessions, clients = 10, 120
    async with start_fleet(tmp_path, 3) as agents:
        owners: dict[str, str] = {}
        async with contextlib.AsyncExitStack() as stack:
            direct = [await stack.enter_async_context(AcpClient.connect(a.url)) for a in agents]
            for n in range(sessions):  # active on the agents, unknown to the router
                session_id = await direct[n % 3].new_session(CWD)
                owners[session_id] = agents[n % 3].agent_id
            async with start_router(backends_of(agents)) as router:

                async def reconnect(session_id: str) -> str:
                    async with AcpClient.connect(router.url) as client:
                        await client.initialize()
                        assert (await resume(client, session_id)).get("result") == {}
                        return await answered_by(client, session_id)

                order = [list(owners)[n % sessions] for n in range(clients)]
                landed = await asyncio.gather(*(reconnect(s) for s in order))
                assert landed == [owners[s] for s in order]
                probes = sum(
                    router.metric("acp_router_probes_total", backend=a.agent_id, result=r)
                    for a in agents
                    for r in ("active", "inactive", "not_found", "unknown")
                )
        # a fan-out per session at most, then one probe of the hint per later resume;
        # without single-flight and hints it would be a fan-out per client (3 x 120)
        assert probes <= 3 * sessions + clients, probes
        assert router.metric("acp_router_locate_total", outcome="active") <= clients


async def test_unknown_session_ids_get_32002(tmp_path: Path) -> None:
    async with start_fleet(tmp_path, 2) as agents, start_router(backends_of(agents)) as router:
        async with AcpClient.connect(router.url) as client:
            await client.initialize()
            status = await client.status("sess_nobody")
            assert status["error"]["code"] == -32002
            assert status["error"]["data"]["sessionId"] == "sess_nobody"

            resumed = await resume(client, "sess_nobody")
            assert resumed["error"]["code"] == -32002
            assert resumed["error"]["data"]["sessionId"] == "sess_nobody"

            prompt = await client.prompt("sess_nobody", "hi")
            assert prompt["error"]["code"] == -32010
            assert prompt["error"]["data"]["sessionId"] == "sess_nobody"
        # the forwarded resume failed; every backend had said -32002 to its probe, so
        # the second locate had no backend left to try and answered -32002 itself
        not_found = sum(
            router.metric("acp_router_resume_total", backend=a.agent_id, result="not_found")
            for a in agents
        )
        assert not_found == 1
        assert router.metric("acp_router_locate_total", outcome="default") == 1
        assert router.metric("acp_router_locate_total", outcome="not_found") == 1


async def test_several_sessions_on_several_backends_over_one_connection(tmp_path: Path) -> None:
    async with start_fleet(tmp_path, 3) as agents, start_router(backends_of(agents)) as router:
        async with AcpClient.connect(router.url) as client:
            await client.initialize()
            sessions = [await client.new_session(CWD) for _ in range(3)]
            responses = await asyncio.gather(*(client.prompt(s, f"to {s}") for s in sessions))
            assert all(r.get("result") == {"stopReason": "end_turn"} for r in responses)
            messages = client.drain_incoming()
            speakers = {s: {speaker(t) for t in chunk_texts(messages, s)} for s in sessions}
            assert all(len(names) == 1 for names in speakers.values()), speakers
            assert {next(iter(n)) for n in speakers.values()} == {a.agent_id for a in agents}
            for s in sessions:
                assert chunk_texts(messages, s)[0].endswith(f"to {s}")
            for agent in agents:
                assert router.metric("acp_router_attached_sessions", backend=agent.agent_id) == 1


async def test_pipelined_resumes_and_prompts_wait_for_their_own_session_only(
    tmp_path: Path,
) -> None:
    """A script sends session/resume and session/prompt back to back, for two sessions:
    each prompt waits for its session's resume and is routed where it attached (on main
    the prompts got -32010: the resumes had not attached yet)."""
    async with start_fleet(tmp_path, 3) as agents, start_router(backends_of(agents)) as router:
        owners: dict[str, str] = {}
        async with AcpClient.connect(router.url) as first:
            await first.initialize()
            while len(set(owners.values())) < 2:  # two sessions on two instances
                session_id = await first.new_session(CWD)
                owners[session_id] = await answered_by(first, session_id)
        one = next(iter(owners))
        two = next(s for s in owners if owners[s] != owners[one])

        async with AcpClient.connect(router.url) as second:
            await second.initialize()
            calls = [
                asyncio.create_task(call)  # sent in this order, none awaited before the next
                for call in (
                    resume(second, one),
                    second.prompt(one, "right after"),
                    resume(second, two),
                    second.prompt(two, "me too"),
                )
            ]
            resumed_one, prompted_one, resumed_two, prompted_two = await asyncio.gather(*calls)
            assert resumed_one.get("result") == resumed_two.get("result") == {}
            assert prompted_one.get("result") == {"stopReason": "end_turn"}, prompted_one
            assert prompted_two.get("result") == {"stopReason": "end_turn"}, prompted_two
            messages = second.drain_incoming()
            assert chunk_texts(messages, one) == [f"[{owners[one]}] right after"]
            assert chunk_texts(messages, two) == [f"[{owners[two]}] me too"]
            answered = [json.loads(f).get("id") for f in second.raw_frames]
            ids = [r["id"] for r in (resumed_one, prompted_one, resumed_two, prompted_two)]
            assert answered.index(ids[0]) < answered.index(ids[1])
            assert answered.index(ids[2]) < answered.index(ids[3])


async def test_a_session_taken_behind_the_routers_back_is_found_where_it_went(
    tmp_path: Path,
) -> None:
    """Resumed directly on another instance (no router to stop it): the old instance
    answers -32010 "moved", the router stops routing the session there, and the client's
    next resume is located on the instance that holds it now."""
    async with start_fleet(tmp_path, 2) as agents, start_router(backends_of(agents)) as router:
        async with AcpClient.connect(router.url) as client:
            await client.initialize()
            session_id = await client.new_session(CWD)
            owner = await answered_by(client, session_id)
            other = next(a for a in agents if a.agent_id != owner)
            async with AcpClient.connect(other.url) as direct:
                await direct.initialize()
                assert (await resume(direct, session_id)).get("result") == {}

                moved = await client.prompt(session_id, "still there?")
                assert moved["error"]["code"] == -32010, moved
                assert "moved to another instance" in moved["error"]["message"]
                assert router.metric("acp_router_attached_sessions", backend=owner) == 0
                assert (await resume(client, session_id)).get("result") == {}
                assert await answered_by(client, session_id) == other.agent_id


async def test_one_session_clients_arriving_one_at_a_time_spread_over_the_pool(
    tmp_path: Path,
) -> None:
    """12 clients in a row, each creating one session and leaving: 4 +/- 1 per instance
    (on main, least-loaded counted only attached sessions and broke ties by id: 12 of 12
    landed on agent-1)."""
    async with start_fleet(tmp_path, 3) as agents, start_router(backends_of(agents)) as router:
        owners = []
        for _ in range(12):
            async with AcpClient.connect(router.url) as client:
                await client.initialize()
                session_id = await client.new_session(CWD)
                owners.append(await answered_by(client, session_id))
            await router.wait_detached()  # it left: nothing stays attached
        counts = {agent.agent_id: owners.count(agent.agent_id) for agent in agents}
        assert all(3 <= n <= 5 for n in counts.values()), counts


async def test_agent_requests_with_the_same_id_from_two_backends(tmp_path: Path) -> None:
    async with start_fleet(tmp_path, 2) as agents, start_router(backends_of(agents)) as router:
        async with AcpClient.connect(router.url) as client:
            await client.initialize()
            first, second = await client.new_session(CWD), await client.new_session(CWD)
            turns = [
                asyncio.create_task(client.prompt(s, "/permission please")) for s in (first, second)
            ]
            asks: dict[str, JsonObject] = {}
            async with asyncio.timeout(WAIT):
                while len(asks) < 2:
                    message = await client.next_incoming()
                    if message.get("method") == "session/request_permission":
                        asks[message["params"]["sessionId"]] = message
            assert asks[first]["id"] != asks[second]["id"]
            await client.respond(
                asks[first]["id"], {"outcome": {"outcome": "selected", "optionId": "allow"}}
            )
            await client.respond(
                asks[second]["id"], {"outcome": {"outcome": "selected", "optionId": "reject"}}
            )
            results = await asyncio.gather(*turns)
            assert all(r.get("result") == {"stopReason": "end_turn"} for r in results)
            messages = client.drain_incoming()
            assert chunk_texts(messages, first)[-1].endswith("permission: allow")
            assert chunk_texts(messages, second)[-1].endswith("permission: reject")
            assert {speaker(chunk_texts(messages, s)[-1]) for s in (first, second)} == {
                "agent-1",
                "agent-2",
            }


# -- failures --------------------------------------------------------------------------------------


async def test_a_dead_instance_fails_its_requests_at_once_and_leaves_the_pool(
    tmp_path: Path,
) -> None:
    grace = {"down_grace_ms": 2000}
    async with (
        start_fleet(tmp_path, 2) as agents,
        start_router(backends_of(agents), control=grace) as router,
    ):
        async with AcpClient.connect(router.url) as client:
            await client.initialize()
            session_id = await client.new_session(CWD)
            owner = await answered_by(client, session_id)  # ties alternate from a random salt
            (dying,) = [a for a in agents if a.agent_id == owner]
            (survivor,) = [a.agent_id for a in agents if a is not dying]
            slow = asyncio.create_task(client.prompt(session_id, "/slow 60"))
            await client.next_incoming()  # the slow turn is streaming
            dying.cli.process.kill()  # dies mid-turn, answering nothing
            failed = await slow
            assert failed["error"]["code"] == -32013
            assert failed["error"]["data"]["retryable"] is True
            await router.wait_backends(1)
            assert router.metric("acp_router_backend_up", backend=owner) == 0
            # a refused reconnect is not enough: only once no link has reached it for the
            # grace does it count as holding nothing any more
            assert router.pool.health(BackendId(owner)) is Health.UNKNOWN
            await router.wait_health(owner, Health.GONE)

            # the store is shared: the session resumes on the survivor
            assert (await resume(client, session_id)).get("result") == {}
            assert await answered_by(client, session_id) == survivor
            fresh = await client.new_session(CWD)
            assert await answered_by(client, fresh) == survivor


async def test_a_silent_instance_makes_the_locate_fail_closed(tmp_path: Path) -> None:
    async with (
        start_agent(tmp_path, "agent-1") as agent,
        start_scripted("silent", never_answer) as silent,
    ):
        async with AcpClient.connect(agent.url) as direct:
            await direct.initialize()
            parked = await direct.new_session(CWD)
            kept = await direct.new_session(CWD)
            assert (await direct.request("session/close", {"sessionId": parked})).get(
                "result"
            ) == {}
        backends = [("agent-1", agent.url), ("silent", silent.url)]
        async with start_router(backends, probe={"timeout_ms": 200}) as router:
            async with AcpClient.connect(router.url) as client:
                await client.initialize()
                refused = await resume(client, parked)
                assert refused["error"]["code"] == -32012
                assert refused["error"]["data"]["retryable"] is True
                assert refused["error"]["data"]["backends"] == ["silent"]
                # an active answer wins even while another backend is silent
                assert (await resume(client, kept)).get("result") == {}
                assert await answered_by(client, kept) == "agent-1"
            assert router.metric("acp_router_locate_total", outcome="unknown_failed") == 1
            # its unanswered probe made it silent: not asked by the second locate (the
            # router keeps asking it alone until it answers)
            assert router.metric("acp_router_probes_total", backend="silent", result="unknown") >= 1
            assert router.pool.health(BackendId("silent")) is Health.UNKNOWN
        async with start_router(
            backends, probe={"timeout_ms": 200}, router={"unknown_policy": "place_anyway"}
        ) as router:
            async with AcpClient.connect(router.url) as client:
                await client.initialize()
                assert (await resume(client, parked)).get("result") == {}
                assert await answered_by(client, parked) == "agent-1"


async def test_backends_without_the_status_capability_are_never_probed(tmp_path: Path) -> None:
    async with (
        start_agent(tmp_path, "agent-1") as agent,
        start_scripted("mute", never_answer, advertise_status=False) as mute,
    ):
        backends = [("agent-1", agent.url), ("mute", mute.url)]
        async with start_router(backends) as router, AcpClient.connect(router.url) as client:
            await client.initialize()
            # the agent's probe says it does not know the session: the backend that cannot
            # be asked is the only one that might, so it takes the resume
            resumed = await resume(client, "sess_fresh")
            assert resumed.get("result") == {}
            assert [m["method"] for m in mute.received][-1] == "session/resume"
            # attached here: active, though the mute backend cannot say so itself
            status = await client.status("sess_fresh")
            assert status["result"] == {"status": "active"}
        assert not any(m.get("method") == "session/status" for m in mute.received)
        assert router.metric("acp_router_locate_total", outcome="default") == 1


async def test_a_backend_that_comes_back_rejoins_the_pool(tmp_path: Path) -> None:
    async with start_agent(tmp_path, "agent-1") as first:
        port = first.url.split(":")[2].split("/")[0]
        async with start_router([("agent-1", first.url)]) as router:
            await first.stop()
            await router.wait_backends(0)
            async with AcpClient.connect(router.url) as client:
                await client.initialize()
                refused = await client.request("session/new", {"cwd": CWD, "mcpServers": []})
                assert refused["error"]["code"] == -32011
            async with start_agent(tmp_path, "agent-1", "--listen", f"127.0.0.1:{port}") as again:
                assert again.url == first.url
                await router.wait_backends(1)
                async with AcpClient.connect(router.url) as client:
                    await client.initialize()
                    session_id = await client.new_session(CWD)
                    assert await answered_by(client, session_id) == "agent-1"
            assert (
                router.metric("acp_router_backend_state_changes_total", backend="agent-1", to="up")
                == 2
            )


async def test_two_active_backends_count_as_split_brain(tmp_path: Path) -> None:
    async def always_active(session_id: str) -> dict[str, Any]:
        return {"status": "active"}

    async with (
        start_agent(tmp_path, "agent-1") as agent,
        start_scripted("twin", always_active) as twin,
    ):
        async with AcpClient.connect(agent.url) as direct:
            await direct.initialize()
            session_id = await direct.new_session(CWD)
            backends = [("agent-1", agent.url), ("twin", twin.url)]
            async with start_router(backends) as router:
                async with AcpClient.connect(router.url) as client:
                    await client.initialize()
                    assert (await resume(client, session_id)).get("result") == {}
                expected = router.first_ranked(session_id)
                resumed_on_twin = any(m.get("method") == "session/resume" for m in twin.received)
                assert resumed_on_twin == (expected == "twin")
                assert router.metric("acp_router_split_brain_detected_total") == 1


async def test_bad_frames_get_clear_errors(tmp_path: Path) -> None:
    async with start_fleet(tmp_path, 1) as agents, start_router(backends_of(agents)) as router:
        async with AcpClient.connect(router.url) as client:
            early = await client.request("session/new", {"cwd": CWD, "mcpServers": []})
            assert early["error"]["code"] == -32600
            parse_error = await client.send_raw("{not json", expect_id=None)
            assert parse_error["error"]["code"] == -32700
            batch = await client.send_raw("[]", expect_id=None)
            assert batch["error"]["code"] == -32600
            await client.initialize()
            unknown = await client.request("_vendor/thing", {})
            assert unknown["error"]["code"] == -32601
            no_session = await client.request("session/prompt", {"prompt": []})
            assert no_session["error"]["code"] == -32602
            zero = await client.request("session/status", {"sessionId": "x"}, request_id=0)
            assert zero["id"] == 0
            assert zero["error"]["code"] == -32002
            text_id = await client.request("session/status", {"sessionId": "x"}, request_id="abc")
            assert text_id["id"] == "abc"


async def test_list_merges_the_pool_behind_one_cursor(tmp_path: Path) -> None:
    async with (
        start_fleet(tmp_path, 2, "--page-size", "2") as agents,
        start_router(backends_of(agents)) as router,
    ):
        async with AcpClient.connect(router.url) as client:
            await client.initialize()
            created = {await client.new_session(CWD) for _ in range(5)}
            await client.new_session("/elsewhere")
            seen: list[str] = []
            cursor: str | None = None
            for _ in range(10):
                params: JsonObject = {"cwd": CWD}
                if cursor is not None:
                    params["cursor"] = cursor
                page = (await client.request("session/list", params))["result"]
                seen.extend(info["sessionId"] for info in page["sessions"])
                cursor = page.get("nextCursor")
                if cursor is None:
                    break
            assert set(seen) == created
            bad = await client.request("session/list", {"cursor": "garbage!"})
            assert bad["error"]["code"] == -32602


async def test_operator_endpoints(tmp_path: Path) -> None:
    async with start_fleet(tmp_path, 1) as agents, start_router(backends_of(agents)) as router:
        async with AcpClient.connect(router.url) as client:
            await client.initialize()
            session_id = await client.new_session(CWD)
            await answered_by(client, session_id)
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{router.base}/metrics") as response:
                assert response.status == 200
                body = await response.text()
            async with http.get(f"{router.base}/healthz") as response:
                assert response.status == 200
            async with http.get(f"{router.base}/readyz") as response:
                assert response.status == 200
        for name in (
            "acp_router_connections_total",
            "acp_router_active_connections",
            "acp_router_locate_total",
            "acp_router_probes_total",
            "acp_router_resume_total",
            "acp_router_backend_up",
            "acp_router_messages_total",
            "acp_router_message_bytes_total",
            "acp_router_split_brain_detected_total",
        ):
            assert name in body, name
        assert 'acp_router_messages_total{direction="client_to_backend"}' in body
        assert 'acp_router_backend_up{backend="agent-1"} 1.0' in body

    async with start_router([("gone", "ws://127.0.0.1:9/acp")], wait_for=0) as router:
        async with aiohttp.ClientSession() as http, http.get(f"{router.base}/readyz") as response:
            assert response.status == 503


async def test_frames_cross_the_router_byte_for_byte(tmp_path: Path) -> None:
    odd_update = (
        '{ "method" :"session/update","jsonrpc":"2.0",  "params":{"sessionId":"sess_x",'
        r'"update":{"sessionUpdate":"vendor_thing","_meta":{"k":"\u00e9 \\ \"q\""}},'
        '"future":[1, 2.50, null]} }'
    )
    odd_resume = (
        '{"params": {"sessionId":"sess_x","cwd":"/w", "_meta":{"traceparent":"00-ab"},'
        ' "unknownField":{"nested":[true,false]}},  "method":"session/resume",'
        ' "id":  7, "jsonrpc":"2.0"}'
    )
    async with (
        start_scripted("scripted", never_answer) as backend,
        start_router(
            [("scripted", backend.url)], router={"unknown_policy": "place_anyway"}
        ) as router,
        AcpClient.connect(router.url) as client,
    ):
        backend.before_resume.append(odd_update)
        await client.initialize()
        began = time.time_ns() // 1_000_000
        answer = await client.send_raw(odd_resume, expect_id=7)
        assert answer.get("result") == {}
        # client -> backend: the same bytes, but for the epoch the router adds to a
        # resume it located, first in its _meta (docs/routing.md, "Split brain")
        (sent,) = [f for f in backend.frames if "unknownField" in f]
        epoch = re.search(r'"acp-router/epoch":(\d+),', sent)
        assert epoch is not None, sent
        assert int(epoch.group(1)) >= began
        assert sent.replace(epoch.group(0), "", 1) == odd_resume
        assert await client.next_incoming() == json.loads(odd_update)
        assert odd_update in client.raw_frames  # backend -> client: the same bytes


async def test_links_replay_the_clients_initialize_and_authenticate(tmp_path: Path) -> None:
    async with (
        start_scripted("scripted", never_answer) as backend,
        start_router([("scripted", backend.url)]) as router,
        AcpClient.connect(router.url) as client,
    ):
        caps = {"fs": {"readTextFile": True}, "terminal": True}
        info = {"name": "an-editor", "version": "9"}
        init = await client.request(
            "initialize",
            {
                "protocolVersion": 2,
                "clientCapabilities": caps,
                "clientInfo": info,
                "_meta": {"k": 1},
            },
        )
        assert init["result"]["protocolVersion"] == 1
        assert (await client.request("authenticate", {"methodId": "token"}))["result"] == {}
        created = await client.request("session/new", {"cwd": CWD, "mcpServers": []})
        assert created.get("result") == {}
        on_link = [m for m in backend.received if m["method"] != "session/status"][
            1:
        ]  # after control
        assert [m["method"] for m in on_link] == ["initialize", "authenticate", "session/new"]
        replayed = on_link[0]["params"]
        assert replayed == {
            "protocolVersion": 1,
            "clientCapabilities": caps,
            "clientInfo": info,
            "_meta": {"k": 1},
        }
        assert on_link[1]["params"] == {"methodId": "token"}


async def test_a_draining_router_refuses_new_clients_and_is_not_ready(tmp_path: Path) -> None:
    async with (
        start_fleet(tmp_path, 1) as agents,
        start_router(backends_of(agents)) as router,
        AcpClient.connect(router.url) as client,
    ):
        await client.initialize()
        session_id = await client.new_session(CWD)
        await drain(router.app, 0)
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{router.base}/readyz") as response:
                assert response.status == 503
            with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
                await http.ws_connect(router.url)
            assert refused.value.status == 503
        # connected clients carry on until the router closes them
        assert await answered_by(client, session_id) == "agent-1"
        assert router.metric("acp_router_connections_total", result="draining") == 1


@pytest.mark.parametrize("compression", [True, False])
async def test_client_compression_follows_the_config(tmp_path: Path, compression: bool) -> None:
    async with (
        start_fleet(tmp_path, 1) as agents,
        start_router(backends_of(agents), router={"compression": compression}) as router,
        AcpClient.connect(router.url) as client,  # the websockets client offers deflate
    ):
        assert client.ws.response is not None
        extensions = client.ws.response.headers.get("Sec-WebSocket-Extensions", "")
        assert ("permessage-deflate" in extensions) is compression
        await client.initialize()
        session_id = await client.new_session(CWD)
        assert await answered_by(client, session_id) == "agent-1"


@pytest.mark.parametrize("protocol_version", [1, 2, 0])
async def test_initialize_is_answered_by_the_router(tmp_path: Path, protocol_version: int) -> None:
    async with start_fleet(tmp_path, 1) as agents, start_router(backends_of(agents)) as router:
        async with AcpClient.connect(router.url) as client:
            answer = await client.request("initialize", {"protocolVersion": protocol_version})
            result = answer["result"]
            assert result["protocolVersion"] == 1
            caps = result["agentCapabilities"]
            assert caps["loadSession"] is True
            assert {"status", "list", "resume", "close"} <= set(caps["sessionCapabilities"])
            session_id = await client.new_session(CWD)
            assert await answered_by(client, session_id) == "agent-1"
            json.dumps(result)  # plain JSON
