"""``acp-router host``: the I/O shell around :class:`~router.host.multiplex.Multiplexer`.

It runs the agent command once and keeps that one process for every WebSocket
client at ``/acp``, so a session stays in memory when its client disconnects and is
there to resume when it (or another client) comes back. When the agent process
exits, every client is disconnected (close code 1012, "service restart"): its
sessions are gone (``session/status`` now says ``-32002``), requests it never
answered get ``-32013``, and the host starts the command again with exponential
backoff. Routers in front see the backend go down and come back (with a new
``_meta.instanceId``), and place the lost sessions again by their usual rules.

On SIGINT or SIGTERM the host closes its clients (1001) while it stops the agent's
whole process group (:meth:`~router.host.process.AgentProcess.stop`), and exits within
a few seconds whatever the agent is doing.

``/healthz`` answers 200 while the host runs; ``/readyz`` 200 only while the agent
process is up and initialized.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import signal
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from aiohttp import WSCloseCode, WSMsgType, web

from router.host.client_link import CLOSE_SECONDS, TOO_SLOW, ClientLink
from router.host.multiplex import HANDSHAKE_ID, Action, HostLimits, Multiplexer, ToAgent, ToClient
from router.host.owners import ClientId
from router.host.process import KILL_WAIT_SECONDS, AgentProcess
from router.protocol.acp import DEFAULT_STATUS_ALIASES, ProbeResult
from router.protocol.errors import AcpRouterError, InternalError, ProtocolError
from router.protocol.jsonrpc import Response, encode_protocol_error, reader_limit
from router.protocol.reading import parse
from router.tasks import cancel_all_and_wait, cancel_and_wait

logger = logging.getLogger(__name__)

PATH = "/acp"
HEARTBEAT_SECONDS = 20.0
SHUTDOWN_TIMEOUT = 5.0
#: restart backoff after the agent process exits
RESTART_INITIAL_SECONDS = 0.1
RESTART_MAX_SECONDS = 5.0
#: an agent that ran this long before exiting restarts without backoff
STABLE_SECONDS = 10.0


@dataclass(frozen=True, slots=True)
class HostSettings:
    command: tuple[str, ...]
    host_id: str
    client_capabilities: Mapping[str, Any] = field(default_factory=dict)
    startup_timeout: float = 30.0
    max_message_bytes: int = 16 * 1024 * 1024
    limits: HostLimits = field(default_factory=HostLimits)
    aliases: Mapping[str, ProbeResult] = field(default_factory=lambda: DEFAULT_STATUS_ALIASES)


class AgentStartFailed(AcpRouterError):
    """The agent command could not be started, or did not answer ``initialize``."""


class Host:
    """The agent process, its supervisor, and the WebSocket clients sharing it."""

    def __init__(self, settings: HostSettings) -> None:
        self.settings = settings
        self.mux = Multiplexer(settings.limits, settings.aliases)
        self.clients: dict[ClientId, ClientLink] = {}
        self.agent: AgentProcess | None = None
        self.ready = asyncio.Event()

    # -- the agent process --------------------------------------------------------------------------

    async def start_agent(self) -> AgentProcess:
        """Start the command and initialize it; raises AgentStartFailed."""
        try:
            agent = await AgentProcess.start(
                self.settings.command, max_line_bytes=self.settings.max_message_bytes
            )
        except OSError as exc:
            raise AgentStartFailed(f"cannot run {self.settings.command[0]}: {exc}") from None
        try:
            await self._initialize(agent)
        except BaseException:  # a failure, or the host stopping: nothing of it may stay
            await agent.stop()
            raise
        self.agent = agent
        self.ready.set()
        logger.info("agent process %d is up", agent.pid)
        return agent

    async def _initialize(self, agent: AgentProcess) -> None:
        try:
            async with asyncio.timeout(self.settings.startup_timeout):
                await agent.send(self.mux.handshake(self.settings.client_capabilities))
                async for message in agent.messages():
                    if isinstance(message, Response) and message.id == HANDSHAKE_ID:
                        nonce = secrets.token_hex(8)  # names this process to routers
                        self.mux.agent_initialized(message, nonce, agent.stderr_tail)
                        return
        except TimeoutError:
            raise AgentStartFailed(
                f"the agent did not answer initialize within {self.settings.startup_timeout} s"
            ) from None
        except InternalError as exc:
            raise AgentStartFailed(exc.message) from None
        status = await agent.stop()
        raise AgentStartFailed(f"the agent exited during initialize (status {status})")

    async def supervise(self, agent: AgentProcess) -> None:
        """Pump the agent's messages to clients; when it exits, restart it, forever."""
        delay = RESTART_INITIAL_SECONDS
        while True:
            started = time.monotonic()
            status = await self._run(agent)
            logger.warning("agent process %d exited with status %s", agent.pid, status)
            await self._agent_lost()
            if time.monotonic() - started >= STABLE_SECONDS:
                delay = RESTART_INITIAL_SECONDS
            while True:
                await asyncio.sleep(delay)  # backoff: there is nothing to wait on instead
                delay = min(delay * 2, RESTART_MAX_SECONDS)
                try:
                    agent = await self.start_agent()
                except AgentStartFailed as exc:
                    logger.error("restarting the agent failed: %s", exc)
                    continue
                break

    async def _run(self, agent: AgentProcess) -> int | None:
        """Pass the agent's messages on until it exits or closes its stdout; then stop
        what is left of it (its process group) and read what it wrote before it went.
        Its exit status."""
        reading = asyncio.create_task(self._from_agent(agent), name="agent-stdout")
        exited = asyncio.create_task(agent.exited(), name="agent-exit")
        status: int | None = None
        try:
            await asyncio.wait({reading, exited}, return_when=asyncio.FIRST_COMPLETED)
            status = await agent.stop()
            async with asyncio.timeout(KILL_WAIT_SECONDS):  # its stdout is closed by now
                await reading
        except TimeoutError:
            logger.warning("agent process %d: its stdout stayed open", agent.pid)
        finally:
            await cancel_all_and_wait(reading, exited)
        return status

    async def _from_agent(self, agent: AgentProcess) -> None:
        async for message in agent.messages():
            if isinstance(message, Response) and message.error is not None:
                agent.catch_up_stderr()  # it may have said why, just before
            await self._do(self.mux.receive_agent(message))

    async def _agent_lost(self) -> None:
        self.ready.clear()
        self.agent = None
        await self._do(self.mux.agent_lost())
        for link in self.clients.values():
            link.close_after_sending(WSCloseCode.SERVICE_RESTART, "agent process exited")

    async def stop(self) -> None:
        """Close every client (1001, after what is queued for it) while the agent and its
        process group are stopped: done within the agent's SIGTERM grace and the SIGKILL
        wait (:data:`~router.host.process.EXIT_GRACE_SECONDS` + ``KILL_WAIT_SECONDS``), whatever the agent
        or a client that stopped reading does."""
        self.ready.clear()
        if self.agent is None:
            await self._close_clients()
        else:
            await asyncio.gather(self._close_clients(), self.agent.stop())

    async def _close_clients(self) -> None:
        links = list(self.clients.values())
        for link in links:
            link.close_after_sending(WSCloseCode.GOING_AWAY, "host shutting down")
        if not links:
            return
        await asyncio.wait([link.writer for link in links], timeout=CLOSE_SECONDS)
        late = [link for link in links if not link.writer.done()]
        for link in late:  # not reading what is left: drop it
            link.writer.cancel()
        await asyncio.gather(
            *(link.close(WSCloseCode.GOING_AWAY, "host shutting down") for link in late)
        )

    # -- clients ---------------------------------------------------------------------------------

    async def serve_client(self, ws: web.WebSocketResponse) -> None:
        if not self.ready.is_set():
            try:
                async with asyncio.timeout(self.settings.startup_timeout):
                    await self.ready.wait()
            except TimeoutError:
                await ws.close(code=WSCloseCode.TRY_AGAIN_LATER, message=b"agent not ready")
                return
        link = ClientLink(ws, max_message_bytes=self.settings.max_message_bytes)
        client = self.mux.client_joined()
        self.clients[client] = link
        reader = asyncio.create_task(self._read_client(client, ws), name="host-client-reader")
        try:
            await asyncio.wait({reader, link.writer}, return_when=asyncio.FIRST_COMPLETED)
            if link.too_slow:
                logger.warning("client %d does not read fast enough: closing it", client)
                await link.close(*TOO_SLOW)
            await reader  # it ends once the connection is closed, by either side
        finally:
            del self.clients[client]
            await self._do(self.mux.client_left(client))
            await cancel_all_and_wait(reader, link.writer)

    async def _read_client(self, client: ClientId, ws: web.WebSocketResponse) -> None:
        async for frame in ws:
            if frame.type is WSMsgType.TEXT:
                await self._client_frame(client, frame.data)

    async def _client_frame(self, client: ClientId, text: str) -> None:
        try:
            message = parse(text)
        except ProtocolError as exc:
            await self._do([ToClient(client, encode_protocol_error(exc))])
            return
        await self._do(self.mux.receive_client(client, message))

    async def _do(self, actions: Sequence[Action]) -> None:
        """Write to the agent, in order; frames for clients only go into their outboxes
        (a client that reads slowly makes nobody wait)."""
        for action in actions:
            if isinstance(action, ToAgent):
                if self.agent is not None:
                    await self.agent.send(action.text)
            else:
                link = self.clients.get(action.client)
                if link is not None:
                    link.offer(action.text)


HOST = web.AppKey("host", Host)


def create_app(host: Host) -> web.Application:
    app = web.Application()
    app[HOST] = host
    app.router.add_get(PATH, _acp)
    app.router.add_get("/healthz", _healthz)
    app.router.add_get("/readyz", _readyz)
    return app


async def _acp(request: web.Request) -> web.StreamResponse:
    host = request.app[HOST]
    ws = web.WebSocketResponse(
        heartbeat=HEARTBEAT_SECONDS, max_msg_size=reader_limit(host.settings.max_message_bytes)
    )
    if not ws.can_prepare(request).ok:
        return web.Response(status=426, text="ACP speaks WebSocket here: connect with ws://\n")
    await ws.prepare(request)
    try:
        await host.serve_client(ws)
    except Exception:  # the connection's boundary: log it, close 1011
        logger.exception("client connection failed")
        await ws.close(code=WSCloseCode.INTERNAL_ERROR, message=b"internal error")
    return ws


async def _healthz(request: web.Request) -> web.Response:
    return web.Response(text="ok\n")


async def _readyz(request: web.Request) -> web.Response:
    if not request.app[HOST].ready.is_set():
        return web.Response(status=503, text="the agent process is not up\n")
    return web.Response(text="ready\n")


async def serve(settings: HostSettings, address: tuple[str, int]) -> None:
    """Start the agent, listen, announce, and run until SIGINT or SIGTERM.

    Raises:
        AgentStartFailed: the first start of the agent failed.
        OSError: the address cannot be bound.
    """
    host = Host(settings)
    agent = await host.start_agent()
    runner = web.AppRunner(create_app(host), shutdown_timeout=SHUTDOWN_TIMEOUT, access_log=None)
    supervisor: asyncio.Task[None] | None = None
    try:
        await runner.setup()
        site = web.TCPSite(runner, *address)
        await site.start()
        supervisor = asyncio.create_task(host.supervise(agent), name="agent-supervisor")
        _announce(settings.host_id, address[0], runner.addresses[0][1])
        await _until_signalled(supervisor)
    finally:
        if supervisor is not None:
            await cancel_and_wait(supervisor)
        await host.stop()
        await runner.cleanup()


def _announce(host_id: str, bound_host: str, port: int) -> None:
    """The one stdout line scripts and tests parse to find the host."""
    shown = f"[{bound_host}]" if ":" in bound_host else bound_host
    sys.stdout.write(f"host {host_id} listening on ws://{shown}:{port}{PATH}\n")
    sys.stdout.flush()


async def _until_signalled(supervisor: asyncio.Task[None]) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    stopping = asyncio.create_task(stop.wait())
    try:
        await asyncio.wait({stopping, supervisor}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopping.cancel()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(signum)
            # stopping takes a few seconds: a second signal must not kill the host
            # before its agent (in a process group of its own) is stopped
            signal.signal(signum, signal.SIG_IGN)
    if supervisor.done():
        supervisor.result()  # a crash of the supervisor is a crash of the host
    logger.info("stopping")
