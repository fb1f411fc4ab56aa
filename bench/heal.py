"""``python -m bench.heal``: once every fault has healed, is each session active on one
agent? (not part of CI)

Two router replicas in front of three reference agents, each agent on a store of its own
and behind a TCP relay of its own. Each session's file is copied to the three stores when
the session is made, so any agent can resume any session, and a session resumed on a
second agent is a second live copy: with separate stores no lease fences the first one
off (the reference agent's fence needs a shared store), as in a fleet whose agents keep
their sessions apart.

Each round brings weather, heals it, and counts:

* faults drawn at random: a relay refuses new connections and cuts its open ones, for
  less than the replicas' ``control.down_grace_ms`` or for longer; an agent is killed
  (SIGKILL); a replica is stopped (SIGTERM);
* meanwhile a holder per session (a client on one replica) runs turns, resuming again
  wherever the session is when its link goes, and at a random moment one fresh client on
  each replica resumes the same random session at once;
* then the weather heals: every relay listens again, every killed agent starts again on
  its port and store, every stopped replica starts again on its port, and both replicas
  are ready (all three backends up);
* then each agent is asked directly (``session/status``, not through a router) about each
  session, again and again until no session is active on two agents or ``--settle``
  seconds have passed: the sessions active on two agents then are the round's figure.

It prints a line every 50 rounds and a summary, and exits 1 if any round ended with a
session active on two agents. ``--no-failover`` turns the replicas' failover off (on is
the router's default).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import shutil
import sys
from collections import Counter
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from bench.fleet import Child, Fleet, free_port, start_fleet
from bench.observe import raise_open_files
from bench.wire import AcpSocket, BenchError, prompt_params, resume_params
from router.tasks import cancel_all_and_wait
from tests.relay import Relay

GRACE_MS = 1000
#: how often the count asks the agents again while a split lasts (other processes: no
#: event to wait on)
RECOUNT_SECONDS = 0.2


@dataclass
class Tally:
    rounds: int = 0
    #: rounds that ended (after the heal and the settle) with a session on two agents
    split_rounds: int = 0
    most: int = 0
    last: int = 0
    first_split: int | None = None
    faults: Counter[str] = field(default_factory=Counter)
    outcomes: Counter[str] = field(default_factory=Counter)
    turns: Counter[str] = field(default_factory=Counter)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.heal", description=__doc__)
    parser.add_argument("--rounds", type=int, default=2000, help="rounds (2000)")
    parser.add_argument("--sessions", type=int, default=6, help="sessions, one holder each (6)")
    parser.add_argument(
        "--settle", type=float, default=3.0, help="seconds a split may take to end (3)"
    )
    parser.add_argument(
        "--no-failover",
        dest="failover",
        action="store_false",
        help="turn the replicas' failover off (on is the default)",
    )
    parser.add_argument(
        "--router-source",
        type=Path,
        default=None,
        metavar="DIR",
        help="a folder holding another router package to run the replicas from (an older"
        " commit's, for a before figure)",
    )
    parser.add_argument("--seed", type=int, default=1)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    raise_open_files()
    tally = asyncio.run(_heal_soak(args))
    first = "" if tally.first_split is None else f", the first after round {tally.first_split}"
    print(
        f"heal: {tally.rounds} rounds; {tally.split_rounds} ended with a session active on"
        f" two agents{first} (most at once: {tally.most}, at the end: {tally.last});"
        f" faults: {dict(sorted(tally.faults.items()))};"
        f" fresh resumes: {dict(sorted(tally.outcomes.items()))};"
        f" holder turns: {dict(sorted(tally.turns.items()))}"
    )
    return 1 if tally.split_rounds else 0


class Slot:
    """One process that is stopped (or killed) and started again the same way."""

    def __init__(self, starting: Callable[[], contextlib.AbstractAsyncContextManager[Child]]):
        self._starting = starting
        self._stack: contextlib.AsyncExitStack | None = None
        self.child: Child | None = None

    async def start(self) -> None:
        if self._stack is not None:
            return
        stack = contextlib.AsyncExitStack()
        self.child = await stack.enter_async_context(self._starting())
        self._stack = stack

    async def stop(self, *, kill: bool = False) -> None:
        """SIGTERM (SIGKILL with ``kill``), and wait for the process to end."""
        stack, child = self._stack, self.child
        self._stack, self.child = None, None
        if stack is None or child is None:
            return
        if kill:
            child.process.kill()
        await stack.aclose()


@dataclass
class World:
    """The fleet, its relays and replicas, and what the weather broke."""

    fleet: Fleet
    args: argparse.Namespace
    agents: dict[str, Slot]
    #: the agents' own addresses, for the count (not through the relays)
    agent_urls: dict[str, str]
    relays: dict[str, Relay]
    replicas: list[Slot]
    replica_urls: list[str]
    refused: set[str] = field(default_factory=set)
    killed: set[str] = field(default_factory=set)
    stopped: set[int] = field(default_factory=set)

    async def weather(self, rng: random.Random, tally: Tally) -> float:
        """Break things at random; how long the round lasts before the heal."""
        grace = GRACE_MS / 1000
        window = 0.3
        if rng.random() < 0.6:
            agent = rng.choice(list(self.relays))
            longer = rng.random() < 0.5
            seconds = grace * (rng.uniform(1.2, 2.0) if longer else rng.uniform(0.2, 0.8))
            await self.relays[agent].refuse()
            self.refused.add(agent)
            tally.faults["refusal_longer" if longer else "refusal_shorter"] += 1
            window = max(window, seconds)
        if rng.random() < 0.1:
            agent = rng.choice(list(self.agents))
            await self.agents[agent].stop(kill=True)
            self.killed.add(agent)
            tally.faults["agent_kill"] += 1
        if rng.random() < 0.05:
            index = rng.randrange(len(self.replicas))
            await self.replicas[index].stop()
            self.stopped.add(index)
            tally.faults["router_restart"] += 1
        return window

    async def heal(self) -> None:
        for agent in sorted(self.killed):
            await self.agents[agent].start()
        for agent in sorted(self.refused):
            await self.relays[agent].listen()
        for index in sorted(self.stopped):
            await self.replicas[index].start()
        self.refused, self.killed, self.stopped = set(), set(), set()

    async def split(self, sessions: list[str]) -> int:
        """How many of ``sessions`` the agents, asked directly, hold active on two or more."""
        active: Counter[str] = Counter()
        for url in self.agent_urls.values():
            async with AcpSocket.connect(self.fleet.http, url) as socket:
                for session_id in sessions:
                    if await socket.call("session/status", {"sessionId": session_id}) == {
                        "status": "active"
                    }:
                        active[session_id] += 1
        return sum(1 for count in active.values() if count > 1)


async def _heal_soak(args: argparse.Namespace) -> Tally:
    rng = random.Random(args.seed)
    tally = Tally()
    async with start_fleet(0) as fleet, _world(fleet, args) as world:
        sessions = await _sessions(world, args.sessions)
        async with _holders(fleet.http, world, sessions, tally):
            for n in range(1, args.rounds + 1):
                await _round(world, sessions, rng, tally)
                if tally.last and tally.first_split is None:
                    tally.first_split = n
                if n % 50 == 0:
                    print(
                        f"  {n} rounds, {tally.split_rounds} ended split (now {tally.last})",
                        flush=True,
                    )
    return tally


@contextlib.asynccontextmanager
async def _world(fleet: Fleet, args: argparse.Namespace) -> AsyncIterator[World]:
    names = [f"agent-{n}" for n in (1, 2, 3)]
    ports = {name: free_port() for name in names}
    agents = {name: Slot(_agent_starter(fleet, name, ports[name])) for name in names}
    agent_urls = {name: f"ws://127.0.0.1:{ports[name]}/acp" for name in names}
    relays = {name: Relay(ports[name]) for name in names}
    async with contextlib.AsyncExitStack() as stack:
        for name in names:
            await agents[name].start()
            stack.push_async_callback(agents[name].stop)
            await relays[name].listen()
            stack.push_async_callback(relays[name].close)
        backends = [(name, relays[name].url) for name in names]
        replica_ports = [free_port(), free_port()]
        replicas = [
            Slot(_router_starter(fleet, f"replica-{n}", port, backends, args))
            for n, port in enumerate(replica_ports)
        ]
        for replica in replicas:
            await replica.start()
            stack.push_async_callback(replica.stop)
        replica_urls = [f"ws://127.0.0.1:{port}/acp" for port in replica_ports]
        yield World(fleet, args, agents, agent_urls, relays, replicas, replica_urls)


def _agent_starter(
    fleet: Fleet, name: str, port: int
) -> Callable[[], contextlib.AbstractAsyncContextManager[Child]]:
    store = fleet.folder / f"store-{name}"
    store.mkdir()
    return lambda: fleet.agent(name, store, port)


def _router_starter(
    fleet: Fleet,
    name: str,
    port: int,
    backends: list[tuple[str, str]],
    args: argparse.Namespace,
) -> Callable[[], contextlib.AbstractAsyncContextManager[Child]]:
    return lambda: fleet.router(
        name,
        backends,
        source=args.router_source,
        router={"listen": f"127.0.0.1:{port}"},
        control={"down_grace_ms": GRACE_MS, "reconnect_initial_ms": 20, "reconnect_max_ms": 200},
        probe={"timeout_ms": 300},
        failover={"enabled": bool(args.failover)},
    )


async def _sessions(world: World, count: int) -> list[str]:
    """``count`` sessions made through the first replica, each copied to every store."""
    async with AcpSocket.connect(world.fleet.http, world.replica_urls[0]) as socket:
        sessions = [await socket.new_session() for _ in range(count)]
    stores = [world.fleet.folder / f"store-{name}" for name in world.agents]
    for session_id in sessions:
        (made,) = [store for store in stores if (store / f"{session_id}.jsonl").exists()]
        for store in stores:
            if store != made:
                shutil.copyfile(made / f"{session_id}.jsonl", store / f"{session_id}.jsonl")
    return sessions


@contextlib.asynccontextmanager
async def _holders(
    http: aiohttp.ClientSession, world: World, sessions: list[str], tally: Tally
) -> AsyncIterator[None]:
    tasks = [
        asyncio.create_task(_hold(http, world.replica_urls[n % 2], session_id, tally))
        for n, session_id in enumerate(sessions)
    ]
    try:
        yield
    finally:
        await cancel_all_and_wait(*tasks)


async def _hold(http: aiohttp.ClientSession, url: str, session_id: str, tally: Tally) -> None:
    """Keep ``session_id`` attached through the replica at ``url`` and run turns, forever."""
    while True:
        with contextlib.suppress(BenchError, aiohttp.ClientError, OSError):
            async with AcpSocket.connect(http, url) as socket:
                attached, _ = await socket.outcome("session/resume", resume_params(session_id))
                while attached == "ok":
                    outcome, _ = await socket.outcome(
                        "session/prompt", prompt_params(session_id, "/slow 0.5")
                    )
                    tally.turns[outcome] += 1
                    attached = outcome
        await asyncio.sleep(0.05)  # a pause before attaching again: nothing to wait on


async def _round(world: World, sessions: list[str], rng: random.Random, tally: Tally) -> None:
    window = await world.weather(rng, tally)
    at = rng.uniform(0.0, window)
    await asyncio.sleep(at)  # the weather's schedule: time is the point here
    session_id = rng.choice(sessions)
    outcomes = await asyncio.gather(
        *(_resume(world.fleet.http, url, session_id) for url in world.replica_urls)
    )
    tally.outcomes.update(outcomes)
    await asyncio.sleep(max(window - at, 0.0))
    await world.heal()
    tally.last = await _settled(world, sessions, world.args.settle)
    tally.rounds += 1
    tally.most = max(tally.most, tally.last)
    tally.split_rounds += bool(tally.last)


async def _settled(world: World, sessions: list[str], settle: float) -> int:
    """The sessions active on two agents once none is, or ``settle`` seconds on."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + settle
    while True:
        split = await world.split(sessions)
        if not split or loop.time() >= deadline:
            return split
        await asyncio.sleep(RECOUNT_SECONDS)


async def _resume(http: aiohttp.ClientSession, url: str, session_id: str) -> str:
    """One resume from a fresh connection: ``ok``, the error code, or ``down``."""
    try:
        async with AcpSocket.connect(http, url) as socket:
            outcome, _ = await socket.outcome("session/resume", resume_params(session_id))
            return outcome
    except (BenchError, aiohttp.ClientError, OSError):
        return "down"


if __name__ == "__main__":
    sys.exit(main())
