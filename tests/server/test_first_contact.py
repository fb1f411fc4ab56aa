"""A router that has just started has not yet heard from every backend: it does not
tell that moment to its clients (issue 23). ``initialize`` waits until a backend has
said what it offers (else a client is told of no ``resume`` and never resumes: the
bridge's replay after a router restart gave up its sessions so), and a locate waits for
the backends not yet heard from (else it finds them unknown and fails closed with
``-32012``), each for ``router.connect_timeout_ms`` at most. Real backends whose
``initialize`` answers the test holds."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from tests.fleet import ScriptedBackend, active, inactive, start_router, start_scripted
from tests.support import CWD, WAIT, AcpClient, JsonObject, watching


def offers_resume(answer: dict[str, Any]) -> bool:
    capabilities = answer["result"]["agentCapabilities"]
    return "resume" in capabilities.get("sessionCapabilities", {})


async def test_initialize_waits_for_a_backend_to_say_what_it_offers() -> None:
    released = asyncio.Event()
    async with start_scripted("a", inactive) as a:
        a.held["initialize"] = released
        async with (
            start_router([("a", a.url)], wait_for=0) as router,
            AcpClient.connect(router.url) as client,
        ):
            with watching("initialize waits up to") as waiter:
                answer = asyncio.create_task(client.initialize())
                async with asyncio.timeout(WAIT):
                    await waiter.seen.wait()
            assert not answer.done()
            released.set()
            assert offers_resume(await answer), answer.result()
            assert router.pool.fleet.introduced()


@dataclass
class LateHome:
    """``a`` has the session active and answers its first ``initialize`` only once
    ``released``; ``b`` answers at once; a router started with ``b`` up, and a client
    initialized."""

    a: ScriptedBackend
    b: ScriptedBackend
    client: AcpClient
    released: asyncio.Event


@contextlib.asynccontextmanager
async def a_late_home() -> AsyncIterator[LateHome]:
    released = asyncio.Event()
    async with start_scripted("a", active) as a, start_scripted("b", inactive) as b:
        a.held["initialize"] = released
        async with (
            start_router([("a", a.url), ("b", b.url)], wait_for=1) as router,
            AcpClient.connect(router.url) as client,
        ):
            assert offers_resume(await client.initialize())  # b has answered
            yield LateHome(a, b, client, released)


async def waiting_for_a(home: LateHome, method: str, params: JsonObject) -> JsonObject:
    """Send ``method``: it waits for ``a``'s first answer (logged), which comes only then."""
    with watching("not yet heard from: a") as waiter:
        answer = asyncio.create_task(home.client.request(method, params))
        async with asyncio.timeout(WAIT):
            await waiter.seen.wait()
    assert not answer.done()
    home.released.set()
    return await answer


async def test_a_locate_waits_for_a_backend_not_yet_heard_from() -> None:
    """Without the wait the resume got -32012 (``a`` unknown)."""
    async with a_late_home() as home:
        params = {"sessionId": "s1", "cwd": CWD}
        resumed = await waiting_for_a(home, "session/resume", params)
        assert resumed.get("result") == {}, resumed
        resumes = [m for m in home.a.received if m.get("method") == "session/resume"]
        assert len(resumes) == 1
        assert not any(m.get("method") == "session/resume" for m in home.b.received)


async def test_a_status_waits_for_a_backend_not_yet_heard_from() -> None:
    async with a_late_home() as home:
        status = await waiting_for_a(home, "session/status", {"sessionId": "s1"})
        assert status["result"]["status"] == "active", status


async def test_a_backend_that_never_answers_is_waited_for_no_longer_than_the_connect_timeout() -> (
    None
):
    """Nothing hangs: past ``router.connect_timeout_ms`` the client gets the answers it
    got before (``initialize`` with what the router answers itself; ``-32011``, retryable)."""
    never = asyncio.Event()
    async with start_scripted("a", active) as a:
        a.held["initialize"] = never
        async with (
            start_router([("a", a.url)], wait_for=0, router={"connect_timeout_ms": 200}) as router,
            AcpClient.connect(router.url) as client,
        ):
            assert not offers_resume(await client.initialize())
            answer = await client.request("session/resume", {"sessionId": "s1", "cwd": CWD})
            assert answer["error"]["code"] == -32011, answer  # no backend is up
            assert answer["error"]["data"]["retryable"] is True
            assert not router.pool.fleet.introduced()
            # past the window, a backend that never answers costs a new client nothing
            with watching("waits up to") as waiter:
                async with AcpClient.connect(router.url) as later:
                    assert not offers_resume(await later.initialize())
                    again = await later.request("session/resume", {"sessionId": "s1", "cwd": CWD})
                    assert again["error"]["code"] == -32011, again
            assert waiter.messages == []
