"""A backend can only hurt what is routed to it (issue 8), against hostile backends in this
process: a link whose upgrade never completes or stalls is given up within the deadline,
frames to one backend leave in the order the client sent them, written at once or queued,
and the client connection closes only for its own faults (tests/e2e/test_isolation.py: on
reference agents)."""

from __future__ import annotations

import asyncio
import json

from websockets.asyncio.client import connect
from websockets.protocol import State

from tests.fleet import start_router
from tests.hostile import start_hostile
from tests.server.support import NEW
from tests.support import WAIT, AcpClient


async def test_a_backend_that_never_completes_its_upgrade_fails_within_the_deadline() -> None:
    async with (
        start_hostile("stuck", stall_upgrades_from=1) as stuck,  # the control link gets in
        start_router([("stuck", stuck.url)], router={"connect_timeout_ms": 300}) as router,
        AcpClient.connect(router.url) as client,
    ):
        await client.initialize()
        for attempt in (1, 2):  # a later request is not stuck behind the first either
            failed = await client.request("session/new", NEW)
            assert failed["error"]["code"] == -32013, failed
            assert "not open within 300 ms" in failed["error"]["data"]["reason"]
            assert stuck.upgrades == 1 + attempt
            # the unanswered handshake made it silent until its control link answers a
            # probe again (at once: only its client links stall)
            await router.wait_backends(1)
        assert client.ws.state is State.OPEN


async def test_a_control_link_whose_upgrade_stalls_gives_up_and_retries() -> None:
    async with (
        start_hostile("stuck", stall_upgrades_from=0) as stuck,
        start_router([("stuck", stuck.url)], wait_for=0, router={"connect_timeout_ms": 200}),
        asyncio.timeout(WAIT),
    ):
        await stuck.wait_for(lambda: stuck.upgrades >= 2)


async def test_frames_to_one_backend_leave_in_the_order_the_client_sent_them() -> None:
    gate = asyncio.Event()
    async with (
        start_hostile("only", gate=gate) as backend,
        start_router([("only", backend.url)]) as router,
        AcpClient.connect(router.url) as client,
    ):
        await client.initialize()
        sent = [json.dumps({"jsonrpc": "2.0", "id": "new", "method": "session/new", "params": NEW})]
        for n in range(400):  # the first half queue up while the link opens
            if n % 3:
                call = {"jsonrpc": "2.0", "id": n, "method": "_vendor/seq", "params": {"n": n}}
                sent.append(json.dumps(call))
            else:
                sent.append(json.dumps({"jsonrpc": "2.0", "method": "_vendor/note", "params": [n]}))
        for text in sent[:200]:
            await client.ws.send(text)
        # the router reads frames in order: once it refuses a repeat of id 1 (still in
        # flight), the 200 frames before are queued on the link that is still opening
        repeat = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "_vendor/seq"})
        assert (await client.send_raw(repeat, expect_id=1))["error"]["code"] == -32600
        async with asyncio.timeout(WAIT):  # only the link's initialize, held at the gate
            await backend.wait_for(lambda: len(backend.link_frames) == 1)
        gate.set()
        for text in sent[200:]:
            await client.ws.send(text)
        async with asyncio.timeout(WAIT):
            await backend.wait_for(lambda: len(backend.link_frames) > len(sent))
        assert backend.link_frames[1:] == sent


async def test_frames_written_at_once_and_frames_queued_keep_one_order() -> None:
    """Small frames go straight to the link's socket while nothing waits; a large one (or
    one behind a full send buffer) is queued, and every frame after it queues behind it
    until the writer has drained them: one order either way."""
    async with (
        start_hostile("only") as backend,
        start_router([("only", backend.url)]) as router,
        AcpClient.connect(router.url) as client,
    ):
        await client.initialize()
        sent = [json.dumps({"jsonrpc": "2.0", "id": "new", "method": "session/new", "params": NEW})]
        for n in range(300):
            pad = "x" * (256 * 1024 if n % 25 == 0 else 8)  # some far above the direct limit
            sent.append(
                json.dumps({"jsonrpc": "2.0", "method": "_vendor/note", "params": [n, pad]})
            )
        for text in sent:
            await client.ws.send(text)
        async with asyncio.timeout(WAIT):
            await backend.wait_for(lambda: len(backend.link_frames) > len(sent))
        assert backend.link_frames[1:] == sent


async def test_the_client_connection_closes_only_for_its_own_faults() -> None:
    async with (
        start_hostile("only") as backend,
        start_router([("only", backend.url)], router={"max_message_bytes": 4096}) as router,
    ):
        # a binary frame is not one: the transport RFD says to ignore it (and it is counted)
        async with AcpClient.connect(router.url) as client:
            await client.ws.send(b"\x00 not text")
            assert "result" in await client.initialize()
            assert router.metric("acp_router_client_frames_ignored_total", reason="binary") == 1
            assert client.ws.state is State.OPEN
        async with connect(router.url, max_size=None) as ws:
            await ws.send("x" * 5000)
            async with asyncio.timeout(WAIT):
                await ws.wait_closed()
            assert ws.close_code == 1009
