"""The hop alone: what the router adds to a frame's way, against the bare aiohttp
forwarder (:mod:`bench.passthrough`), with a backend that does no work.

The backend is one scripted backend (:mod:`bench.scripted`): it answers a
``session/prompt`` at once, so a round trip is the client, the hop and the
backend's read and write, nothing else (with the reference agent, its own turn
dilutes the hop: see :mod:`bench.forwarding`). Sides: the client straight to the
backend, through the forwarder, through HAProxy (when installed), through the
router as users get it (uvloop where it installs), through a router on the standard
asyncio loop (``router.event_loop = "asyncio"``: what uvloop gains it), and,
with ``--before DIR`` (repeatable), through a router run from another checkout of the
package (an older commit; named for its folder), in the same rounds.
Per round, every side in an order drawn for the round (each side follows a different one
from round to round; a fixed cycle made the router side always follow direct):

* consecutive prompts: each side in turn sends a slice of prompts one after
  another on its warm connection, and the next side starts when it is done, the
  sides taking turns slice by slice (``SLICES`` of them a round, in an order drawn
  for each), so that a spell of load from elsewhere on the machine falls on every
  side alike instead of on the one whose whole batch it overlapped; a side's p50
  over its slices minus direct's is what its hop adds, and the hop's CPU time over
  them, divided by its prompts, is its CPU per request-and-answer round trip (and,
  from ``/proc/<pid>/stat``'s ticks, how much of it is user space and how much the
  kernel: the router's against the forwarder's and HAProxy's says where it stands);
  This is the path an editor waits on, each side measured alone (taking turns prompt
  by prompt, below, adds every process's wake-up to every hop alike);
* latency, alternating: prompts one at a time, the sides taking turns prompt by
  prompt (a burst of load from elsewhere falls on all of them alike);
* CPU per forwarded frame: prompts that each ask the backend to stream
  ``session/update`` notifications as fast as it can, then answer, the hops taking
  turns prompt by prompt; the hop's CPU time (``/proc/<pid>/task/*/schedstat``,
  nanoseconds) over the frames it forwarded (each prompt, its updates and its
  answer). Its inverse is frames per second per core.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.fleet import Child, Fleet, Scripted, haproxy_missing
from bench.observe import cpu_split, cpu_time, migrations
from bench.ratios import Budget, Figure, Result, Target, micro, percentile, row, shuffled
from bench.wire import AcpSocket, BenchError, prompt_params, resume_params

BENCH = "hop"
DIRECT = "direct"
ROUTER = "router"
FORWARDER = "forwarder"
SESSION = "b0-hop"
PROMPT = "Say nothing: the backend answers at once."
HAPROXY = "haproxy"
#: turns a round's consecutive prompts are taken in, each side's slice one after another
SLICES = 10
ASYNCIO = "router on asyncio"
#: the margin of issue 35: clearly cheaper than the forwarder, on any machine of the kind
ADDED = Target(
    "hop alone: router's added latency on consecutive prompts <= 0.8x the forwarder's (p50)", 0.8
)
TRIP = Target("hop alone: router's CPU per request-and-answer <= 0.8x the forwarder's", 0.8)
CPU = Target("hop alone: router's CPU per streamed update <= 0.8x the forwarder's", 0.8)
#: HAProxy as the reference beside the forwarder
HAPROXY_ADDED = Target(
    "hop alone: router's added latency on consecutive prompts <= 1.5x HAProxy's (p50)", 1.5
)


@dataclass(frozen=True, slots=True)
class Side:
    name: str
    socket: AcpSocket
    #: the hop's process (None: direct, no hop)
    pid: int | None


@dataclass(frozen=True, slots=True)
class Sizes:
    consecutive: int
    latency: int
    prompts: int
    updates: int

    @property
    def frames(self) -> int:
        """Frames a hop forwards per streaming batch: each prompt, its updates, its answer."""
        return self.prompts * (self.updates + 2)


@dataclass(frozen=True, slots=True)
class Round:
    #: p50 of each side's batch of consecutive prompts
    batch_p50: dict[str, float]
    #: CPU seconds per request-and-answer round trip, per hop, over its batch
    trip_cpu: dict[str, float]
    #: the same in user space and in the kernel (10 ms ticks over the round's batches)
    trip_user: dict[str, float]
    trip_kernel: dict[str, float]
    #: how often the hop's threads moved to another CPU, per request-and-answer
    trip_moves: dict[str, float]
    #: p50 of the prompts alternating between the sides
    p50: dict[str, float]
    #: CPU seconds per forwarded frame, per hop
    cpu: dict[str, float]


async def run(
    fleet: Fleet, backends: Scripted, budget: Budget, notes: list[str], before: Sequence[Path] = ()
) -> list[Result]:
    sizes = Sizes(
        consecutive=budget.size(2000, 600),
        latency=budget.size(3000, 1000),
        prompts=budget.size(100, 40),
        updates=budget.size(500, 250),
    )
    pool = backends.backends(1)
    backend_url = pool[0][1]
    async with contextlib.AsyncExitStack() as stack:
        hops: dict[str, Child] = {
            ROUTER: await stack.enter_async_context(fleet.router("router-hop", pool)),
            FORWARDER: await stack.enter_async_context(fleet.passthrough(backend_url)),
        }
        missing = haproxy_missing()
        if missing is None:
            hops[HAPROXY] = await stack.enter_async_context(fleet.haproxy(backend_url))
        else:
            notes.append(f"hop: no HAProxy side: {missing}")
        on_asyncio = fleet.router("router-hop-asyncio", pool, event_loop="asyncio")
        hops[ASYNCIO] = await stack.enter_async_context(on_asyncio)
        for source in before:
            older = fleet.router(f"router-hop-{source.name}", pool, source=source)
            hops[before_name(source)] = await stack.enter_async_context(older)
            notes.append(f"hop: '{before_name(source)}' is the router package in {source}")
        urls = {DIRECT: backend_url, **{name: child.url for name, child in hops.items()}}
        sides = []
        for name, url in urls.items():
            socket = await stack.enter_async_context(AcpSocket.connect(fleet.http, url))
            await socket.call("session/resume", resume_params(SESSION))
            pid = hops[name].pid if name in hops else None
            sides.append(Side(name, socket, pid))
        for side in sides:  # warm up: code paths hot
            await _latency(side, sizes.latency // 4)
            await _stream(side, Sizes(0, 0, sizes.prompts // 4, sizes.updates))
        rounds = [await _round(sides, sizes, index) for index in range(budget.rounds)]
    return _rows(rounds, list(hops), [before_name(source) for source in before])


def before_name(source: Path) -> str:
    """What a router run from the package in ``source`` is called in the rows."""
    return f"router at {source.name}"


async def _round(sides: list[Side], sizes: Sizes, index: int) -> Round:
    samples: dict[str, list[float]] = {side.name: [] for side in sides}
    spent = {side.name: 0.0 for side in sides if side.pid is not None}
    split = {side.name: cpu_split(side.pid) for side in sides if side.pid is not None}
    moved = {side.name: migrations(side.pid) for side in sides if side.pid is not None}
    for turn in range(SLICES):
        for side in shuffled(sides, index * SLICES + turn):
            spent_now = await _consecutive(side, sizes.consecutive // SLICES, samples[side.name])
            if side.pid is not None:
                spent[side.name] += spent_now
    batch_p50 = {name: percentile(taken, 50) for name, taken in samples.items()}
    trip_cpu = {name: seconds / len(samples[name]) for name, seconds in spent.items()}
    user, kernel, moves = {}, {}, {}
    for side in sides:
        if side.pid is not None:  # idle while the other sides took their turns
            (user_then, kernel_then), (user_now, kernel_now) = split[side.name], cpu_split(side.pid)
            prompts = len(samples[side.name])
            user[side.name] = (user_now - user_then) / prompts
            kernel[side.name] = (kernel_now - kernel_then) / prompts
            moves[side.name] = (migrations(side.pid) - moved[side.name]) / prompts
    order = shuffled(sides, index)
    latency = await _latencies(order, sizes.latency)
    hops = [side for side in order if side.pid is not None]
    cpu = await _cpu_per_frame(hops, sizes)
    p50 = {name: percentile(samples, 50) for name, samples in latency.items()}
    return Round(batch_p50, trip_cpu, user, kernel, moves, p50, cpu)


def _rows(rounds: list[Round], hops: list[str], befores: list[str]) -> list[Result]:
    others = [hop for hop in hops if hop != FORWARDER]
    consecutive = "added latency p50, consecutive prompts"
    rows = [
        *_against(rounds, others, befores, consecutive, _batch_added, ADDED),
        *_against(rounds, others, befores, "CPU per request-and-answer", _trip_cpu, TRIP),
        *_against(rounds, others, befores, "added latency p50, prompts alternating",
                  _alternating_added, None),
        *_against(rounds, others, befores, "CPU per streamed update", _frame_cpu, CPU),
    ]  # fmt: skip
    if HAPROXY in hops:  # the reference beside the forwarder
        pairs = [(_batch_added(r, ROUTER), _batch_added(r, HAPROXY)) for r in rounds]
        base = f"the same, {HAPROXY}"
        rows.append(row(BENCH, f"{consecutive}, router", base, micro(pairs), "us", HAPROXY_ADDED))
    # where the router's CPU per request-and-answer goes, against the others': what
    # stands between it and HAProxy (over every round at once: a round is a few ticks)
    for where, figure in (("in user space", _trip_user), ("in the kernel", _trip_kernel)):
        for other in (hop for hop in (FORWARDER, HAPROXY) if hop in hops):
            pair = (_mean(rounds, figure, ROUTER), _mean(rounds, figure, other))
            measure = f"CPU per request-and-answer {where}, all rounds, router"
            rows.append(row(BENCH, measure, f"the same, {other}", micro([pair]), "us"))
    # how often each hop was moved to another CPU (its caches left behind): the scheduler's
    # doing, not the hop's, and a part of the spread of every figure above between runs
    for hop in hops:
        moves = statistics.median(r.trip_moves[hop] for r in rounds)
        measure = f"CPU migrations per request-and-answer, consecutive prompts, {hop}"
        rows.append(Figure(BENCH, measure, moves, "moves"))
    # what uvloop gains the router: the router as users get it against one on asyncio
    for what, figure in (
        ("CPU per request-and-answer", _trip_cpu),
        ("CPU per streamed update", _frame_cpu),
    ):
        pairs = [(figure(r, ROUTER), figure(r, ASYNCIO)) for r in rounds]
        rows.append(row(BENCH, f"{what}, router", f"the same, {ASYNCIO}", micro(pairs), "us"))
    for hop in [*others, FORWARDER]:
        p50 = [(r.batch_p50[hop], r.batch_p50[DIRECT]) for r in rounds]
        measure = f"prompt round trip p50, consecutive prompts, {hop}"
        rows.append(row(BENCH, measure, DIRECT, micro(p50), "us"))
    return rows


def _against(
    rounds: list[Round],
    others: list[str],
    befores: list[str],
    what: str,
    figure: Callable[[Round, str], float],
    target: Target | None,
) -> list[Result]:
    """``what`` (``figure`` of a round and a hop, seconds) of each hop against the
    forwarder's, then the router's against each older router's."""
    rows: list[Result] = []
    for hop in others:
        pairs = [(figure(r, hop), figure(r, FORWARDER)) for r in rounds]
        chosen = target if hop == ROUTER else None
        rows.append(row(BENCH, f"{what}, {hop}", "the same, forwarder", micro(pairs), "us", chosen))
    for older in befores:
        pairs = [(figure(r, ROUTER), figure(r, older)) for r in rounds]
        rows.append(row(BENCH, f"{what}, router", f"the same, {older}", micro(pairs), "us"))
    return rows


def _batch_added(r: Round, hop: str) -> float:
    return r.batch_p50[hop] - r.batch_p50[DIRECT]


def _alternating_added(r: Round, hop: str) -> float:
    return r.p50[hop] - r.p50[DIRECT]


def _trip_cpu(r: Round, hop: str) -> float:
    return r.trip_cpu[hop]


def _mean(rounds: list[Round], figure: Callable[[Round, str], float], hop: str) -> float:
    return sum(figure(r, hop) for r in rounds) / len(rounds)


def _trip_user(r: Round, hop: str) -> float:
    return r.trip_user[hop]


def _trip_kernel(r: Round, hop: str) -> float:
    return r.trip_kernel[hop]


def _frame_cpu(r: Round, hop: str) -> float:
    return r.cpu[hop]


async def _consecutive(side: Side, count: int, samples: list[float]) -> float:
    """``count`` prompts one after another on ``side`` alone, each one's round trip
    (seconds) appended to ``samples``: the CPU seconds the hop spent on them (0: direct,
    no hop)."""
    params = prompt_params(SESSION, PROMPT)
    started_cpu = cpu_time(side.pid) if side.pid is not None else 0.0
    for _ in range(count):
        started = time.perf_counter()
        await side.socket.call("session/prompt", params)
        samples.append(time.perf_counter() - started)
    return 0.0 if side.pid is None else cpu_time(side.pid) - started_cpu


async def _latency(side: Side, count: int) -> list[float]:
    """Seconds per prompt round trip, one at a time."""
    return (await _latencies([side], count))[side.name]


async def _latencies(sides: list[Side], count: int) -> dict[str, list[float]]:
    """Seconds per prompt round trip, one at a time, the sides taking turns prompt by
    prompt: a burst of load from elsewhere on the machine falls on all of them alike."""
    params = prompt_params(SESSION, PROMPT)
    samples: dict[str, list[float]] = {side.name: [] for side in sides}
    for _ in range(count):
        for side in sides:
            started = time.perf_counter()
            await side.socket.call("session/prompt", params)
            samples[side.name].append(time.perf_counter() - started)
    return samples


async def _cpu_per_frame(hops: list[Side], sizes: Sizes) -> dict[str, float]:
    """Each hop's CPU seconds per frame it forwarded while prompts streamed updates, the
    hops taking turns prompt by prompt."""
    spent = {side.name: 0.0 for side in hops}
    one = Sizes(0, 0, 1, sizes.updates)
    for _ in range(sizes.prompts):
        for side in hops:
            assert side.pid is not None
            started = cpu_time(side.pid)
            await _stream(side, one)
            spent[side.name] += cpu_time(side.pid) - started
    return {name: seconds / sizes.frames for name, seconds in spent.items()}


async def _stream(side: Side, sizes: Sizes) -> None:
    """``sizes.prompts`` prompts, one at a time, each answered after ``sizes.updates``
    streamed notifications, every one of which is read."""
    params = {**prompt_params(SESSION, PROMPT), "_meta": {"updates": sizes.updates}}
    for _ in range(sizes.prompts):
        await side.socket.send("session/prompt", params)
        seen = 0
        while "method" in (message := await side.socket.receive()):
            seen += 1
        if "error" in message or seen != sizes.updates:
            raise BenchError(f"{side.name}: {seen} updates, then {message}")
