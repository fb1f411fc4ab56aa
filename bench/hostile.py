"""Hostile input: what one maximum-size frame costs the router, whatever its shape, and
the handshake deadline on silent and trickling connections.

The router runs in this process (its event loop is the one measured), in front of one
scripted backend process (:mod:`bench.scripted`). The client writes frames it built
and masked beforehand straight to its socket, so the loop spends on the client only a
buffer copy: the stall measured is the router's.

* **stall**: the longest gap between ticks the loop should run every millisecond, from
  the frame's first byte written until its answer arrives; baseline: the same for an
  ordinary small frame (a 309 B prompt) in the same round.
* **memory**: the peak of Python allocations (tracemalloc) while the router reads and
  answers the frame, over the frame's size; baseline: ``orjson.loads`` of the same
  frame (what the router cost before the envelope reader, less the old decoder's
  stack), as a ratio of the two peaks.
* **deadline**: connections that send nothing, or half a request and then one byte at
  a time, against ``router.handshake_timeout_ms``: how many are closed (408) and when.

Frames: 16 MiB (``router.max_message_bytes``, the default) of ``[[[...``; a
``session/prompt`` of an attached session whose text fills 16 MiB (forwarded); and
one whose prompt is 16 MiB of ``[{},{},...]`` (forwarded too).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import gc
import os
import tempfile
import time
import tracemalloc
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import orjson

from bench.fleet import scripted_in
from bench.in_process import in_process_router
from bench.ratios import Budget, Figure, Result, Row, Target, row
from bench.wire import BenchError
from router.protocol.jsonrpc import DEFAULT_MAX_MESSAGE_BYTES

BENCH = "hostile"
SIZE = DEFAULT_MAX_MESSAGE_BYTES
SESSION = "b0-hostile"
STALL = Target("event-loop stall <= 50 ms for any frame up to max_message_bytes", 50.0)
MEMORY = Target("router memory <= 8x the frame's size (a small multiple)", 8.0)
DEADLINE_MS = 1000


def nesting_frame() -> bytes:
    return b"[" * SIZE


def prompt_frame(size: int = SIZE) -> bytes:
    head = b'{"jsonrpc":"2.0","id":2,"method":"session/prompt","params":{"sessionId":"'
    head += SESSION.encode() + b'","prompt":[{"type":"text","text":"'
    tail = b'"}]}}'
    return head + b"x" * (size - len(head) - len(tail)) + tail


def empty_objects_frame(size: int = SIZE) -> bytes:
    """A ``session/prompt`` whose prompt is ``[{},{},...]``: the most objects per byte."""
    head = b'{"jsonrpc":"2.0","id":2,"method":"session/prompt","params":{"sessionId":"'
    head += SESSION.encode() + b'","prompt":['
    count = (size - len(head) - 4) // 3
    frame = head + b",".join([b"{}"] * count) + b"]}}"
    return frame + b" " * (size - len(frame))


def masked(payload: bytes) -> bytes:
    """One masked text frame, as a client sends it (the all-zero key, which leaves the
    payload as it is: the router unmasks it all the same)."""
    size = len(payload)
    if size < 126:
        head = bytes([0x81, 0x80 | size])
    elif size < 1 << 16:
        head = bytes([0x81, 0x80 | 126]) + size.to_bytes(2, "big")
    else:
        head = bytes([0x81, 0x80 | 127]) + size.to_bytes(8, "big")
    return head + bytes(4) + payload


@dataclass
class Connection:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter

    async def call(self, frame: bytes) -> bytes:
        """Write a pre-masked frame; the next text frame the router sends back."""
        self.writer.write(frame)
        while True:
            opcode, payload = await self.frame()
            if opcode == 0x1:
                return payload

    async def frame(self) -> tuple[int, bytes]:
        head = await self.reader.readexactly(2)
        length = head[1] & 0x7F
        if length >= 126:
            length = int.from_bytes(await self.reader.readexactly(2 if length == 126 else 8), "big")
        return head[0] & 0x0F, await self.reader.readexactly(length)


@contextlib.contextmanager
def ticking() -> Iterator[list[float]]:
    """Gaps between ticks the loop should run every millisecond, the last one until the
    block ends (a call shorter than a tick is one gap, not none: its ratio had a zero
    baseline)."""
    loop = asyncio.get_running_loop()
    gaps: list[float] = []
    last = [time.perf_counter()]
    handle = [loop.call_later(0.001, lambda: None)]

    def tick() -> None:
        now = time.perf_counter()
        gaps.append(now - last[0])
        last[0] = now
        handle[0] = loop.call_later(0.001, tick)

    handle[0].cancel()
    handle[0] = loop.call_later(0.001, tick)
    try:
        yield gaps
    finally:
        handle[0].cancel()
        gaps.append(time.perf_counter() - last[0])


async def run(budget: Budget) -> list[Result]:
    deadline = {"handshake_timeout_ms": DEADLINE_MS}
    with tempfile.TemporaryDirectory(prefix="acp-bench-") as folder:
        async with (
            scripted_in(Path(folder), 1) as backends,
            in_process_router(backends.backends(1), router=deadline) as router,
        ):
            return await _measure(router.port, budget)


async def _measure(port: int, budget: Budget) -> list[Result]:
    rounds = max(3, budget.rounds // 3) if not budget.quick else 2
    client = await raw_connection(port)
    small = masked(prompt_frame(309))
    payloads = {
        "nesting": nesting_frame(),
        "prompt": prompt_frame(),
        "[{},{},...]": empty_objects_frame(),
    }
    frames = {name: masked(payload) for name, payload in payloads.items()}
    await client.call(masked(b'{"jsonrpc":"2.0","id":0,"method":"initialize","params":{}}'))
    resume = b'{"jsonrpc":"2.0","id":1,"method":"session/resume","params":{"sessionId":"'
    await client.call(masked(resume + SESSION.encode() + b'","cwd":"/w"}}'))
    results: list[Result] = []
    for name, frame in frames.items():
        pairs = []
        for _ in range(rounds):
            big = await _stall(client, frame)
            base = await _stall(client, small)
            pairs.append((big * 1000, base * 1000))
        measure = f"stall, one {SIZE >> 20} MiB frame: {name}"
        results.append(row(BENCH, measure, "309 B prompt", pairs, "ms"))
        worst = max(subject for subject, _ in pairs)
        results.append(Figure(BENCH, f"{measure} (worst, ms)", worst, "ms", STALL))
    for name, frame in frames.items():
        results += await _memory(client, name, frame, payloads[name])
    client.writer.close()
    results += await _deadline(port)
    return results


async def _stall(client: Connection, frame: bytes) -> float:
    gc.collect()
    with ticking() as gaps:
        await client.call(frame)
    return max(gaps)


async def _memory(client: Connection, name: str, frame: bytes, payload: bytes) -> list[Result]:
    gc.collect()
    tracemalloc.start()
    try:
        await client.call(frame)
        _, router_peak = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        with contextlib.suppress(orjson.JSONDecodeError):  # too deep for orjson: it stops
            decoded = orjson.loads(payload)
            del decoded
        _, orjson_peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    measure = f"memory, one {SIZE >> 20} MiB frame: {name}"
    return [
        Row(
            BENCH,
            measure,
            "orjson.loads of it",
            (router_peak / orjson_peak,),
            router_peak / 1e6,
            orjson_peak / 1e6,
            "MB",
        ),
        Figure(BENCH, f"{measure} (x its size)", router_peak / len(payload), "x", MEMORY),
    ]


async def _deadline(port: int) -> list[Result]:
    """Silent and trickling connections against the handshake deadline."""
    count = 200
    opened = time.perf_counter()
    connections = [await asyncio.open_connection("127.0.0.1", port) for _ in range(count)]
    trickling = connections[count // 2 :]
    for _, writer in trickling:
        writer.write(b"GET /acp HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")

    async def trickle(writer: asyncio.StreamWriter) -> None:
        while not writer.is_closing():
            writer.write(b"a")
            await asyncio.sleep(0.05)  # a byte every 50 ms: always sending, never done

    async def until_closed(reader: asyncio.StreamReader) -> bytes:
        try:
            return await reader.read()
        except ConnectionResetError:  # closed while its bytes kept coming: reset, no 408 read
            return b"HTTP/1.1 408 (reset)"

    senders = [asyncio.create_task(trickle(writer)) for _, writer in trickling]
    try:
        answers = await asyncio.gather(*(until_closed(reader) for reader, _ in connections))
    finally:
        for sender in senders:
            sender.cancel()
        await asyncio.gather(*senders, return_exceptions=True)
    took = (time.perf_counter() - opened) * 1000
    for _, writer in connections:
        writer.close()
    closed = sum(answer.startswith(b"HTTP/1.1 408") for answer in answers)
    if closed != count:
        raise BenchError(f"{count - closed} of {count} connections outlived the deadline")
    target = Target(
        f"every one closed within the deadline + 1 s ({DEADLINE_MS} ms + 1 s)", DEADLINE_MS + 1000.0
    )
    return [
        Figure(
            BENCH,
            f"closed by the handshake deadline, of {count} (half silent, half trickling)",
            closed,
            "connections",
        ),
        Figure(BENCH, f"until the last was closed (deadline {DEADLINE_MS} ms)", took, "ms", target),
    ]


async def raw_connection(port: int) -> Connection:
    reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=2**26)
    key = base64.b64encode(os.urandom(16)).decode()
    writer.write(
        f"GET /acp HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n".encode()
    )
    status = await reader.readuntil(b"\r\n\r\n")
    if not status.startswith(b"HTTP/1.1 101"):
        raise BenchError(f"the router refused the upgrade: {status[:40]!r}")
    return Connection(reader, writer)
