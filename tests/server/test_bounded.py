"""What the router keeps is bounded by what it serves (issue 17), against scripted backends
on real sockets:

* every series and table keyed by a backend leaves with the backend (DNS discovery with
  pod addresses swaps backends all day);
* the admin status page reads a cached view: a refresh costs no probe;
* a repeated resume of an unknown id is answered from a short negative memory, and
  locates are bounded per connection and per address;
* ``session/list`` is under the locate budget, and a backend that floods its control link
  and never reads loses it.

tests/e2e/test_bounded.py: on reference agents, sessions attached here cost no locate, and
a frozen backend gets no new sessions.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

from prometheus_client import CollectorRegistry
from websockets.asyncio.server import ServerConnection, serve

from router.core.health import Health
from router.protocol.ids import BackendId
from tests.fleet import (
    RouterUnderTest,
    ScriptedBackend,
    active,
    error_reply,
    inactive,
    router_settings,
    start_router,
    start_scripted,
)
from tests.server.support import client_status
from tests.support import WAIT, AcpClient, resume


def _series(registry: CollectorRegistry) -> int:
    return sum(len(family.samples) for family in registry.collect())


async def _swap(router: RouterUnderTest, backend_id: str, url: str) -> None:
    """Make ``backend_id`` the pool's one backend, and wait until it is up."""
    router.pool.set_static(router_settings([(backend_id, url)]))
    await router.wait_health(backend_id, Health.UP)


async def test_every_series_and_table_keyed_by_a_backend_leaves_with_it() -> None:
    async with (
        start_scripted("a", inactive) as backend,
        start_router([("b-0", backend.url)]) as router,
    ):
        async with AcpClient.connect(router.url) as client:
            await client.initialize()
            # counters and histograms too: a probe, a resume
            assert "result" in await client.request(
                "session/resume", {"sessionId": "sess_1", "cwd": "/w"}
            )
        await router.wait_detached()
        baseline = _series(router.metrics.registry)
        for n in range(1, 201):
            await _swap(router, f"b-{n}", backend.url)
        # on the old main: from 98 to 7,698 series after 200 swaps
        assert _series(router.metrics.registry) <= baseline, "series outlived their backend"
        pool = router.pool
        assert set(pool.fleet.states) == set(pool.links) == {BackendId("b-200")}
        assert set(pool.directory.attached) <= {BackendId("b-200")}
        assert pool.directory.pinned == {}
        assert pool.roster.retired == {}
        assert set(pool.directory.spread._fading) <= {BackendId("b-200")}
        assert set(pool.prober.seconds) <= {BackendId("b-200")}


# -- a probe budget ---------------------------------------------------------------------------------

NOT_FOUND = error_reply(-32002, "Resource not found")


@contextlib.asynccontextmanager
async def _nobody_knows(
    router: dict[str, Any] | None = None, auth: dict[str, Any] | None = None
) -> AsyncIterator[RouterUnderTest]:
    """Three backends that know no session (status and resume: -32002), and a router."""
    async with contextlib.AsyncExitStack() as stack:
        backends = []
        for name in ("a", "b", "c"):
            backend = await stack.enter_async_context(start_scripted(name, inactive))
            backend.scripted["session/status"] = [NOT_FOUND]
            backend.scripted["session/resume"] = [NOT_FOUND]
            backends.append((name, backend.url))
        started = (
            start_router(backends, router=router or {}, auth=auth)
            if auth is not None
            else start_router(backends, router=router or {})
        )
        yield await stack.enter_async_context(started)


async def test_a_repeated_resume_of_an_unknown_id_costs_one_fan_out() -> None:
    async with _nobody_knows() as router, AcpClient.connect(router.url) as client:
        await client.initialize()
        for attempt in range(100):
            answer = await resume(client, "sess_nobody")
            assert answer["error"]["code"] == -32002, (attempt, answer)
        # on the old main: 600 probes (a fan-out per try, and another per relocate)
        assert router.probes() == 3
        assert router.metric("acp_router_probe_fanouts_total") == 1


async def test_unknown_ids_cost_one_fan_out_each_not_two() -> None:
    async with _nobody_knows() as router, AcpClient.connect(router.url) as client:
        await client.initialize()
        for n in range(50):
            assert (await resume(client, f"sess_{n}"))["error"]["code"] == -32002
        # on the old main: 6 each (the relocate after the default's -32002 fanned out again)
        assert router.probes() == 3 * 50


async def test_a_session_that_appears_later_is_found_once_the_memory_expires() -> None:
    async with (
        start_scripted("a", inactive) as backend,
        start_router([("a", backend.url)], cache={"negative_seconds": 0.3}) as router,
        AcpClient.connect(router.url) as client,
    ):
        await client.initialize()
        backend.scripted["session/status"] = [NOT_FOUND]
        backend.scripted["session/resume"] = [NOT_FOUND]
        assert (await resume(client, "sess_later"))["error"]["code"] == -32002
        # it appears (created directly on the agent): remembered absent a while, then found
        del backend.scripted["session/status"], backend.scripted["session/resume"]
        probes = router.probes()
        assert (await resume(client, "sess_later"))["error"]["code"] == -32002
        assert router.probes() == probes  # answered from memory
        async with asyncio.timeout(WAIT):
            while "result" not in await resume(client, "sess_later"):
                pass  # each try is a real resume; the memory lapses within 0.3 s


async def test_locates_are_bounded_per_connection_and_per_address() -> None:
    limits = {"locates_per_minute_per_connection": 5, "locates_per_minute_per_address": 8}
    async with _nobody_knows(router=limits) as router:
        async with AcpClient.connect(router.url) as first:
            await first.initialize()
            for n in range(5):
                assert (await resume(first, f"sess_{n}"))["error"]["code"] == -32002
            limited = await resume(first, "sess_5")
            assert limited["error"]["code"] == -32014, limited
            assert limited["error"]["data"]["limit"] == "connection"
            assert limited["error"]["data"]["retryAfterMs"] > 0
        async with AcpClient.connect(router.url) as second:
            await second.initialize()
            for n in range(3):
                assert (await resume(second, f"sess_x{n}"))["error"]["code"] == -32002
            limited = await client_status(second, "sess_y")
            assert limited["error"]["data"]["limit"] == "address", limited
        assert router.metric("acp_router_limited_total", limit="locates_per_connection") == 1
        assert router.metric("acp_router_limited_total", limit="locates_per_address") == 1


async def test_with_tokens_the_locate_budget_is_each_tokens_not_the_addresss() -> None:
    limits = {"locates_per_minute_per_address": 2, "locates_per_minute_per_principal": 3}
    auth = {"tokens": ["tok-alpha", "tok-bravo"]}
    async with _nobody_knows(router=limits, auth=auth) as router:
        async with (
            AcpClient.connect(router.url, token="tok-alpha") as alpha,
            AcpClient.connect(router.url, token="tok-alpha") as alpha_again,
        ):
            await alpha.initialize()
            await alpha_again.initialize()
            for n in range(3):  # three, over two connections: past the address's two
                spender = alpha if n % 2 else alpha_again
                assert (await resume(spender, f"sess_{n}"))["error"]["code"] == -32002
            limited = await resume(alpha, "sess_3")
            assert limited["error"]["data"]["limit"] == "principal", limited
        # another token from the same address has a budget of its own (on the old main,
        # the address's was spent)
        async with AcpClient.connect(router.url, token="tok-bravo") as bravo:
            await bravo.initialize()
            for n in range(3):
                assert (await resume(bravo, f"sess_b{n}"))["error"]["code"] == -32002
        assert router.metric("acp_router_limited_total", limit="locates_per_principal") == 1
        assert router.metric("acp_router_limited_total", limit="locates_per_address") == 0


# -- session/list: under the locate budget, and no page makes a backend silent ----------------


def lists_in(backend: ScriptedBackend) -> int:
    return sum(1 for m in backend.received if m.get("method") == "session/list")


async def test_list_pages_are_within_the_locate_budget() -> None:
    """Each page asks every backend: a flood of lists from one client is bounded like its
    resumes (on the code before: all 20 went to every backend)."""
    limits = {"locates_per_minute_per_connection": 5}
    async with (
        start_scripted("a", inactive) as backend,
        start_router([("a", backend.url)], router=limits) as router,
        AcpClient.connect(router.url) as flooder,
    ):
        await flooder.initialize()
        pages = await asyncio.gather(*(flooder.request("session/list", {}) for _ in range(20)))
        assert sum("result" in page for page in pages) == 5, pages
        refused = [page["error"] for page in pages if "error" in page]
        assert {(e["code"], e["data"]["limit"]) for e in refused} == {(-32014, "connection")}
        assert lists_in(backend) == 5
        assert router.metric("acp_router_limited_total", limit="locates_per_connection") == 15


def probed(message: dict[str, Any], session_id: str) -> bool:
    return message.get("method") == "session/status" and message["params"] == {
        "sessionId": session_id
    }


async def test_a_list_flood_on_a_backend_slow_to_list_fails_no_one_elses_resume() -> None:
    """A backend that answers its frames in turn, and lists slowly: while it lists, the
    probe sent beside each page goes unanswered, and the page leaves it out; but that is
    one client's page, not the pool's evidence. Another client's resume of a session that
    lives there is still located there (on the code before: each page made the backend
    silent, and the resume failed closed, -32012)."""
    async with (
        start_scripted("slow", active) as slow,
        start_scripted("other", inactive) as other,
        start_router([("slow", slow.url), ("other", other.url)]) as router,
        AcpClient.connect(router.url) as flooder,
        AcpClient.connect(router.url) as resumer,
    ):
        other.scripted["session/status"] = [NOT_FOUND]
        slow.serial = True  # its control link's frames are answered in turn
        slow.held["session/list"] = listed = asyncio.Event()
        try:
            await flooder.initialize()
            await resumer.initialize()
            first = asyncio.create_task(flooder.request("session/list", {}))
            async with asyncio.timeout(WAIT):
                await slow.until(lambda: lists_in(slow) == 1)  # it is listing: nothing else
            pages = await asyncio.gather(*(flooder.request("session/list", {}) for _ in range(10)))
            for page in pages:
                assert page["result"]["_meta"] == {"unlistedBackends": ["slow"]}, page
            resuming = asyncio.create_task(resume(resumer, "sess_1"))
            # its probe is out (to both backends at once); the slow one answers it once its
            # lists are done
            async with asyncio.timeout(WAIT):
                await other.until(lambda: any(probed(m, "sess_1") for m in other.received))
            listed.set()
            resumed = await resuming
            assert resumed.get("result") == {}, resumed
            assert router.pool.health(BackendId("slow")) is Health.UP
            assert "result" in await first
        finally:
            listed.set()  # a backend answering in turn ends only once it has answered


# -- a backend that sends requests on the control link and never reads ------------------------


async def test_a_backend_that_floods_its_control_link_and_never_reads_loses_it() -> None:
    flooded = asyncio.Event()

    async def flood(ws: ServerConnection) -> None:
        async for frame in ws:
            message = json.loads(frame)
            if message.get("method") != "initialize":
                continue
            result = {"protocolVersion": 1, "agentCapabilities": {}}
            await ws.send(json.dumps({"jsonrpc": "2.0", "id": message["id"], "result": result}))
            # each request the router must refuse: an answer of ~60 KB it queues for us
            for n in range(200):
                method = "_x/" + "m" * 60_000
                await ws.send(json.dumps({"jsonrpc": "2.0", "id": n, "method": method}))
            flooded.set()
            await ws.wait_closed()  # reads nothing more (max_queue=1: the socket backs up)
            return

    async with serve(flood, "127.0.0.1", 0, max_queue=1, max_size=None) as server:
        port = server.sockets[0].getsockname()[1]
        async with start_router(
            [("flood", f"ws://127.0.0.1:{port}/acp")],
            wait_for=0,
            router={"max_message_bytes": 1024 * 1024},
        ) as router:
            async with asyncio.timeout(WAIT):
                await flooded.wait()
            # the router's answers pass its bound (2 MiB of frames, with the sockets'
            # buffers): it drops the link rather than queue them without end
            await router.wait_health("flood", Health.UNKNOWN)
