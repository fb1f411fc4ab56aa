"""Processes for the benchmarks: reference agents and routers, each its own subprocess.

Everything is on loopback, port 0. A child is ready once it prints its one
announcement line (a router, once ``/readyz`` also counts all its backends up);
its stderr goes to a log file in the run's temporary folder, quoted when it fails
to start. On exit every child gets SIGTERM, then SIGKILL if it lingers. Agents and
routers log at WARNING, so what is measured is the data path, not log lines.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import tempfile
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from bench.wire import WAIT, BenchError


@dataclass(frozen=True, slots=True)
class Child:
    name: str
    url: str
    process: asyncio.subprocess.Process


@dataclass(frozen=True, slots=True)
class Fleet:
    """Agents sharing one session store, and the means to put routers in front of them."""

    folder: Path
    http: aiohttp.ClientSession
    agents: list[Child]

    def router(
        self, name: str, backends: Sequence[Child]
    ) -> contextlib.AbstractAsyncContextManager[Child]:
        return _router(self, name, backends)


@contextlib.asynccontextmanager
async def start_fleet(agents: int) -> AsyncIterator[Fleet]:
    with tempfile.TemporaryDirectory(prefix="acp-bench-") as folder:
        root = Path(folder)
        store = root / "store"
        store.mkdir()
        async with contextlib.AsyncExitStack() as stack:
            http = await stack.enter_async_context(aiohttp.ClientSession())
            started = await asyncio.gather(
                *(
                    stack.enter_async_context(_agent(root, store, f"agent-{n}"))
                    for n in range(1, agents + 1)
                )
            )
            yield Fleet(root, http, list(started))


def _agent(root: Path, store: Path, name: str) -> contextlib.AbstractAsyncContextManager[Child]:
    args = ["agent", "--listen", "127.0.0.1:0", "--store", str(store), "--id", name]
    return _child(root, name, args, f"agent {name} listening on ")


@contextlib.asynccontextmanager
async def _router(fleet: Fleet, name: str, backends: Sequence[Child]) -> AsyncIterator[Child]:
    config = fleet.folder / f"{name}.toml"
    config.write_text(_config(backends))
    args = ["serve", "--config", str(config)]
    async with _child(fleet.folder, name, args, "acp-router listening on ") as router:
        await _wait_ready(fleet.http, router, len(backends))
        yield router


def _config(backends: Sequence[Child]) -> str:
    lines = ["[router]", 'listen = "127.0.0.1:0"']
    for backend in backends:
        lines += ["", "[[backends]]", f'id = "{backend.name}"', f'url = "{backend.url}"']
    return "\n".join(lines) + "\n"


async def _wait_ready(http: aiohttp.ClientSession, router: Child, backends: int) -> None:
    """Poll ``/readyz`` (bounded) until it counts every backend up."""
    url = router.url.removesuffix("/acp").replace("ws://", "http://") + "/readyz"
    expected = f"ready: {backends} backend(s) up"
    async with asyncio.timeout(WAIT):
        while True:
            async with http.get(url) as response:
                if expected in await response.text():
                    return
            await asyncio.sleep(0.02)


@contextlib.asynccontextmanager
async def _child(root: Path, name: str, args: list[str], prefix: str) -> AsyncIterator[Child]:
    log = root / f"{name}.log"
    with log.open("wb") as errors:
        process = await asyncio.create_subprocess_exec(
            *[sys.executable, "-m", "router", "--log-level", "WARNING", *args],
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=errors,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    try:
        line = await _first_line(process)
        if not line.startswith(prefix):
            raise BenchError(f"{name} did not start: {line!r}\n{log.read_text()[-2000:]}")
        drain = asyncio.create_task(_discard(process))
        try:
            yield Child(name, line.removeprefix(prefix), process)
        finally:
            drain.cancel()
            await asyncio.gather(drain, return_exceptions=True)
    finally:
        await _stop(process)


async def _first_line(process: asyncio.subprocess.Process) -> str:
    assert process.stdout is not None
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(WAIT):
            return (await process.stdout.readline()).decode().rstrip("\n")
    return ""


async def _discard(process: asyncio.subprocess.Process) -> None:
    """Keep reading stdout so the child never blocks on a full pipe."""
    assert process.stdout is not None
    while await process.stdout.read(65536):
        pass


async def _stop(process: asyncio.subprocess.Process) -> None:
    if process.returncode is None:
        process.terminate()
    try:
        async with asyncio.timeout(WAIT):
            await process.wait()
    except TimeoutError:
        process.kill()
        await process.wait()
