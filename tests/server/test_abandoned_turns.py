"""What the backend is sent when a prompt turn's client is gone (docs/configuration.md:
Abandoned turns): a router in this process and a scripted backend, which never ends a turn
by itself, on real sockets. One ``session/cancel`` for the session when its prompting
client drops, after what was queued before, and none while another client connection of
the router holds the session, or with the setting off (tests/e2e/test_abandoned_turns.py:
real reference agents, and routers stopped mid-turn)."""

from __future__ import annotations

import asyncio

import pytest

from tests.fleet import start_router
from tests.relay import start_relay
from tests.server.support import cancels, dropped, prompting, turns_never_end
from tests.support import WAIT, AcpClient

#: frames the client queues on a link the backend does not read: more than the socket
#: buffers between the router and a held relay hold (a few MiB), each under the scripted
#: backend's frame limit (1 MiB)
PADS, PAD_CHARS = 12, 800_000


# -- what the backend is sent ------------------------------------------------------------------


async def test_the_backend_gets_one_cancel_when_the_prompting_client_drops() -> None:
    async with turns_never_end() as backend, start_router([("agent-1", backend.url)]) as router:
        async with AcpClient.connect(router.url) as client:
            turn = await prompting(client, backend)
            dropped(client)
            with pytest.raises(ConnectionError):
                await turn
        async with asyncio.timeout(WAIT):
            await backend.until(lambda: bool(cancels(backend)))
        await router.wait_pinned({})  # the link is closed: nothing more comes on it
        (cancel,) = cancels(backend)
        assert cancel == {
            "jsonrpc": "2.0",
            "method": "session/cancel",
            "params": {"sessionId": "s1"},
        }


async def test_the_cancel_leaves_after_what_was_queued_before_the_link_closes() -> None:
    """A backend slow to read: the link still has frames queued when the client drops,
    and its cancel goes out behind them, before the link closes."""
    async with (
        turns_never_end() as backend,
        start_relay(backend.url) as relay,
        start_router([("agent-1", relay.url)]) as router,
    ):
        async with AcpClient.connect(router.url) as client:
            turn = await prompting(client, backend)
            relay.hold()
            for _ in range(PADS):  # more than the sockets between hold: the link queues
                await client.notify("_test/pad", {"pad": "x" * PAD_CHARS})
            # answered by the router itself after it has read (and queued) every pad
            refused = await client.request("_test/ping", request_id="acp-router:ping")
            assert refused["error"]["code"] == -32600, refused
            dropped(client)
            with pytest.raises(ConnectionError):
                await turn
        await router.wait_detached()  # the cancel is queued now, behind the pads
        relay.release()
        async with asyncio.timeout(WAIT):
            await backend.until(lambda: bool(cancels(backend)))
        await router.wait_pinned({})
        pads = [m for m in backend.received if m.get("method") == "_test/pad"]
        assert len(pads) == PADS
        assert backend.received[-1] == cancels(backend)[0]  # the last frame on the link


async def test_no_cancel_while_another_client_connection_holds_the_session() -> None:
    async with turns_never_end() as backend, start_router([("agent-1", backend.url)]) as router:
        async with AcpClient.connect(router.url) as watching:
            async with AcpClient.connect(router.url) as prompter:
                first = await prompting(prompter, backend)
                second = await prompting(watching, backend)  # s1 held here too
                dropped(prompter)
                with pytest.raises(ConnectionError):
                    await first
            await router.wait_pinned({"agent-1": 1})  # the prompter's link is closed
            assert cancels(backend) == []
            dropped(watching)  # the last holder goes, its own prompt unanswered
            with pytest.raises(ConnectionError):
                await second
        async with asyncio.timeout(WAIT):
            await backend.until(lambda: bool(cancels(backend)))
        await router.wait_pinned({})
        (cancel,) = cancels(backend)
        assert cancel["params"] == {"sessionId": "s1"}


async def test_no_cancel_with_the_setting_off() -> None:
    async with (
        turns_never_end() as backend,
        start_router(
            [("agent-1", backend.url)], router={"cancel_abandoned_turns": False}
        ) as router,
    ):
        async with AcpClient.connect(router.url) as client:
            turn = await prompting(client, backend)
            dropped(client)
            with pytest.raises(ConnectionError):
                await turn
        await router.wait_pinned({})
        assert cancels(backend) == []
