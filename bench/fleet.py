"""Processes for the benchmarks, each its own subprocess: reference agents, many
scripted backends in one process, the bare forwarder, HAProxy, and routers.

Everything is on loopback, port 0 where the program allows it. A child is ready
once it prints its one announcement line (a router, once ``/readyz`` also counts all
its backends up; HAProxy, once its port accepts); its stderr goes to a log file in
the run's temporary folder, quoted when it fails to start. On exit every child gets
SIGTERM, then SIGKILL if it lingers. Agents and routers log at WARNING, so what is
measured is the data path, not log lines.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import socket
import sys
import tempfile
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from bench import passthrough, scripted
from bench.wire import WAIT, BenchError
from router.native import PURE_ENV

#: what a router config's [[backends]] gets: (id, url)
Backend = tuple[str, str]
RouterOption = bool | int | float | str


@dataclass(frozen=True, slots=True)
class Child:
    name: str
    url: str
    process: asyncio.subprocess.Process

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def backend(self) -> Backend:
        return (self.name, self.url)


@dataclass(frozen=True, slots=True)
class Scripted:
    """``len(urls)`` scripted backends served by one process (see :mod:`bench.scripted`)."""

    process: Child
    urls: list[str]

    def backends(self, count: int) -> list[Backend]:
        return [(scripted.backend_id(i), url) for i, url in enumerate(self.urls[:count])]


@dataclass(frozen=True, slots=True)
class Fleet:
    """A run's folder and HTTP client, and the means to start processes in it."""

    folder: Path
    #: no connection limit: the memory and storm benches hold thousands of WebSockets
    http: aiohttp.ClientSession
    agents: list[Child]
    #: when set, routers run under pyinstrument and save their profile here on exit
    profile: Path | None = None
    #: the routers' and agents' ``--log-level`` (their logs are in the run's folder)
    log_level: str = "WARNING"
    #: what routers and the forwarder run under (``valgrind ...``: :mod:`bench.instructions`)
    under: tuple[str, ...] = ()

    def router(
        self,
        name: str,
        backends: Sequence[Backend],
        *,
        event_loop: str | None = None,
        source: Path | None = None,
        **sections: Mapping[str, RouterOption],
    ) -> contextlib.AbstractAsyncContextManager[Child]:
        """A router in front of ``backends``; ``sections`` add keys to its config's sections
        (``router={"compression": False}``); ``event_loop`` sets ``router.event_loop``
        (None: the router's default, as users get it: uvloop where it installs);
        ``source``: a folder holding another ``router`` package to run instead of this
        one (``--before``: the same bench against an older commit, in the same run)."""
        return _router(self, name, backends, sections, event_loop, source)

    def agent(
        self, name: str, store: Path, port: int = 0, *, source: Path | None = None
    ) -> contextlib.AbstractAsyncContextManager[Child]:
        """A reference agent on loopback ``port`` (0: a free one) with its own ``store``:
        started again on the same port and store, it is the same agent restarted;
        ``source``: a folder holding another ``router`` package to run it from."""
        return _agent(self.folder, store, name, port, source, self.log_level)

    def scripted(self, count: int) -> contextlib.AbstractAsyncContextManager[Scripted]:
        return _scripted(self, count)

    def passthrough(self, target: str) -> contextlib.AbstractAsyncContextManager[Child]:
        args = ["-m", "bench.passthrough", target]
        return _child(self.folder, "passthrough", args, passthrough.READY, under=self.under)

    def haproxy(self, target: str) -> contextlib.AbstractAsyncContextManager[Child]:
        return _haproxy(self, target)


@contextlib.asynccontextmanager
async def start_fleet(
    agents: int,
    profile: Path | None = None,
    *,
    log_level: str = "WARNING",
    under: tuple[str, ...] = (),
) -> AsyncIterator[Fleet]:
    with tempfile.TemporaryDirectory(prefix="acp-bench-") as folder:
        root = Path(folder)
        store = root / "store"
        store.mkdir()
        async with contextlib.AsyncExitStack() as stack:
            connector = aiohttp.TCPConnector(limit=0)
            http = await stack.enter_async_context(aiohttp.ClientSession(connector=connector))
            started = await asyncio.gather(
                *(
                    stack.enter_async_context(
                        _agent(root, store, f"agent-{n}", log_level=log_level)
                    )
                    for n in range(1, agents + 1)
                )
            )
            yield Fleet(root, http, list(started), profile, log_level, under)


def _agent(
    root: Path,
    store: Path,
    name: str,
    port: int = 0,
    source: Path | None = None,
    log_level: str = "WARNING",
) -> contextlib.AbstractAsyncContextManager[Child]:
    args = ["agent", "--listen", f"127.0.0.1:{port}", "--store", str(store), "--id", name]
    ready = f"agent {name} listening on "
    return _child(root, name, _router_args(args, log_level), ready, source)


def _router_args(args: list[str], log_level: str = "WARNING") -> list[str]:
    return ["-m", "router", "--log-level", log_level, *args]


@contextlib.asynccontextmanager
async def _router(
    fleet: Fleet,
    name: str,
    backends: Sequence[Backend],
    sections: Mapping[str, Mapping[str, RouterOption]],
    event_loop: str | None,
    source: Path | None,
) -> AsyncIterator[Child]:
    config = fleet.folder / f"{name}.toml"
    if event_loop is not None:
        keys = {**sections.get("router", {}), "event_loop": event_loop}
        sections = {**sections, "router": keys}
    config.write_text(_config(backends, sections))
    args = _router_args(["serve", "--config", str(config)], fleet.log_level)
    env = None
    if fleet.profile is not None:
        session = fleet.profile / f"{name}.pyisession"
        args = ["-m", "pyinstrument", "--interval", "0.0005", "-o", str(session), *args]
        env = {PURE_ENV: "1"}  # pyinstrument sees Python frames only: the sources run
    # run from ``source``: ``python -m`` puts the working folder first on sys.path
    ready = "acp-router listening on "
    starting = _child(fleet.folder, name, args, ready, source, fleet.under, env)
    async with starting as router:
        await _wait_ready(fleet.http, router, len(backends))
        yield router


def _config(backends: Sequence[Backend], sections: Mapping[str, Mapping[str, RouterOption]]) -> str:
    tables = {**sections, "router": {"listen": "127.0.0.1:0", **sections.get("router", {})}}
    lines = []
    for section, keys in tables.items():
        lines += [f"[{section}]", *(f"{key} = {_toml(value)}" for key, value in keys.items()), ""]
    for backend_id, url in backends:
        lines += ["[[backends]]", f'id = "{backend_id}"', f'url = "{url}"', ""]
    return "\n".join(lines) + "\n"


def _toml(value: RouterOption) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return f'"{value}"' if isinstance(value, str) else repr(value)


async def _wait_ready(http: aiohttp.ClientSession, router: Child, backends: int) -> None:
    """Poll ``/readyz`` (bounded) until it counts every backend up."""
    url = router.url.removesuffix("/acp").replace("ws://", "http://") + "/readyz"
    expected = f"ready: {backends} backend(s) up"
    async with asyncio.timeout(WAIT * 4):
        while True:
            async with http.get(url) as response:
                if expected in await response.text():
                    return
            await asyncio.sleep(0.05)  # polling an HTTP endpoint: there is no event to wait on


def _scripted(fleet: Fleet, count: int) -> contextlib.AbstractAsyncContextManager[Scripted]:
    return scripted_in(fleet.folder, count)


@contextlib.asynccontextmanager
async def scripted_in(folder: Path, count: int) -> AsyncIterator[Scripted]:
    """``count`` scripted backends in one process, run in ``folder`` (no fleet needed)."""
    urls = folder / f"scripted-{count}.urls"
    args = ["-m", "bench.scripted", "--count", str(count), "--urls", str(urls)]
    async with _child(folder, f"scripted-{count}", args, scripted.READY) as child:
        yield Scripted(child, urls.read_text().split())


def haproxy_missing() -> str | None:
    """Why HAProxy cannot take part in this run, or None when it can."""
    if shutil.which("haproxy") is None:
        return "haproxy is not installed (Debian: apt-get install haproxy; `make bench` tries)"
    return None


def free_port() -> int:
    """A loopback port free now (for a process that takes a port in its config, not port
    0, or must come back on the same one)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


HAPROXY_CONFIG = """\
global
    maxconn 4096
defaults
    mode http
    timeout connect 5s
    timeout client 30s
    timeout server 30s
    timeout tunnel 1h
frontend acp
    bind 127.0.0.1:{port}
    default_backend agent
backend agent
    server agent {target}
"""


@contextlib.asynccontextmanager
async def _haproxy(fleet: Fleet, target: str) -> AsyncIterator[Child]:
    """HAProxy in HTTP mode in front of ``target``: a byte tunnel after the upgrade."""
    port = free_port()
    address = target.removeprefix("ws://").partition("/")[0]
    config = fleet.folder / "haproxy.cfg"
    config.write_text(HAPROXY_CONFIG.format(port=port, target=address))
    log = fleet.folder / "haproxy.log"
    with log.open("wb") as errors:
        process = await asyncio.create_subprocess_exec(
            "haproxy", "-db", "-f", str(config),
            stdin=asyncio.subprocess.DEVNULL, stdout=errors, stderr=errors,
        )  # fmt: skip
    try:
        await _until_accepting(port, process, log)
        yield Child("haproxy", f"ws://127.0.0.1:{port}/acp", process)
    finally:
        await _stop(process)


async def _until_accepting(port: int, process: asyncio.subprocess.Process, log: Path) -> None:
    async with asyncio.timeout(WAIT):
        while True:
            if process.returncode is not None:
                raise BenchError(f"haproxy exited: {_tail(log)}")
            with contextlib.suppress(OSError):
                _, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.close()
                await writer.wait_closed()
                return
            await asyncio.sleep(0.05)  # nothing to wait on but the port


@contextlib.asynccontextmanager
async def _child(
    root: Path,
    name: str,
    args: list[str],
    prefix: str,
    cwd: Path | None = None,
    under: tuple[str, ...] = (),
    env: Mapping[str, str] | None = None,
) -> AsyncIterator[Child]:
    log = root / f"{name}.log"
    with log.open("wb") as errors:
        process = await asyncio.create_subprocess_exec(
            *under,
            sys.executable,
            *args,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=errors,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
            cwd=cwd,
        )
    try:
        line = await _first_line(process)
        if not line.startswith(prefix):
            raise BenchError(f"{name} did not start: {line!r}\n{_tail(log)}")
        drain = asyncio.create_task(_discard(process))
        try:
            yield Child(name, line.removeprefix(prefix), process)
        finally:
            drain.cancel()
            await asyncio.gather(drain, return_exceptions=True)
    finally:
        await _stop(process)


def _tail(log: Path) -> str:
    return log.read_text()[-2000:]


async def _first_line(process: asyncio.subprocess.Process) -> str:
    assert process.stdout is not None
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(WAIT * 2):
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
        async with asyncio.timeout(WAIT * 2):
            await process.wait()
    except TimeoutError:
        process.kill()
        await process.wait()
