"""Forwarding: ``session/prompt`` on attached sessions to one reference agent, directly
and through each hop in the same run.

Hops: the router (a subprocess whose only backend is the agent), the bare aiohttp
pass-through forwarder of :mod:`bench.passthrough` (no parsing at all), and HAProxy
in HTTP mode (a byte tunnel after the upgrade) when it is installed; and two
variants held against the router: a second router on the standard asyncio loop (the
router runs on uvloop by default where it installs), and a client of the same router that offers permessage-deflate (what compression costs
per frame; this router turns ``router.compression`` on, off by default, and a client
that does not offer deflate never gets it). Each prompt is
answered by one ``session/update`` chunk and the response, so a round trip is one
frame out and two back. Per round, every side in rotating order:

* latency: prompts one at a time on one session; p50 and p99 of each side;
* throughput: a window of sessions on the connection, each with one prompt always
  in flight (an agent runs one turn per session at a time), for a fixed count.

The hops are held against each other too: "added latency" is a hop's p50 minus
direct's p50 in the same round, so router/forwarder is the router's price per hop
in units of the cheapest aiohttp hop there is.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from bench.clients import DEFLATE as DEFLATE_BITS
from bench.fleet import Child, Fleet, haproxy_missing
from bench.ratios import Budget, Result, Target, micro, percentile, row, shuffled
from bench.wire import AcpSocket, BenchError, prompt_params

T = TypeVar("T")

BENCH = "forwarding"
DIRECT = "direct"
ROUTER = "router"
FORWARDER = "forwarder"
HAPROXY = "haproxy"
ASYNCIO = "router on asyncio"
DEFLATE = "router, client with deflate"
#: sides held against the router itself rather than against the other hops
VARIANTS = (ASYNCIO, DEFLATE)
BASELINE = "client -> agent direct"
PROMPT = "Summarise the routing table of this repository in two sentences, please."
TURN = Target("prompt turn through the router <= 1.3x direct (p50)", 1.3)
ADDED = Target("router's added latency <= 1.2x the bare forwarder's (p50)", 1.2)
PIPELINED = Target("router's pipelined throughput >= 0.8x the bare forwarder's", 0.8, False)


@dataclass(frozen=True, slots=True)
class Side:
    name: str
    socket: AcpSocket
    sessions: list[str]


@dataclass(frozen=True, slots=True)
class Sizes:
    latency: int
    throughput: int
    window: int


@dataclass(frozen=True, slots=True)
class Round:
    p50: dict[str, float]
    p99: dict[str, float]
    rate: dict[str, float]


async def run(
    fleet: Fleet, agent: Child, router: Child, budget: Budget, notes: list[str]
) -> list[Result]:
    sizes = Sizes(latency=budget.size(1000, 400), throughput=budget.size(2000, 800), window=32)
    async with contextlib.AsyncExitStack() as stack:
        urls = {DIRECT: agent.url, ROUTER: router.url}
        urls[FORWARDER] = (await stack.enter_async_context(fleet.passthrough(agent.url))).url
        missing = haproxy_missing()
        if missing is None:
            urls[HAPROXY] = (await stack.enter_async_context(fleet.haproxy(agent.url))).url
        else:
            notes.append(f"forwarding: no HAProxy rows: {missing}")
            print(f"bench: skipping HAProxy: {missing}", flush=True)
        on_asyncio = fleet.router("router-asyncio", [agent.backend], event_loop="asyncio")
        urls[ASYNCIO] = (await stack.enter_async_context(on_asyncio)).url
        urls[DEFLATE] = router.url  # the same router; this client offers permessage-deflate
        sides = []
        for name, url in urls.items():
            compress = DEFLATE_BITS if name == DEFLATE else 0
            connecting = AcpSocket.connect(fleet.http, url, compress=compress)
            sides.append(
                await _side(name, await stack.enter_async_context(connecting), sizes.window)
            )
        for side in sides:  # warm up: links open, code paths hot
            await _latency(side, sizes.latency // 4)
            await _throughput(side, sizes.throughput // 4)
        rounds = [await _round(sides, sizes, index) for index in range(budget.rounds)]
    return _rows(rounds, [side.name for side in sides], sizes)


async def _side(name: str, socket: AcpSocket, window: int) -> Side:
    return Side(name, socket, [await socket.new_session() for _ in range(window)])


async def _round(sides: list[Side], sizes: Sizes, index: int) -> Round:
    latency = await _each(sides, index, lambda side: _latency(side, sizes.latency))
    rate = await _each(sides, index, lambda side: _throughput(side, sizes.throughput))
    return Round(
        {name: percentile(samples, 50) for name, samples in latency.items()},
        {name: percentile(samples, 99) for name, samples in latency.items()},
        rate,
    )


def _rows(rounds: Sequence[Round], names: list[str], sizes: Sizes) -> list[Result]:
    hops = [name for name in names if name != DIRECT]
    pipelined = f"pipelined prompts/s (window {sizes.window})"
    rows: list[Result] = []
    for hop in hops:
        pairs = [(r.p50[hop], r.p50[DIRECT]) for r in rounds]
        target = TURN if hop == ROUTER else None
        rows.append(
            row(BENCH, f"prompt round trip p50, {hop}", BASELINE, micro(pairs), "us", target)
        )
    for hop in hops:
        pairs = [(r.p99[hop], r.p99[DIRECT]) for r in rounds]
        rows.append(row(BENCH, f"prompt round trip p99, {hop}", BASELINE, micro(pairs), "us"))
    for hop in hops:
        pairs = [(r.rate[hop], r.rate[DIRECT]) for r in rounds]
        rows.append(row(BENCH, f"{pipelined}, {hop}", BASELINE, pairs, "msg/s"))
    for other in [hop for hop in hops if hop != ROUTER and hop not in VARIANTS]:
        forwarder = other == FORWARDER
        added = [(r.p50[ROUTER] - r.p50[DIRECT], r.p50[other] - r.p50[DIRECT]) for r in rounds]
        rows.append(
            row(
                BENCH,
                "added latency p50, router",
                f"added latency p50, {other}",
                micro(added),
                "us",
                ADDED if forwarder else None,
            )
        )
        rates = [(r.rate[ROUTER], r.rate[other]) for r in rounds]
        target = PIPELINED if forwarder else None
        rows.append(
            row(BENCH, f"{pipelined}, router", f"the same, {other}", rates, "msg/s", target)
        )
    for variant in [hop for hop in hops if hop in VARIANTS]:
        added = [(r.p50[variant] - r.p50[DIRECT], r.p50[ROUTER] - r.p50[DIRECT]) for r in rounds]
        base = "added latency p50, router"
        rows.append(row(BENCH, f"added latency p50, {variant}", base, micro(added), "us"))
        rates = [(r.rate[variant], r.rate[ROUTER]) for r in rounds]
        rows.append(row(BENCH, f"{pipelined}, {variant}", "the same, router", rates, "msg/s"))
    return rows


async def _each(
    sides: list[Side], index: int, measure: Callable[[Side], Awaitable[T]]
) -> dict[str, T]:
    """``measure`` on every side, in an order drawn for the round (:func:`shuffled`)."""
    results: dict[str, T] = {}
    for side in shuffled(sides, index):
        results[side.name] = await measure(side)
    return results


async def _latency(side: Side, count: int) -> list[float]:
    """Seconds per prompt round trip, one at a time."""
    params = prompt_params(side.sessions[0], PROMPT)
    samples = []
    for _ in range(count):
        started = time.perf_counter()
        await side.socket.call("session/prompt", params)
        samples.append(time.perf_counter() - started)
    return samples


async def _throughput(side: Side, count: int) -> float:
    """Prompts per second with one prompt in flight on every session of the side."""
    in_flight: dict[int, str] = {}
    started = time.perf_counter()
    for session_id in side.sessions[:count]:
        await _prompt(side.socket, session_id, in_flight)
    sent = len(in_flight)
    while in_flight:
        reply = await side.socket.response()
        if reply.get("id") not in in_flight:
            raise BenchError(f"a reply to no prompt in flight: {reply}")
        session_id = in_flight.pop(reply["id"])
        if sent < count:
            await _prompt(side.socket, session_id, in_flight)
            sent += 1
    return count / (time.perf_counter() - started)


async def _prompt(socket: AcpSocket, session_id: str, in_flight: dict[int, str]) -> None:
    request_id = await socket.send("session/prompt", prompt_params(session_id, PROMPT))
    in_flight[request_id] = session_id
