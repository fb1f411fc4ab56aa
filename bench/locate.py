"""Locate: ``session/resume`` through a router in front of three agents.

Sessions are created directly on the agents (round robin) and stay active there
(their creating connection stays open). Two router connections resume them, their
links to all three agents opened during warm-up so no link handshake is timed:

* cache miss: connection A resumes sessions the router has never seen: a probe to
  every agent, then the forwarded resume;
* cache hint: connection B resumes sessions A resumed the round before, which the
  router's location cache holds: one probe to the hinted agent, then the resume.

The baseline is one ``session/status`` round trip straight to an agent. Time is
from the request sent to its response read; the three run in rotating order.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence

from bench.fleet import Child, Fleet
from bench.ratios import Budget, Row, percentile, rotated, row
from bench.wire import AcpSocket, resume_params

BENCH = "locate"
BASELINE = "session/status direct"
#: a router connection attaches at most 1024 sessions; B and A each attach this many
MAX_ATTACHED = 900


async def run(fleet: Fleet, router: Child, budget: Budget) -> list[Row]:
    per_round = max(5, min(budget.size(100, 40), MAX_ATTACHED // (budget.rounds + 1)))
    async with contextlib.AsyncExitStack() as stack:
        agents = [
            await stack.enter_async_context(AcpSocket.connect(fleet.http, agent.url))
            for agent in fleet.agents
        ]
        miss = await stack.enter_async_context(AcpSocket.connect(fleet.http, router.url))
        hint = await stack.enter_async_context(AcpSocket.connect(fleet.http, router.url))
        warm = await _create(agents, len(agents))
        await _resume_all(miss, warm)  # opens A's links to every agent
        await _resume_all(hint, warm)  # and B's
        return await _rounds(agents, miss, hint, per_round, budget.rounds)


async def _rounds(
    agents: list[AcpSocket], miss: AcpSocket, hint: AcpSocket, per_round: int, rounds: int
) -> list[Row]:
    cached = await _create(agents, per_round)
    await _resume_all(miss, cached)  # untimed: puts the first batch in the cache
    missed: list[tuple[float, float]] = []
    hinted: list[tuple[float, float]] = []
    for index in range(rounds):
        fresh = await _create(agents, per_round)
        timed: dict[str, float] = {}
        for name in rotated(["status", "miss", "hint"], index):
            if name == "status":
                timed[name] = await _status(agents[0], cached[0], per_round)
            elif name == "miss":
                timed[name] = await _resume_all(miss, fresh)
            else:
                timed[name] = await _resume_all(hint, cached)
        missed.append((timed["miss"] * 1e6, timed["status"] * 1e6))
        hinted.append((timed["hint"] * 1e6, timed["status"] * 1e6))
        cached = fresh
    return [
        row(BENCH, "resume p50, cache miss (N=3)", BASELINE, missed, "us"),
        row(BENCH, "resume p50, cache hint (N=3)", BASELINE, hinted, "us"),
    ]


async def _create(agents: Sequence[AcpSocket], count: int) -> list[str]:
    """``count`` new sessions, round robin over ``agents``, left active there."""
    return [await agents[n % len(agents)].new_session() for n in range(count)]


async def _resume_all(socket: AcpSocket, sessions: Sequence[str]) -> float:
    """Median seconds from sending each resume to reading its response."""
    samples = []
    for session_id in sessions:
        started = time.perf_counter()
        await socket.call("session/resume", resume_params(session_id))
        samples.append(time.perf_counter() - started)
    return percentile(samples, 50)


async def _status(socket: AcpSocket, session_id: str, count: int) -> float:
    samples = []
    for _ in range(count):
        started = time.perf_counter()
        await socket.call("session/status", {"sessionId": session_id})
        samples.append(time.perf_counter() - started)
    return percentile(samples, 50)
