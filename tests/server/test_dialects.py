"""Status dialects in one pool: the RFD's ``active``/``inactive``, the ACP schema's and the
TypeScript SDK's ``open``/``saved``, and the first draft's ``live``/``not_found``.

Scripted backends on real sockets each hold one session in memory and answer
``session/status`` in their own words (for sessions they do not hold, the RFD lets an
agent say ``inactive``; the draft says ``not_found``). The router must find every
session where it lives, answer its own clients in the RFD's values, read a value it does
not know as ``inactive``, and take extra words from ``[probe.status_aliases]``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from typing import Any

import pytest

from router.protocol.errors import ConfigError
from tests.fleet import ScriptedBackend, router_settings, start_router, start_scripted
from tests.support import CWD, AcpClient

#: each dialect's word for "in memory here", and its answer for any other session
DIALECTS = {
    "rfd": ("active", "inactive"),
    "schema": ("open", "saved"),
    "draft": ("live", "not_found"),
}


def speaking(held: str, elsewhere: str, session: str) -> Callable[[str], Awaitable[Any]]:
    async def status(session_id: str) -> dict[str, Any] | None:
        return {"status": held if session_id == session else elsewhere}

    return status


def resumed_on(backend: ScriptedBackend) -> list[str]:
    return [
        m["params"]["sessionId"] for m in backend.received if m.get("method") == "session/resume"
    ]


async def test_a_pool_of_three_dialects_locates_the_active_session_on_each() -> None:
    async with AsyncExitStack() as stack:
        backends = {
            name: await stack.enter_async_context(
                start_scripted(name, speaking(held, elsewhere, f"sess_{name}"))
            )
            for name, (held, elsewhere) in DIALECTS.items()
        }
        router = await stack.enter_async_context(
            start_router([(name, b.url) for name, b in backends.items()])
        )
        async with AcpClient.connect(router.url) as client:
            await client.initialize()
            for name in DIALECTS:
                session_id = f"sess_{name}"
                # the router's own answer is the RFD's word, whatever the backend said
                assert (await client.status(session_id))["result"] == {"status": "active"}
                resumed = await client.request(
                    "session/resume", {"sessionId": session_id, "cwd": CWD}
                )
                assert resumed.get("result") == {}, resumed
            for name, backend in backends.items():
                assert resumed_on(backend) == [f"sess_{name}"], name
        assert router.metric("acp_router_locate_total", outcome="active") == 3


async def test_not_found_is_unknown_and_an_unknown_word_is_inactive() -> None:
    async with AsyncExitStack() as stack:
        drafts = [
            await stack.enter_async_context(
                start_scripted(f"draft-{n}", speaking("live", "not_found", "sess_x"))
            )
            for n in (1, 2)
        ]
        router = await stack.enter_async_context(
            start_router([(b.backend_id, b.url) for b in drafts])
        )
        async with AcpClient.connect(router.url) as client:
            await client.initialize()
            nobody = await client.status("sess_nobody")
            assert nobody["error"]["code"] == -32002
            assert nobody["error"]["data"] == {"sessionId": "sess_nobody"}

        odd = await stack.enter_async_context(
            start_scripted("odd", speaking("hibernating", "hibernating", "sess_y"))
        )
        router = await stack.enter_async_context(
            start_router([(b.backend_id, b.url) for b in (*drafts, odd)])
        )
        async with AcpClient.connect(router.url) as client:
            await client.initialize()
            # "hibernating" is no word the router knows: inactive (the RFD's rule)
            assert (await client.status("sess_y"))["result"] == {"status": "inactive"}
            resumed = await client.request("session/resume", {"sessionId": "sess_y", "cwd": CWD})
            assert resumed.get("result") == {}
            assert resumed_on(odd) == ["sess_y"]  # the one backend that knows it


async def test_the_alias_table_takes_more_words_from_the_config() -> None:
    async with AsyncExitStack() as stack:
        warm = await stack.enter_async_context(
            start_scripted("warm", speaking("warm", "cold", "sess_w"))
        )
        rfd = await stack.enter_async_context(
            start_scripted("rfd", speaking("active", "inactive", "sess_r"))
        )
        router = await stack.enter_async_context(
            start_router(
                [("warm", warm.url), ("rfd", rfd.url)],
                probe={"status_aliases": {"warm": "active", "cold": "not_found"}},
            )
        )
        async with AcpClient.connect(router.url) as client:
            await client.initialize()
            assert (await client.status("sess_w"))["result"] == {"status": "active"}
            await client.request("session/resume", {"sessionId": "sess_w", "cwd": CWD})
            assert resumed_on(warm) == ["sess_w"]
        assert router.pool.settings.probe.aliases["open"].value == "active"  # defaults stay


def test_a_bad_alias_names_its_key() -> None:
    with pytest.raises(ConfigError, match=r"^test: probe\.status_aliases: 'warm' must be "):
        router_settings([("a", "ws://127.0.0.1:1/acp")], probe={"status_aliases": {"warm": "hot"}})
