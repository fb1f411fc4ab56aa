"""Hostile input at the front door, on real sockets: a frame costs what its size says
whatever its shape, frames of exactly the limit pass both ways, an oversized backend
frame is reported as the router's refusal, and an unmasked client frame closes the
connection (1002).

The bounds are loose (tests, not benchmarks: ``python -m bench --only hostile`` has the
figures): the old decoder took 12 s and 874 MB on a 16 MiB frame of nesting.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import time
import tracemalloc
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from tests.fleet import RouterUnderTest, inactive, start_router, start_scripted
from tests.support import WAIT, AcpClient, watching

LIMIT = 4 * 1024 * 1024


def sized(build: Callable[[str], str], size: int) -> str:
    """The frame ``build`` makes, padded (ASCII) to exactly ``size`` bytes."""
    bare = build("")
    frame = build("x" * (size - len(bare)))
    assert len(frame.encode()) == size
    return frame


def fill(unit: str, size: int) -> str:
    """A JSON array of ``unit`` as long as fits in ``size`` bytes, padded with spaces."""
    count = (size - 2) // (len(unit) + 1)
    text = "[" + ",".join([unit] * count) + "]"
    return text + " " * (size - len(text))


def hostile_frames(size: int) -> dict[str, str]:
    head = '{"jsonrpc":"2.0","id":7,"method":"session/prompt","params":{"sessionId":"s","prompt":'
    body = size - len(head) - 2
    return {
        "deep arrays": "[" * size,
        "deep objects": '{"a":' * (size // 5),
        "empty objects": head + fill("{}", body) + "}}",
        "a string": head + '"' + "x" * (body - 2) + '"}}',
        "many keys": head + "{" + ",".join(f'"k{i}":0' for i in range(body // 12)) + "}}}",
    }


@contextmanager
def loop_stalls() -> Iterator[list[float]]:
    """The gaps between ticks the event loop should run every 5 ms (the longest is how
    long it was kept from running)."""
    loop = asyncio.get_running_loop()
    gaps: list[float] = []
    ticks = [time.perf_counter()]
    handles = [loop.call_later(0.005, lambda: None)]

    def tick() -> None:
        now = time.perf_counter()
        gaps.append(now - ticks[-1])
        ticks[-1] = now
        handles[-1] = loop.call_later(0.005, tick)

    handles[-1].cancel()
    handles[-1] = loop.call_later(0.005, tick)
    try:
        yield gaps
    finally:
        handles[-1].cancel()


@pytest.mark.parametrize("shape", list(hostile_frames(1)))
async def test_a_maximum_frame_of_any_shape_stalls_nothing_and_builds_no_tree(shape: str) -> None:
    frame = hostile_frames(LIMIT)[shape]
    assert len(frame) <= LIMIT
    async with (
        start_scripted("a", inactive) as backend,
        start_router([("a", backend.url)], router={"max_message_bytes": LIMIT}) as router,
        AcpClient.connect(router.url) as client,
    ):
        assert "result" in await client.initialize()
        tracemalloc.start()
        try:
            with loop_stalls() as gaps:
                answer = await client.send_raw(frame, expect_id=None if "deep" in shape else 7)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        if "deep" in shape:
            assert answer["error"]["code"] == -32600
            assert "nesting is too deep" in answer["error"]["message"]
        else:
            assert answer["id"] == 7  # answered (the backend does not know the session)
        # client and router together copy the frame a few times (encode, mask, read,
        # decode); a tree of it would be tens of times its size
        assert peak < 12 * LIMIT, f"{shape}: {peak / LIMIT:.1f}x the frame"
        assert max(gaps) < 2.0, f"{shape}: the loop stalled {max(gaps):.2f} s"


async def test_frames_of_exactly_the_limit_pass_both_ways() -> None:
    limit = 64 * 1024

    def prompt(pad: str) -> str:
        return (
            '{"jsonrpc":"2.0","id":3,"method":"session/new","params":{"cwd":"/w","mcpServers":[],'
            f'"_meta":{{"pad":"{pad}"}}}}}}'
        )

    def reply(pad: str) -> str:
        return (
            f'{{"jsonrpc":"2.0","id":$ID,"result":{{"sessionId":"s1","_meta":{{"pad":"{pad}"}}}}}}'
        )

    exact_reply = sized(reply, limit + len("$ID") - 1)  # "$ID" becomes "3"
    async with start_scripted("a", inactive) as backend:
        backend.scripted = {"session/new": [exact_reply]}
        async with (
            start_router([("a", backend.url)], router={"max_message_bytes": limit}) as router,
            connect(router.url, max_size=None) as ws,
        ):
            await ws.send('{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}')
            await ws.recv()
            await ws.send(sized(prompt, limit))
            async with asyncio.timeout(WAIT):
                answer = await ws.recv()
            assert isinstance(answer, str)
            assert len(answer.encode()) == limit
            assert json.loads(answer)["result"]["sessionId"] == "s1"
            await ws.send(sized(prompt, limit + 1))
            with pytest.raises(ConnectionClosed) as closed:
                async with asyncio.timeout(WAIT):
                    await ws.recv()
            assert closed.value.rcvd is not None
            assert closed.value.rcvd.code == 1009


REFUSED = "the router refused a frame from the backend larger than router.max_message_bytes"


async def test_an_oversized_backend_frame_is_reported_as_the_routers_refusal() -> None:
    limit = 64 * 1024
    huge = '{"jsonrpc":"2.0","id":$ID,"result":{"pad":"' + "x" * limit + '"}}'
    async with start_scripted("a", inactive) as backend:
        backend.scripted = {"session/new": [huge]}
        async with (
            start_router([("a", backend.url)], router={"max_message_bytes": limit}) as router,
            AcpClient.connect(router.url) as client,
        ):
            await client.initialize()
            with watching(REFUSED) as log:
                answer = await client.request("session/new", {"cwd": "/w", "mcpServers": []})
                assert answer["error"]["code"] == -32013  # the link it was on is given up
                async with asyncio.timeout(WAIT):
                    await log.seen.wait()
            assert "link to backend a ended" in log.messages[0]
            assert "closed by the backend" not in log.messages[0]
            dropped = "acp_router_backend_frames_dropped_total"
            assert router.metric(dropped, backend="a", reason="too_big") == 1


async def test_an_oversized_frame_on_a_control_link_is_reported_too() -> None:
    limit = 64 * 1024

    async def huge_status(session_id: str) -> dict[str, str]:
        return {"status": "active", "pad": "x" * limit}

    async with start_scripted("a", huge_status) as backend:
        async with start_router([("a", backend.url)], router={"max_message_bytes": limit}) as r:
            with watching(REFUSED) as log:
                async with AcpClient.connect(r.url) as client:
                    await client.initialize()
                    answer = await client.status("sess_somewhere")
                    assert "error" in answer  # the probe's answer never came
                async with asyncio.timeout(WAIT):
                    await log.seen.wait()
            assert "control link failed" in log.messages[0]


def upgrade_request(port: int) -> bytes:
    key = base64.b64encode(os.urandom(16)).decode()
    return (
        f"GET /acp HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n"
        f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
    ).encode()


def text_frame(payload: bytes, *, masked: bool) -> bytes:
    """One final text frame (payloads under 126 bytes)."""
    if not masked:
        return bytes([0x81, len(payload)]) + payload
    mask = os.urandom(4)
    body = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
    return bytes([0x81, 0x80 | len(payload)]) + mask + body


async def read_frame(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    """One frame from the router (servers do not mask): its opcode and payload."""
    async with asyncio.timeout(WAIT):
        head = await reader.readexactly(2)
        length = head[1] & 0x7F
        if length >= 126:
            length = int.from_bytes(await reader.readexactly(2 if length == 126 else 8), "big")
        return head[0] & 0x0F, await reader.readexactly(length)


async def close_code(reader: asyncio.StreamReader) -> int:
    """Read frames until the router's close frame; its code."""
    while True:
        opcode, payload = await read_frame(reader)
        if opcode == 0x8:
            return int.from_bytes(payload[:2], "big")


def port_of(router: RouterUnderTest) -> int:
    match = re.search(r":(\d+)/acp$", router.url)
    assert match is not None
    return int(match.group(1))


@pytest.mark.parametrize("pipelined", [False, True])
async def test_an_unmasked_client_frame_closes_the_connection_1002(pipelined: bool) -> None:
    initialize = b'{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}'
    async with (
        start_scripted("a", inactive) as backend,
        start_router([("a", backend.url)]) as router,
    ):
        port = port_of(router)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            unmasked = text_frame(initialize, masked=False)
            writer.write(upgrade_request(port) + (unmasked if pipelined else b""))
            async with asyncio.timeout(WAIT):
                status = await reader.readuntil(b"\r\n\r\n")
            assert status.startswith(b"HTTP/1.1 101")
            if not pipelined:  # a masked frame first: it is answered
                writer.write(text_frame(initialize, masked=True))
                opcode, answer = await read_frame(reader)
                assert (opcode, json.loads(answer)["id"]) == (0x1, 1)
                writer.write(unmasked)
            assert await close_code(reader) == 1002
        finally:
            writer.close()
