"""``authenticate`` is forwarded truthfully: the client hears what the backends said.

A real router and scripted backends on real sockets. A backend that refuses the
client's credentials must reach the client as that backend's own error, never as
the retryable -32013 that makes a client with a bad key retry forever
(tests/e2e/test_authenticate.py: reference agents that require a key).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from tests.fleet import (
    RouterUnderTest,
    ScriptedBackend,
    error_reply,
    start_router,
    start_scripted,
)
from tests.support import AcpClient, JsonObject

REFUSED = error_reply(-32000, "Authentication required: bad key")
KEY = {"methodId": "key", "_meta": {"key": "k-1"}}


def active_for(session_id: str) -> Any:
    async def status(asked: str) -> dict[str, Any]:
        return {"status": "active" if asked == session_id else "inactive"}

    return status


def on_links(backend: ScriptedBackend) -> list[str]:
    """The methods ``backend`` received on client links (not its control link), in order."""
    return [m["method"] for m in backend.received if m["method"] != "session/status"][1:]


@dataclass
class Pool:
    lenient: ScriptedBackend  # accepts any authenticate; holds sess_l
    picky: ScriptedBackend  # refuses every authenticate; holds sess_p
    router: RouterUnderTest
    client: AcpClient


@contextlib.asynccontextmanager
async def lenient_and_picky() -> AsyncIterator[Pool]:
    """Two backends that disagree about the client's key, a router, an initialized client."""
    async with (
        start_scripted("lenient", active_for("sess_l")) as lenient,
        start_scripted("picky", active_for("sess_p")) as picky,
    ):
        picky.scripted = {"authenticate": [REFUSED]}
        async with (
            start_router([("lenient", lenient.url), ("picky", picky.url)]) as router,
            AcpClient.connect(router.url) as client,
        ):
            await client.initialize()
            yield Pool(lenient, picky, router, client)


def refused_by_the_backend(answer: JsonObject, request_id: int) -> None:
    assert answer["id"] == request_id
    assert answer["error"] == {"code": -32000, "message": "Authentication required: bad key"}


async def test_a_refused_authenticate_is_the_backends_own_error() -> None:
    async with start_scripted("picky", active_for("sess_p")) as backend:
        backend.scripted = {"authenticate": [REFUSED]}
        async with (
            start_router([("picky", backend.url)]) as router,
            AcpClient.connect(router.url) as client,
        ):
            await client.initialize()
            refused_by_the_backend(await client.request("authenticate", KEY, request_id=5), 5)
            # refused, so never replayed: the link it opened carries on without it
            resumed = await client.request("session/resume", {"sessionId": "sess_p", "cwd": "/w"})
            assert resumed.get("result") == {}
            assert on_links(backend) == ["initialize", "authenticate", "session/resume"]
            assert router.metric("acp_router_client_errors_total", code="-32013") == 0


async def test_an_accepted_authenticate_is_replayed_and_a_refused_replay_is_not_retryable() -> None:
    async with lenient_and_picky() as pool:
        client = pool.client
        resumed = await client.request("session/resume", {"sessionId": "sess_l", "cwd": "/w"})
        assert resumed.get("result") == {}
        # the one linked backend accepts: the client hears that, and only then
        assert (await client.request("authenticate", KEY))["result"] == {}
        authenticated = [m for m in pool.lenient.received if m["method"] == "authenticate"]
        assert [m["params"] for m in authenticated] == [KEY]

        # a link opened later replays it; the backend refuses: the request that opened
        # the link gets the backend's error, again on the next try
        for request_id in (7, 8):
            resume = {"sessionId": "sess_p", "cwd": "/w"}
            answer = await client.request("session/resume", resume, request_id=request_id)
            refused_by_the_backend(answer, request_id)
        replays = [m for m in pool.picky.received if m["method"] == "authenticate"]
        assert [(m["id"], m["params"]) for m in replays] == [("acp-router:authenticate", KEY)] * 2
        assert "session/resume" not in on_links(pool.picky)  # nothing reached it
        assert pool.router.metric("acp_router_client_errors_total", code="-32000") == 2
        assert pool.router.metric("acp_router_client_errors_total", code="-32013") == 0

        # the lenient backend's session still works on this connection
        prompt = {"sessionId": "sess_l", "prompt": []}
        assert (await client.request("session/prompt", prompt))["result"] == {}


async def test_a_backends_own_codes_are_counted_as_other() -> None:
    async with lenient_and_picky() as pool:
        client = pool.client
        resumed = await client.request("session/resume", {"sessionId": "sess_l", "cwd": "/w"})
        assert resumed.get("result") == {}
        assert (await client.request("authenticate", KEY))["result"] == {}
        # the replay to the picky backend is refused with codes of its own choosing
        codes = (424242, -1, 7)
        for request_id, refused in enumerate(codes, 10):
            pool.picky.scripted = {"authenticate": [error_reply(refused, "no")]}
            resume = {"sessionId": "sess_p", "cwd": "/w"}
            answer = await client.request("session/resume", resume, request_id=request_id)
            assert answer["error"]["code"] == refused, answer
        metric = "acp_router_client_errors_total"
        assert pool.router.metric(metric, code="other") == len(codes)
        assert all(pool.router.metric(metric, code=str(c)) == 0 for c in codes)


async def test_backends_that_disagree_fail_closed() -> None:
    async with lenient_and_picky() as pool:
        for session_id in ("sess_l", "sess_p"):
            resume = {"sessionId": session_id, "cwd": "/w"}
            assert (await pool.client.request("session/resume", resume)).get("result") == {}
        # both links get it; the lenient backend accepts, the picky one refuses: no
        refused_by_the_backend(await pool.client.request("authenticate", KEY, request_id=3), 3)
        assert [m["method"] for m in pool.picky.received].count("authenticate") == 1
