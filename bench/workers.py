"""Workers: the same router with one worker and with two (``router.workers = 2``), in
front of one scripted backend (:mod:`bench.scripted`, which answers a prompt at once).

Many client connections each resume a session of the backend (so each holds its own
link to it, as an editor's connection does) and pipeline prompts on it: a window of
prompts always in flight per connection, for a fixed count in all. A round measures
both routers, in rotating order; the row is prompts per second with two workers over
prompts per second with one, and its target is issue 19's 1.8x on 2 cores.

Everything runs on this machine: the clients (this process) and the backend take CPU
too, so on a machine with as many cores as workers the routers cannot have them all.
The second row says what the routers' processes spent per prompt (CPU seconds of the
parent and its workers, from ``/proc``), two workers over one: near 1 means a worker
costs nothing the single router does not, so with cores to spare the throughput grows
with the workers. The figures say what ratio this machine allows at all (each side's
rate bound by its workers, a core each, and by every core busy on what a prompt costs
the router, the clients and the backend together), how many cores each router kept
busy (one worker can use at most one: below that, something else was the bottleneck),
what the clients and the backend spent per prompt, and how many cores the run saw.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import resource
import statistics
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import orjson

from bench.fleet import Child, Fleet, Scripted
from bench.hostile import Connection, masked, raw_connection
from bench.observe import cpu_seconds, metric_sum
from bench.ratios import Budget, Figure, Result, Target, rotated, row
from bench.wire import WAIT, BenchError, prompt_params, resume_params

BENCH = "workers"
ONE = "1 worker"
TWO = "2 workers"
THROUGHPUT = Target("2 workers' pipelined throughput >= 1.8x one worker's (2 cores)", 1.8, False)
#: client connections, and prompts in flight on each
CONNECTIONS = 64
WINDOW = 8


@dataclass(frozen=True, slots=True)
class Side:
    name: str
    router: Child
    connections: list[Connection]
    #: per connection: the prompts it cycles through (ids reused once answered)
    frames: list[list[bytes]]


@dataclass(frozen=True, slots=True)
class Measured:
    """One side's run: prompts per second, and CPU seconds per prompt of its router's
    processes, of the clients (this process) and of the backend."""

    rate: float
    cpu_per_prompt: float
    client_cpu: float
    backend_cpu: float


async def run(fleet: Fleet, backends: Scripted, budget: Budget) -> list[Result]:
    prompts = budget.size(24_000, 8_000)
    [backend] = backends.backends(1)
    async with contextlib.AsyncExitStack() as stack:
        sides = []
        for name, workers in ((ONE, 1), (TWO, 2)):
            router = await stack.enter_async_context(
                fleet.router(f"router-{workers}-workers", [backend], router={"workers": workers})
            )
            await _every_worker_up(fleet, router, workers)
            connections, frames = [], []
            for n in range(CONNECTIONS):
                session_id = f"{backend[0]}-{workers}-{n}"
                connections.append(await stack.enter_async_context(_attached(router, session_id)))
                frames.append(_prompts(session_id))
            sides.append(Side(name, router, connections, frames))
        for side in sides:  # warm up: code paths hot, every worker busy once
            await _pump(side, prompts // 4, backends.process.pid)
        rounds = []
        for index in range(budget.rounds):
            measured = {}
            for side in rotated(sides, index):
                measured[side.name] = await _pump(side, prompts, backends.process.pid)
            rounds.append(measured)
    return _rows(rounds)


async def _every_worker_up(fleet: Fleet, router: Child, workers: int) -> None:
    """Poll ``/metrics`` (bounded) until each worker has its link to the backend up:
    ``/readyz`` speaks for the one worker that answers it."""
    async with asyncio.timeout(WAIT * 4):
        while True:
            if await metric_sum(fleet.http, router.url, "acp_router_backend_up") >= workers:
                return
            await asyncio.sleep(0.05)  # polling an HTTP endpoint: there is no event to wait on


@contextlib.asynccontextmanager
async def _attached(router: Child, session_id: str) -> AsyncIterator[Connection]:
    """A raw client connection to ``router`` that has initialized and resumed
    ``session_id`` (its link to the backend open)."""
    port = int(router.url.rpartition(":")[2].partition("/")[0])
    connection = await raw_connection(port)
    try:
        for request in (INITIALIZE, resume(session_id)):
            reply = await connection.call(masked(orjson.dumps(request)))
            if b'"error"' in reply:
                raise BenchError(f"{request['method']} failed: {reply!r}")
        yield connection
    finally:
        connection.writer.close()


INITIALIZE = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": 1}}


def resume(session_id: str) -> dict[str, object]:
    return {
        "jsonrpc": "2.0",
        "id": 2,
        "method": "session/resume",
        "params": resume_params(session_id),
    }


def _prompts(session_id: str) -> list[bytes]:
    """Masked prompts on ``session_id``, ids 10 up: four windows' worth, so an id comes
    round again only long after its answer."""
    return [_prompt(session_id, 10 + n) for n in range(4 * WINDOW)]


def _prompt(session_id: str, request_id: int) -> bytes:
    params = prompt_params(session_id, "hi")
    request = {"jsonrpc": "2.0", "id": request_id, "method": "session/prompt", "params": params}
    return masked(orjson.dumps(request))


def _rows(rounds: Sequence[dict[str, Measured]]) -> list[Result]:
    pipelined = f"pipelined prompts/s, {CONNECTIONS} connections x {WINDOW} in flight"
    rates = [(r[TWO].rate, r[ONE].rate) for r in rounds]
    cpu = [(r[TWO].cpu_per_prompt * 1e6, r[ONE].cpu_per_prompt * 1e6) for r in rounds]
    every = [measured for r in rounds for measured in r.values()]

    def busy(side: str) -> float:
        return statistics.median(r[side].rate * r[side].cpu_per_prompt for r in rounds)

    def ceiling(r: dict[str, Measured]) -> float:
        """The most two workers could do over one on this machine with nothing else on
        it, at what a prompt cost in this round: each side's rate is bound by its
        workers (one core each) and by every core busy on the router, the clients and
        the backend together."""

        def most(side: str, workers: int) -> float:
            m = r[side]
            return min(
                workers / m.cpu_per_prompt,
                _cores() / (m.cpu_per_prompt + m.client_cpu + m.backend_cpu),
            )

        return most(TWO, 2) / most(ONE, 1)

    client = statistics.median(m.client_cpu for m in every) * 1e6
    backend = statistics.median(m.backend_cpu for m in every) * 1e6
    return [
        row(BENCH, f"{pipelined}, {TWO}", f"the same, {ONE}", rates, "msg/s", THROUGHPUT),
        row(BENCH, f"router CPU per prompt, {TWO}", f"the same, {ONE}", cpu, "us"),
        Figure(
            BENCH,
            "ceiling of the throughput ratio here (all cores on prompts, clients and backend too)",
            statistics.median(ceiling(r) for r in rounds),
            "x",
        ),
        Figure(BENCH, f"cores busy in the router, {ONE}", busy(ONE), "cores"),
        Figure(BENCH, f"cores busy in the router, {TWO}", busy(TWO), "cores"),
        Figure(BENCH, "clients' CPU per prompt (this process)", client, "us"),
        Figure(BENCH, "backend's CPU per prompt", backend, "us"),
        Figure(BENCH, "cores on this machine (clients and backend share them)", _cores(), ""),
    ]


def _cores() -> float:
    return float(len(os.sched_getaffinity(0)))


def _router_cpu(router: Child) -> float:
    """CPU seconds of the router process and its workers so far."""
    pid = router.pid
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return cpu_seconds(pid) + sum(cpu_seconds(int(child)) for child in children)


async def _pump(side: Side, prompts: int, backend: int) -> Measured:
    """``prompts`` prompts over every connection of ``side``, ``WINDOW`` in flight on
    each; the rate and the CPU each party spent per prompt."""
    each = prompts // len(side.connections)
    cpu, client, backend_cpu = _router_cpu(side.router), _own_cpu(), cpu_seconds(backend)
    started = time.perf_counter()
    async with asyncio.timeout(WAIT * 8):
        await asyncio.gather(
            *(_pipeline(c, f, each) for c, f in zip(side.connections, side.frames, strict=True))
        )
    seconds = time.perf_counter() - started
    total = each * len(side.connections)
    return Measured(
        total / seconds,
        (_router_cpu(side.router) - cpu) / total,
        (_own_cpu() - client) / total,
        (cpu_seconds(backend) - backend_cpu) / total,
    )


def _own_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def _pipeline(connection: Connection, frames: Sequence[bytes], count: int) -> None:
    """``count`` prompts on one connection, ``WINDOW`` always in flight. The answers
    are counted as they come, many to a read, not parsed: the client must cost little
    beside the router it measures."""
    reader, writer = connection.reader, connection.writer
    writer.write(b"".join(frames[:WINDOW]))
    sent, answered, pending = WINDOW, 0, b""
    while answered < count:
        chunk = await reader.read(1 << 16)
        if not chunk:
            raise BenchError("the router closed a connection")
        if b'"error"' in chunk:
            raise BenchError(f"a prompt failed: {chunk[:300]!r}")
        texts, pings, pending = _frames(pending + chunk)
        answered += texts
        more = min(texts, count - sent)
        out = [frames[(sent + n) % len(frames)] for n in range(more)]
        out += [_pong(payload) for payload in pings]
        if out:
            writer.write(b"".join(out))
        sent += more


def _frames(data: bytes) -> tuple[int, list[bytes], bytes]:
    """The whole server frames at the start of ``data``: how many are text, the payloads
    of the pings among them, and the rest of ``data`` (a frame not whole yet)."""
    texts, pings, at = 0, [], 0
    while len(data) - at >= 2:
        opcode, length, head = data[at] & 0x0F, data[at + 1] & 0x7F, 2
        if length >= 126:
            head = 4 if length == 126 else 10
            if len(data) - at < head:
                break
            length = int.from_bytes(data[at + 2 : at + head], "big")
        if len(data) - at < head + length:
            break
        if opcode == 0x1:
            texts += 1
        elif opcode == 0x9:
            pings.append(data[at + head : at + head + length])
        at += head + length
    return texts, pings, data[at:]


def _pong(payload: bytes) -> bytes:
    return bytes([0x8A, 0x80 | len(payload)]) + bytes(4) + payload
