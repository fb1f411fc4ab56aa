"""``python -m bench.heal``: do two replicas agree on one home for each session, whatever
the weather? (the soak of docs/routing.md; not part of CI)

Two router replicas in front of three reference agents, each agent on a store of its own
and behind a TCP relay of its own. Each session's file is copied to the three stores when
the session is made, so any agent can resume any session, and a session resumed on a
second agent is a second live copy: with separate stores no lease fences the first one
off (the reference agent's fence needs a shared store), as in a fleet whose agents keep
their sessions apart. Only the epoch a router sends with each resume (the fencing token
of docs/routing.md) tells the copies apart.

Each round brings weather, heals it, and counts:

* faults drawn at random: a relay refuses new connections and cuts its open ones, for
  less than the replicas' ``control.down_grace_ms`` (2 s) or for longer (up to 5 s); an
  agent is killed (SIGKILL); a replica is stopped (SIGTERM);
* meanwhile a holder per session (a client on one replica, alternately) runs turns,
  resuming again wherever the session is when its link goes; and at a random moment of
  the round two fresh clients, one on each replica, resume the same random session at
  once and prompt it: when two agents answer those two prompts, the session ran on two
  agents at once, and the round is a **split round**;
* then the weather heals: every relay listens again, every killed agent starts again on
  its port and store, every stopped replica starts again on its port, and both replicas
  are ready (all three backends up);
* then each agent is asked directly (``session/status``, not through a router) about each
  session, again and again until no session is active on two agents or ``--settle``
  seconds have passed.

Every request the soak sends waits at most 15 s for its answer; one that gets none while
its connection stays open is **unanswered**. At the end it reads the three stores: a
session whose turns were answered on two agents has agent messages in two stores (a
failover to a copy in another store does that too: separate stores cannot move history).

It prints a line every 50 rounds and a summary, and exits 1 when the soak's bounds are
broken: more than one split round per 1,000, a session split twice, or any unanswered
request. ``--no-failover`` turns the replicas' failover off (on is the router's default);
``--router-source`` runs the replicas *and the agents* from another checkout's ``router``
package (a before figure: ``git archive <commit> router | tar -x -C DIR``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import re
import shutil
import sys
from collections import Counter
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from bench.fleet import Child, Fleet, free_port, start_fleet
from bench.observe import raise_open_files
from bench.wire import AcpSocket, BenchError, JsonObject, prompt_params, resume_params
from router.tasks import cancel_all_and_wait
from tests.relay import Relay

GRACE_MS = 2000
#: the longest a relay refuses: past the grace, as a partition is
LONGEST_REFUSAL_SECONDS = 5.0
#: how often the count asks the agents again while a split lasts (other processes: no
#: event to wait on)
RECOUNT_SECONDS = 0.2
#: split rounds the soak allows per 1,000 rounds
SPLITS_PER_THOUSAND = 1
#: a holder's pause between its turns (a user reading the answer)
HOLDER_PAUSE_SECONDS = 0.5
#: how long a fresh client retries what is retryable, and its pause between tries
VISIT_SECONDS = 4.0
RETRY_SECONDS = 0.1
#: the router's retryable codes (docs/errors.md), and -32010: resume again
RETRYABLE = frozenset({"-32010", "-32011", "-32012", "-32013", "-32014", "-32016"})
#: an agent's message names it: ``[agent-2] hello``
SPEAKER = re.compile(r"\[(agent-\d+)\] ")


@dataclass
class Tally:
    rounds: int = 0
    #: rounds whose two fresh prompts (one through each replica) two agents answered
    split_rounds: int = 0
    #: the split rounds of each session
    splits: Counter[str] = field(default_factory=Counter)
    first_split: int | None = None
    #: rounds that ended (after the heal and the settle) with a session active on two agents
    ended_split: int = 0
    most: int = 0
    #: requests that got no answer while their connection stayed open, by method
    unanswered: Counter[str] = field(default_factory=Counter)
    faults: Counter[str] = field(default_factory=Counter)
    outcomes: Counter[str] = field(default_factory=Counter)
    turns: Counter[str] = field(default_factory=Counter)
    #: at the end: sessions with agent messages in two stores or more
    in_two_stores: int = 0

    def broken(self) -> list[str]:
        """The soak's bounds this run broke, in words."""
        allowed = max(1, self.rounds * SPLITS_PER_THOUSAND // 1000)
        said = []
        if self.split_rounds > allowed:
            said.append(f"{self.split_rounds} split rounds (at most {allowed})")
        if twice := sorted(s for s, count in self.splits.items() if count > 1):
            said.append(f"sessions split more than once: {twice}")
        if self.unanswered:
            said.append(f"unanswered requests: {dict(self.unanswered)}")
        return said


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.heal", description=__doc__)
    parser.add_argument("--rounds", type=int, default=1000, help="rounds (1000)")
    parser.add_argument("--sessions", type=int, default=12, help="sessions, one holder each (12)")
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
        help="a folder holding another router package to run the replicas and the agents"
        " from (an older commit's, for a before figure)",
    )
    parser.add_argument(
        "--trace", action="store_true", help="a line for each split, and what the agents hold"
    )
    parser.add_argument(
        "--keep-logs",
        type=Path,
        default=None,
        metavar="DIR",
        help="copy every process's log here at the end (with --log-level for how much)",
    )
    parser.add_argument(
        "--log-level", default="WARNING", help="the replicas' and agents' log level (WARNING)"
    )
    parser.add_argument("--seed", type=int, default=1)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    raise_open_files()
    tally = asyncio.run(_heal_soak(args))
    first = "" if tally.first_split is None else f", the first in round {tally.first_split}"
    print(
        f"heal: {tally.rounds} rounds, {len(tally.splits)} sessions"
        f" split; {tally.split_rounds} split rounds{first};"
        f" sessions split more than once: {sum(1 for c in tally.splits.values() if c > 1)}"
        f" (most: {max(tally.splits.values(), default=0)});"
        f" sessions with turns in two stores: {tally.in_two_stores} of {args.sessions};"
        f" unanswered requests: {sum(tally.unanswered.values())};"
        f" rounds ending with a session active on two agents: {tally.ended_split}"
        f" (most at once: {tally.most});"
        f" faults: {dict(sorted(tally.faults.items()))};"
        f" fresh prompts: {dict(sorted(tally.outcomes.items()))};"
        f" holder turns: {dict(sorted(tally.turns.items()))}"
    )
    broken = tally.broken()
    for words in broken:
        print(f"heal: bound broken: {words}")
    return 1 if broken else 0


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

    def store(self, agent: str) -> Path:
        return self.fleet.folder / f"store-{agent}"

    async def weather(self, rng: random.Random, tally: Tally) -> float:
        """Break things at random; how long the round lasts before the heal."""
        before = tally.faults.copy()
        window = await self._weather(rng, tally)
        if self.args.trace:
            said = ", ".join(sorted((tally.faults - before).keys())) or "calm"
            print(
                f"  round {tally.rounds + 1}: {said} ({window:.1f} s), refused {sorted(self.refused)}, killed {sorted(self.killed)}, stopped {sorted(self.stopped)}",
                flush=True,
            )
        return window

    async def _weather(self, rng: random.Random, tally: Tally) -> float:
        grace = GRACE_MS / 1000
        window = 0.3
        if rng.random() < 0.6:
            agent = rng.choice(list(self.relays))
            longer = rng.random() < 0.5
            if longer:
                seconds = rng.uniform(grace * 1.2, LONGEST_REFUSAL_SECONDS)
            else:
                seconds = grace * rng.uniform(0.2, 0.8)
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

    async def active_twice(self, sessions: list[str]) -> dict[str, list[str]]:
        """The sessions the agents, asked directly, hold active on two or more: the copies
        of each (``agent-1@epoch``)."""
        active: dict[str, list[str]] = {}
        for agent, url in self.agent_urls.items():
            async with AcpSocket.connect(self.fleet.http, url) as socket:
                for session_id in sessions:
                    answer = await socket.call("session/status", {"sessionId": session_id})
                    if answer.get("status") == "active":
                        epoch = answer.get("_meta", {}).get("acp-router/epoch")
                        active.setdefault(session_id, []).append(f"{agent}@{epoch}")
        return {s: copies for s, copies in active.items() if len(copies) > 1}

    def stores_with_turns(self, session_id: str) -> int:
        """In how many stores ``session_id`` has an agent's message."""
        return sum(
            1
            for agent in self.agents
            if '"kind":"agent"' in _text(self.store(agent) / f"{session_id}.jsonl")
        )


def _text(path: Path) -> str:
    try:
        return path.read_text().replace(" ", "")
    except FileNotFoundError:
        return ""


async def _heal_soak(args: argparse.Namespace) -> Tally:
    rng = random.Random(args.seed)
    tally = Tally()
    fleet_started = start_fleet(0, log_level=args.log_level)
    async with fleet_started as fleet, _world(fleet, args) as world:
        sessions = await _sessions(world, args.sessions)
        async with _holders(fleet.http, world, sessions, tally):
            for n in range(1, args.rounds + 1):
                split = await _round(world, sessions, rng, tally)
                if split and tally.first_split is None:
                    tally.first_split = n
                if n % 50 == 0:
                    print(
                        f"  {n} rounds: {tally.split_rounds} split,"
                        f" {sum(tally.unanswered.values())} unanswered",
                        flush=True,
                    )
        tally.in_two_stores = sum(world.stores_with_turns(s) > 1 for s in sessions)
        if args.keep_logs is not None:
            _keep_logs(fleet.folder, args.keep_logs)
    return tally


def _keep_logs(folder: Path, into: Path) -> None:
    """Copy the processes' logs (stderr) out of the run's folder before it goes."""
    into.mkdir(parents=True, exist_ok=True)
    for log in folder.glob("*.log"):
        shutil.copy(log, into / log.name)


@contextlib.asynccontextmanager
async def _world(fleet: Fleet, args: argparse.Namespace) -> AsyncIterator[World]:
    names = [f"agent-{n}" for n in (1, 2, 3)]
    ports = {name: free_port() for name in names}
    agents = {name: Slot(_agent_starter(fleet, name, ports[name], args)) for name in names}
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
    fleet: Fleet, name: str, port: int, args: argparse.Namespace
) -> Callable[[], contextlib.AbstractAsyncContextManager[Child]]:
    store = fleet.folder / f"store-{name}"
    store.mkdir()
    return lambda: fleet.agent(name, store, port, source=args.router_source)


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
    stores = [world.store(name) for name in world.agents]
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
                attached = await _answered(
                    socket, "session/resume", resume_params(session_id), tally
                )
                while attached == "ok":
                    outcome = await _answered(
                        socket, "session/prompt", prompt_params(session_id, "/slow 0.5"), tally
                    )
                    tally.turns[outcome] += 1
                    attached = outcome
                    await asyncio.sleep(HOLDER_PAUSE_SECONDS)  # the user reads, then types
        await asyncio.sleep(0.05)  # a pause before attaching again: nothing to wait on


async def _answered(socket: AcpSocket, method: str, params: JsonObject, tally: Tally) -> str:
    """``socket.outcome``'s code; a request left unanswered is counted, and ends the link."""
    try:
        outcome, _ = await socket.outcome(method, params)
    except TimeoutError:
        tally.unanswered[method] += 1
        raise BenchError(f"{method}: no answer") from None
    return outcome


async def _round(world: World, sessions: list[str], rng: random.Random, tally: Tally) -> bool:
    """One round; whether two agents answered its two fresh prompts."""
    window = await world.weather(rng, tally)
    at = rng.uniform(0.0, window)
    await asyncio.sleep(at)  # the weather's schedule: time is the point here
    session_id = rng.choice(sessions)
    visits = await asyncio.gather(
        *(_visit(world.fleet.http, url, session_id, tally) for url in world.replica_urls)
    )
    tally.outcomes.update(outcome for outcome, _ in visits)
    speakers = {speaker for _, speaker in visits if speaker is not None}
    split = len(speakers) > 1
    if split:
        tally.split_rounds += 1
        tally.splits[session_id] += 1
    await asyncio.sleep(max(window - at, 0.0))
    await world.heal()
    last = await _settled(world, sessions, world.args.settle)
    tally.rounds += 1
    tally.most = max(tally.most, len(last))
    tally.ended_split += bool(last)
    if world.args.trace and (split or last):
        said = f"split: {session_id} answered by {sorted(speakers)}; " if split else ""
        print(f"  round {tally.rounds}: {said}active on two agents: {last}", flush=True)
    return split


async def _settled(world: World, sessions: list[str], settle: float) -> dict[str, list[str]]:
    """The sessions active on two agents once none is, or ``settle`` seconds on."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + settle
    while True:
        split = await world.active_twice(sessions)
        if not split or loop.time() >= deadline:
            return split
        await asyncio.sleep(RECOUNT_SECONDS)


async def _visit(
    http: aiohttp.ClientSession, url: str, session_id: str, tally: Tally
) -> tuple[str, str | None]:
    """A fresh connection resumes ``session_id`` and prompts it, as an editor does
    (retrying what is retryable, such as the holder's turn running, for a few seconds):
    the outcome (``ok``, the error code, or ``down``) and the agent that answered."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + VISIT_SECONDS
    try:
        async with AcpSocket.connect(http, url) as socket:
            while True:
                outcome = await _answered(
                    socket, "session/resume", resume_params(session_id), tally
                )
                if outcome == "ok":
                    outcome, speaker = await _speaker(socket, session_id, tally)
                    if outcome == "ok":
                        return outcome, speaker
                if outcome not in RETRYABLE or loop.time() >= deadline:
                    return outcome, None
                await asyncio.sleep(RETRY_SECONDS)  # an editor's pause before it retries
    except (BenchError, aiohttp.ClientError, OSError):
        return "down", None


async def _speaker(socket: AcpSocket, session_id: str, tally: Tally) -> tuple[str, str | None]:
    """Prompt ``session_id``: the outcome, and which agent's message came with it."""
    request_id = await socket.send("session/prompt", prompt_params(session_id, "hello"))
    speaker = None
    while True:
        try:
            message = await socket.receive()
        except TimeoutError:
            tally.unanswered["session/prompt"] += 1
            return "unanswered", None
        if message.get("method") == "session/update":
            text = message["params"]["update"].get("content", {}).get("text", "")
            if (found := SPEAKER.match(text)) is not None:
                speaker = found.group(1)
        elif message.get("id") == request_id:
            error = message.get("error")
            return ("ok", speaker) if error is None else (str(error.get("code")), None)


if __name__ == "__main__":
    sys.exit(main())
