"""Test fixtures for the router: the router itself on a real loopback port, fleets of
real reference-agent processes, and a scripted ACP backend for behaviours a
well-behaved agent never shows (silence, split brain).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import websockets
from aiohttp import web

from router.core.health import Health
from router.protocol.ids import BackendId, SessionId
from router.server.config import Settings, settings_from
from router.server.door.accepting import listen
from router.server.door.app_keys import CLIENTS, GUARD, POOL, UPSTREAM
from router.server.links.tls import server_context
from router.server.observability.metrics import Metrics
from router.server.observability.tracing import Tracer
from router.server.pool.backends import Pool
from router.server.pool.upstream import Upstream
from router.server.process.app import create_app
from router.server.process.serving import app_runner
from tests.support import WAIT, AgentProcess, start_agent


def pulsing(method: Callable[..., Any], event: asyncio.Event) -> Callable[..., Any]:
    """``method``, which pulses ``event`` each time it has returned."""

    def pulsed(*args: Any, **kwargs: Any) -> Any:
        try:
            return method(*args, **kwargs)
        finally:
            event.set()
            event.clear()

    return pulsed


def pulsing_async(
    method: Callable[..., Awaitable[Any]], event: asyncio.Event
) -> Callable[..., Awaitable[Any]]:
    """``method``, a coroutine function, which pulses ``event`` each time it has returned."""

    async def pulsed(*args: Any, **kwargs: Any) -> Any:
        try:
            return await method(*args, **kwargs)
        finally:
            event.set()
            event.clear()

    return pulsed


@dataclass
class RouterUnderTest:
    url: str
    app: web.Application
    metrics: Metrics
    #: pulsed after the router records sessions attached or detached, or a client link
    #: opened or ended (the test's own watch on ``Pool.record`` and ``Pool.pin``: the
    #: router keeps no event for tests)
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        pool = self.pool
        for name in ("record", "pin"):
            setattr(pool, name, pulsing(getattr(pool, name), self.changed))

    @property
    def pool(self) -> Pool:
        return self.app[POOL]

    @property
    def upstream(self) -> Upstream:
        return self.app[UPSTREAM]

    @property
    def base(self) -> str:
        return self.url.removesuffix("/acp").replace("ws", "http", 1)

    def metric(self, name: str, **labels: str) -> float:
        return self.metrics.registry.get_sample_value(name, labels) or 0.0

    def first_ranked(self, session_id: str) -> str:
        """The backend first in the session's rendezvous order among those up."""
        return self.pool.fleet.order(SessionId(session_id), self.pool.now())[0]

    def probes(self, backends: Iterable[str] | None = None) -> float:
        """How many probes the router sent, to ``backends`` (by default to every backend
        it links to), whatever they answered."""
        return sum(
            self.metric("acp_router_probes_total", backend=backend, result=result)
            for backend in (self.pool.links if backends is None else backends)
            for result in ("active", "inactive", "not_found", "unknown")
        )

    async def wait_detached(self) -> None:
        """Wait until no session is attached on any connection (the clients have left)."""
        async with asyncio.timeout(WAIT):
            while sum(self.pool.directory.attached.values()):
                await self.changed.wait()

    async def wait_clients(self, count: int) -> None:
        """Wait until exactly ``count`` client connections are open (a connection that
        has gone is counted out once it has ended in full)."""
        clients = self.app[CLIENTS]
        async with asyncio.timeout(WAIT):
            while len(clients) != count:
                await clients.changed.wait()

    async def wait_pinned(self, pinned: dict[str, int]) -> None:
        """Wait until exactly the client connections in ``pinned`` hold links to each
        backend (``Pool.pinned``)."""
        async with asyncio.timeout(WAIT):
            while self.pool.directory.pinned != pinned:
                await self.changed.wait()

    async def wait_health(self, backend: str, health: Health) -> None:
        """Wait until ``backend`` is in ``health`` (the pool re-reads it on every event)."""
        async with asyncio.timeout(WAIT):
            while self.pool.health(BackendId(backend)) is not health:
                await self.pool.ready_changed.wait()

    async def wait_backends(self, count: int) -> None:
        """Wait until exactly ``count`` backends are up."""
        async with asyncio.timeout(WAIT):
            while len(self.pool.ready()) != count:
                await self.pool.ready_changed.wait()


Backends = Sequence[tuple[str, str] | dict[str, Any]]


def router_settings(backends: Backends, **sections: dict[str, Any]) -> Settings:
    """Test settings; a backend is ``(id, url)`` or a whole ``[[backends]]`` table."""
    data: dict[str, Any] = {
        "router": {"listen": "127.0.0.1:0"},
        "backends": [b if isinstance(b, dict) else {"id": b[0], "url": b[1]} for b in backends],
        "control": {"reconnect_initial_ms": 20, "reconnect_max_ms": 200},
    }
    for name, values in sections.items():
        data[name] = {**data.get(name, {}), **values}
    return settings_from(data, source="test")


@contextlib.asynccontextmanager
async def start_router(
    backends: Backends,
    *,
    wait_for: int | None = None,
    clock: Callable[[], float] = time.monotonic,
    tracer: Tracer | None = None,
    **sections: dict[str, Any],
) -> AsyncIterator[RouterUnderTest]:
    """Run the router in this process on 127.0.0.1:0, waiting until its backends are up
    (``wss://`` when ``router`` names a certificate); ``tracer`` makes its spans."""
    metrics = Metrics()
    settings = router_settings(backends, **sections)
    app = create_app(settings, metrics, clock=clock, tracer=tracer)
    runner = app_runner(app)
    await runner.setup()
    try:
        tls = server_context(settings.router)
        site = await listen(runner, app[GUARD], "127.0.0.1", 0, tls)
        server = site._server
        assert isinstance(server, asyncio.Server)
        port = server.sockets[0].getsockname()[1]
        scheme = "ws" if tls is None else "wss"
        router = RouterUnderTest(f"{scheme}://127.0.0.1:{port}/acp", app, metrics)
        await router.wait_backends(len(backends) if wait_for is None else wait_for)
        yield router
    finally:
        await runner.cleanup()


@contextlib.asynccontextmanager
async def start_fleet(store: Path, count: int, *extra: str) -> AsyncIterator[list[AgentProcess]]:
    """``count`` reference agents (agent-1 ...) sharing ``store``."""
    async with contextlib.AsyncExitStack() as stack:
        agents = await asyncio.gather(
            *(
                stack.enter_async_context(start_agent(store, f"agent-{n}", *extra))
                for n in range(1, count + 1)
            )
        )
        yield list(agents)


def backends_of(agents: Sequence[AgentProcess]) -> list[tuple[str, str]]:
    return [(agent.agent_id, agent.url) for agent in agents]


# -- a scripted backend ---------------------------------------------------------------------------

StatusAnswer = Callable[[str], Awaitable[dict[str, Any] | None]]


async def never_answer(session_id: str) -> dict[str, Any] | None:
    await asyncio.Event().wait()  # silent: the router's probe must time out
    return None


async def active(session_id: str) -> dict[str, Any] | None:
    """Every session is active here."""
    return {"status": "active"}


async def inactive(session_id: str) -> dict[str, Any] | None:
    """Every session is stored here, none active."""
    return {"status": "inactive"}


#: in :attr:`ScriptedBackend.scripted`: close the connection there
CLOSE = "$CLOSE"


def error_reply(code: int, message: str) -> str:
    """A scripted error answer (``$ID`` is filled in when it is sent)."""
    error = json.dumps({"code": code, "message": message})
    return f'{{"jsonrpc":"2.0","id":$ID,"error":{error}}}'


@dataclass
class ScriptedBackend:
    """A WebSocket ACP backend whose ``session/status`` answers come from ``status``.

    It advertises the status capability, answers ``initialize`` and
    ``session/resume`` (``{}``), and records every request it gets.
    """

    backend_id: str
    status: StatusAnswer
    advertise_status: bool = True
    url: str = ""
    #: it advertises ``session/list`` (the router lists it)
    advertise_list: bool = True
    received: list[dict[str, Any]] = field(default_factory=list)
    #: every frame exactly as it arrived
    frames: list[str] = field(default_factory=list)
    #: frames sent, as they are, before the answer to a session/resume
    before_resume: list[str] = field(default_factory=list)
    #: per method, the frames sent instead of the usual answer: as they are, except
    #: that ``$ID`` becomes the request's id, and :data:`CLOSE` closes the connection
    scripted: dict[str, list[str]] = field(default_factory=dict)
    #: pulsed on every frame that arrives
    arrived: asyncio.Event = field(default_factory=asyncio.Event)
    #: per method, an event its answers wait for (a slow answer, released by the test)
    held: dict[str, asyncio.Event] = field(default_factory=dict)
    #: answer each connection's frames one at a time, in order (a backend that reads its
    #: next frame only once it has answered the last): a held answer holds the rest
    serial: bool = False

    async def until(self, condition: Callable[[], bool]) -> None:
        """Wait until ``condition`` holds, checked as each frame arrives."""
        while not condition():
            self.arrived.clear()
            await self.arrived.wait()

    #: how long it takes to answer a router's control link's ``initialize`` (a backend
    #: slow to come up for a router that starts); client links are answered at once
    control_initialize_seconds: float = 0.0

    async def _serve(self, ws: websockets.ServerConnection) -> None:
        answers: set[asyncio.Task[None]] = set()
        try:
            async for frame in ws:
                assert isinstance(frame, str)
                self.frames.append(frame)
                message = json.loads(frame)
                self.received.append(message)
                self.arrived.set()
                if self.serial:
                    await self._answer(ws, message)
                    continue
                answer = asyncio.create_task(self._answer(ws, message))
                answers.add(answer)
                answer.add_done_callback(answers.discard)
        finally:  # a silent backend never finishes answering: stop when the client goes
            for answer in answers:
                answer.cancel()
            await asyncio.gather(*answers, return_exceptions=True)

    async def _answer(self, ws: websockets.ServerConnection, message: dict[str, Any]) -> None:
        method, params = message.get("method"), message.get("params") or {}
        held = self.held.get(method) if isinstance(method, str) else None
        if held is not None:
            await held.wait()
        if method in self.scripted:
            for text in self.scripted[method]:
                with contextlib.suppress(websockets.ConnectionClosed):
                    if text == CLOSE:
                        await ws.close()
                    else:
                        await ws.send(text.replace("$ID", json.dumps(message.get("id"))))
            return
        if method == "initialize":
            client = params.get("clientInfo") or {}
            if client.get("title") == "acp-router control link":
                await asyncio.sleep(self.control_initialize_seconds)
            session_caps: dict[str, Any] = {"resume": {}}
            if self.advertise_list:
                session_caps["list"] = {}
            if self.advertise_status:
                session_caps["status"] = {}
            result: dict[str, Any] | None = {
                "protocolVersion": 1,
                "agentCapabilities": {"loadSession": True, "sessionCapabilities": session_caps},
            }
        elif method == "session/status":
            result = await self.status(params["sessionId"])
        elif method == "session/list":
            result = {"sessions": []}
        elif method == "session/resume":
            for text in self.before_resume:
                await ws.send(text)
            result = {}
        else:
            result = {}
        if result is not None and "id" in message:
            reply = {"jsonrpc": "2.0", "id": message["id"], "result": result}
            with contextlib.suppress(websockets.ConnectionClosed):
                await ws.send(json.dumps(reply))


@contextlib.asynccontextmanager
async def start_scripted(
    backend_id: str,
    status: StatusAnswer,
    *,
    advertise_status: bool = True,
    tls: ssl.SSLContext | None = None,
) -> AsyncIterator[ScriptedBackend]:
    """A :class:`ScriptedBackend` on a free loopback port (``wss://`` with ``tls``)."""
    backend = ScriptedBackend(backend_id, status, advertise_status)
    async with websockets.serve(backend._serve, "127.0.0.1", 0, ssl=tls) as server:
        port = next(iter(server.sockets)).getsockname()[1]
        backend.url = f"{'ws' if tls is None else 'wss'}://127.0.0.1:{port}/acp"
        yield backend
