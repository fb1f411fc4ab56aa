"""Instructions per round trip: ``python -m bench.instructions [--trips N] [--before DIR]``.

The hop bench's figures are CPU time, which moves by about 5 % from run to run on a
shared machine and more from one machine to another. This one counts what does not
move: the user-space instructions a hop executes per prompt round trip (and per
streamed update), under valgrind's callgrind, with the zero-work scripted backend of
:mod:`bench.hop`. Counting starts after a warm-up and stops after ``--trips`` round
trips (``callgrind_control``), so start-up is not in it; the same build, inputs and
trips give the same count to a fraction of a percent, whatever else the machine does.

Sides: the router as users get it, the bare forwarder (:mod:`bench.passthrough`), and,
with ``--before DIR``, the router package in ``DIR`` (``git archive COMMIT router |
tar -x -C DIR``). What it leaves out is the kernel (the system calls, the wake-ups),
which the CPU-time rows of the hop bench hold; a change that cuts instructions here
cuts the router's CPU there by about as many nanoseconds as this machine runs them in.
Needs valgrind (Debian's ``valgrind``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import sys
import tempfile
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

from bench.fleet import Child, Fleet, start_fleet
from bench.hop import PROMPT, SESSION
from bench.wire import AcpSocket, JsonObject, prompt_params, resume_params

WARM_UP = 300
#: updates a streaming prompt asks for (its round trip is then one prompt, these, one answer)
UPDATES = 100
ROUTER = "router"
FORWARDER = "forwarder"


async def _control(flag: str, pid: int) -> None:
    process = await asyncio.create_subprocess_exec(
        "callgrind_control",
        flag,
        str(pid),
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    await process.wait()


def _counted(folder: Path, pid: int) -> int:
    """The instructions in the dumps callgrind wrote for ``pid`` (then removed)."""
    total = 0
    for dump in folder.glob(f"callgrind.{pid}*"):
        for line in dump.read_text().splitlines():
            if line.startswith(("summary:", "totals:")):
                total = max(total, int(line.split()[1]))
        dump.unlink()
    return total


def _callgrind(folder: Path) -> tuple[str, ...]:
    """valgrind's callgrind, counting nothing until told (:func:`_control`)."""
    dump = f"--callgrind-out-file={folder}/callgrind.%p"
    return ("valgrind", "--tool=callgrind", "--instr-atstart=no", dump)


@contextlib.asynccontextmanager
async def _hop(fleet: Fleet, side: str, url: str, source: Path | None) -> AsyncIterator[Child]:
    pool = [("b0", url)]
    if side == FORWARDER:
        async with fleet.passthrough(url) as hop:
            yield hop
    else:
        async with fleet.router(f"router-{side}", pool, source=source) as hop:
            yield hop


async def _per_trip(
    socket: AcpSocket, pid: int, params: JsonObject, trips: int, folder: Path
) -> float:
    for _ in range(WARM_UP):
        await socket.call("session/prompt", params)
    await _control("--zero", pid)
    await _control("--instr=on", pid)
    for _ in range(trips):
        await socket.call("session/prompt", params)
    await _control("--instr=off", pid)
    await _control("--dump", pid)
    return _counted(folder, pid) / trips


async def measure(side: str, source: Path | None, trips: int) -> tuple[float, float]:
    """Instructions per prompt round trip, and per streamed update, of one hop."""
    folder = Path(tempfile.mkdtemp(prefix="acp-callgrind-"))
    try:
        async with (
            start_fleet(0, under=_callgrind(folder)) as fleet,
            fleet.scripted(1) as scripted,
        ):
            url = scripted.backends(1)[0][1]
            async with (
                _hop(fleet, side, url, source) as hop,
                AcpSocket.connect(fleet.http, hop.url) as socket,
            ):
                await socket.call("session/resume", resume_params(SESSION))
                plain = prompt_params(SESSION, PROMPT)
                trip = await _per_trip(socket, hop.pid, plain, trips, folder)
                streaming = {**plain, "_meta": {"updates": UPDATES}}
                stream = await _per_trip(socket, hop.pid, streaming, trips // 10, folder)
        return trip, stream / (UPDATES + 2)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


async def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.instructions", description=__doc__)
    parser.add_argument("--trips", type=int, default=2000, help="round trips counted")
    parser.add_argument("--before", type=Path, action="append", default=[],
                        help="also count the router package in DIR; repeatable")  # fmt: skip
    args = parser.parse_args(argv)
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        print("bench.instructions: valgrind is not installed (apt-get install valgrind)")
        return 2
    sides: list[tuple[str, Path | None]] = [(ROUTER, None), (FORWARDER, None)]
    sides += [(f"router at {source.name}", source) for source in args.before]
    counts = {name: await measure(name, source, args.trips) for name, source in sides}
    base_trip, base_frame = counts[FORWARDER]
    print(
        f"user-space instructions (callgrind), Python {sys.version.split()[0]}, {os.uname().machine}"
    )
    print(
        f"{'hop':<28} {'per round trip':>16} {'x forwarder':>12} {'per update':>12} {'x forwarder':>12}"
    )
    for name, (trip, frame) in counts.items():
        print(
            f"{name:<28} {trip:>16,.0f} {trip / base_trip:>11.2f}x {frame:>12,.0f} {frame / base_frame:>11.2f}x"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main(sys.argv[1:])))
