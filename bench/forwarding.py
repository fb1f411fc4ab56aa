"""Forwarding: ``session/prompt`` on attached sessions, through the router vs. direct.

Two connections from this process: one straight to an agent (the baseline) and one
to a router subprocess whose only backend is that agent. Each prompt is answered by
one ``session/update`` chunk and the response, so a round trip is one frame out and
two back. Per round, in alternating order:

* latency: prompts one at a time on one session; p50 and p99 of each side;
* throughput: a window of sessions on the connection, each with one prompt always
  in flight (an agent runs one turn per session at a time), for a fixed count.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from bench.fleet import Child, Fleet
from bench.ratios import Budget, Row, micro, percentile, rotated, row
from bench.wire import AcpSocket, BenchError, prompt_params

T = TypeVar("T")

BENCH = "forwarding"
BASELINE = "client -> agent direct"
PROMPT = "Summarise the routing table of this repository in two sentences, please."


@dataclass(frozen=True, slots=True)
class Side:
    socket: AcpSocket
    sessions: list[str]


@dataclass(frozen=True, slots=True)
class Sizes:
    latency: int
    throughput: int
    window: int


async def run(fleet: Fleet, agent: Child, router: Child, budget: Budget) -> list[Row]:
    sizes = Sizes(latency=budget.size(1500, 1000), throughput=budget.size(4000, 3000), window=32)
    async with (
        AcpSocket.connect(fleet.http, router.url) as via_router,
        AcpSocket.connect(fleet.http, agent.url) as direct,
    ):
        sides = [await _side(direct, sizes.window), await _side(via_router, sizes.window)]
        for side in sides:  # warm up: links open, code paths hot
            await _latency(side, sizes.latency // 4)
            await _throughput(side, sizes.throughput // 4)
        return await _rounds(sides, sizes, budget.rounds)


async def _side(socket: AcpSocket, window: int) -> Side:
    return Side(socket, [await socket.new_session() for _ in range(window)])


async def _rounds(sides: list[Side], sizes: Sizes, rounds: int) -> list[Row]:
    p50: list[tuple[float, float]] = []
    p99: list[tuple[float, float]] = []
    rate: list[tuple[float, float]] = []
    for index in range(rounds):
        latency = await _both(sides, index, lambda side: _latency(side, sizes.latency))
        direct, routed = latency[0], latency[1]
        p50.append((percentile(routed, 50), percentile(direct, 50)))
        p99.append((percentile(routed, 99), percentile(direct, 99)))
        speed = await _both(sides, index, lambda side: _throughput(side, sizes.throughput))
        rate.append((speed[1], speed[0]))
    return [
        row(BENCH, "prompt round trip p50", BASELINE, micro(p50), "us"),
        row(BENCH, "prompt round trip p99", BASELINE, micro(p99), "us"),
        row(BENCH, f"pipelined prompts/s (window {sizes.window})", BASELINE, rate, "msg/s"),
    ]


async def _both(sides: list[Side], index: int, measure: Callable[[Side], Awaitable[T]]) -> list[T]:
    """``measure`` on each side, in alternating order; results in the order of ``sides``."""
    results: dict[int, T] = {}
    for position in rotated(range(len(sides)), index):
        results[position] = await measure(sides[position])
    return [results[position] for position in range(len(sides))]


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
