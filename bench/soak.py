"""``python -m bench.soak``: does a session ever run on two agents? (not part of CI)

Two router replicas in front of three reference agents sharing one store. Agent-1 sits
behind a TCP relay that flaps the way an L4 proxy in front of a live agent does: it
refuses new connections for a while (up to ``--refuse-ms``, shorter than the routers'
``control.down_grace_ms``: the assumption the grace stands for), cutting the replicas'
control links (its two oldest connections) or, now and then, every connection it has,
then listens again.

Each session has a *holder*: a client on one replica that keeps the session attached
and runs one turn after another. Meanwhile, each round, one fresh client on each
replica resumes the same session at the same moment. The reference agent fences its
sessions: when another instance resumes a session, the instance that had it drops its
copy, and its holder's next turn fails (``-32010`` "moved to another instance" during
a turn; ``-32602`` "not loaded on this connection" when the session came back to that
instance meanwhile). Either is the session having run on two agents while its holder
held it (another agent would have run it twice, unseen). A holder whose link is cut
gets ``-32013`` instead (or the router's own ``-32010``, "not attached", between
turns), and resumes again wherever the session is. It prints one line per 100 rounds and a
summary; it exits 1 if any session ran on two agents.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import sys
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field

import aiohttp

from bench.fleet import Child, Fleet, start_fleet
from bench.observe import raise_open_files
from bench.wire import AcpSocket, BenchError, prompt_params, resume_params
from router.tasks import cancel_all_and_wait
from tests.relay import Relay, start_relay

GRACE_MS = 2000
#: what the reference agent says to a holder whose session another instance took
MOVED = ("moved to another instance", "not loaded on this connection")


@dataclass
class Tally:
    rounds: int = 0
    #: holder turns ended because another agent took the session
    splits: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)
    turns: Counter[str] = field(default_factory=Counter)
    flaps: int = 0
    cuts: int = 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__)
    parser.add_argument("--rounds", type=int, default=1000, help="rounds of resumes (1000)")
    parser.add_argument("--sessions", type=int, default=6, help="sessions, one holder each (6)")
    parser.add_argument(
        "--refuse-ms", type=int, default=GRACE_MS // 2, help="longest refusal (grace / 2)"
    )
    parser.add_argument("--seed", type=int, default=1)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    raise_open_files()
    tally = asyncio.run(_soak(args))
    print(
        f"soak: {tally.rounds} rounds, {tally.splits} holder turns ended by a second agent"
        " (the session ran on two agents);"
        f" {tally.flaps} refusals ({tally.cuts} cutting every link);"
        f" fresh resumes: {dict(sorted(tally.outcomes.items()))};"
        f" holder turns: {dict(sorted(tally.turns.items()))}"
    )
    return 1 if tally.splits else 0


async def _soak(args: argparse.Namespace) -> Tally:
    rng = random.Random(args.seed)
    tally = Tally()
    async with start_fleet(3) as fleet, start_relay(fleet.agents[0].url) as relay:
        backends = [("agent-1", relay.url), *(a.backend for a in fleet.agents[1:])]
        async with _replicas(fleet, backends) as replicas:
            sessions = await _sessions(fleet, replicas[0], args.sessions)
            async with _weather(fleet.http, relay, replicas, sessions, rng, args, tally):
                for n in range(args.rounds):
                    await _round(fleet.http, replicas, rng.choice(sessions), tally)
                    # clients arrive over time, across the weather: time is the point
                    await asyncio.sleep(rng.uniform(0.0, 0.1))
                    if (n + 1) % 100 == 0:
                        print(f"  {n + 1} rounds, {tally.splits} split", flush=True)
    return tally


@contextlib.asynccontextmanager
async def _replicas(
    fleet: Fleet, backends: list[tuple[str, str]]
) -> AsyncIterator[tuple[Child, Child]]:
    control = {"down_grace_ms": GRACE_MS, "reconnect_initial_ms": 20, "reconnect_max_ms": 200}
    probe = {"timeout_ms": 300}
    async with (
        fleet.router("replica-a", backends, control=control, probe=probe) as a,
        fleet.router("replica-b", backends, control=control, probe=probe) as b,
    ):
        yield a, b


async def _sessions(fleet: Fleet, router: Child, count: int) -> list[str]:
    async with AcpSocket.connect(fleet.http, router.url) as socket:
        return [await socket.new_session() for _ in range(count)]


@contextlib.asynccontextmanager
async def _weather(
    http: aiohttp.ClientSession,
    relay: Relay,
    replicas: tuple[Child, Child],
    sessions: list[str],
    rng: random.Random,
    args: argparse.Namespace,
    tally: Tally,
) -> AsyncIterator[None]:
    """The flapping relay, and one holder per session, for the duration of the block."""
    tasks = [asyncio.create_task(_flap(relay, rng, args.refuse_ms / 1000, tally))]
    tasks += [
        asyncio.create_task(_hold(http, replicas[n % 2], session_id, tally))
        for n, session_id in enumerate(sessions)
    ]
    try:
        yield
    finally:
        await cancel_all_and_wait(*tasks)


async def _flap(relay: Relay, rng: random.Random, longest: float, tally: Tally) -> None:
    """Refuse new connections now and then, cutting the replicas' control links (the two
    oldest connections), or sometimes every connection, and listen again."""
    while True:
        await asyncio.sleep(rng.uniform(0.05, 0.3))  # the weather: time is the point here
        relay.stop_listening()
        tally.flaps += 1
        if rng.random() < 0.15:
            await relay.cut()
            tally.cuts += 1
        else:
            relay.cut_oldest(2)
        await asyncio.sleep(rng.uniform(0.02, longest))
        await relay.listen()


async def _hold(http: aiohttp.ClientSession, router: Child, session_id: str, tally: Tally) -> None:
    """Keep ``session_id`` attached through ``router`` and run turns, forever; a turn
    ended by :data:`MOVED` is a split."""
    while True:
        with contextlib.suppress(BenchError, aiohttp.ClientError, OSError):
            async with AcpSocket.connect(http, router.url) as socket:
                attached = await _request(socket, "session/resume", resume_params(session_id))
                while attached == "ok":
                    params = prompt_params(session_id, "/slow 1")
                    outcome, message = await socket.outcome("session/prompt", params)
                    tally.turns[outcome] += 1
                    if any(words in message for words in MOVED):
                        tally.splits += 1
                        print(f"  split: {session_id} under its holder: {message}", flush=True)
                    attached = outcome
        await asyncio.sleep(0.05)  # a pause before attaching again: nothing to wait on


async def _round(
    http: aiohttp.ClientSession, replicas: tuple[Child, Child], session_id: str, tally: Tally
) -> None:
    outcomes = await asyncio.gather(*(_resume(http, r, session_id) for r in replicas))
    tally.rounds += 1
    tally.outcomes.update(outcomes)


async def _resume(http: aiohttp.ClientSession, router: Child, session_id: str) -> str:
    """One resume from a fresh connection: ``ok`` or the error code."""
    async with AcpSocket.connect(http, router.url) as socket:
        return await _request(socket, "session/resume", resume_params(session_id))


async def _request(socket: AcpSocket, method: str, params: dict[str, object]) -> str:
    """One request's outcome: ``ok`` or the error code."""
    outcome, _ = await socket.outcome(method, params)
    return outcome


if __name__ == "__main__":
    sys.exit(main())
