"""The reference agent's shell: an aiohttp WebSocket server at ``/acp`` and ``run_agent``.

One JSON-RPC message per text frame; binary frames are ignored. SIGINT and SIGTERM
stop the agent: running turns are cancelled, sockets closed, and the exit status is 0.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import socket
import ssl
import sys
from pathlib import Path

from aiohttp import WSCloseCode, WSMsgType, web

from router.agent.connection import Connection
from router.agent.methods import Agent, AgentSettings
from router.agent.store import SessionStore
from router.protocol.errors import ConfigError
from router.protocol.jsonrpc import DEFAULT_MAX_MESSAGE_BYTES, reader_limit

logger = logging.getLogger(__name__)

PATH = "/acp"
HEARTBEAT_SECONDS = 20.0
SHUTDOWN_TIMEOUT = 5.0

AGENT = web.AppKey("agent", Agent)
SOCKETS = web.AppKey("sockets", set[web.WebSocketResponse])
MAX_FRAME_BYTES = web.AppKey("max_frame_bytes", int)


def run_agent(args: argparse.Namespace) -> int:
    """Run the agent until SIGINT or SIGTERM; the ``acp-router agent`` command.

    Raises:
        ConfigError: the store folder is unusable.
        OSError: the address cannot be bound.
    """
    store = SessionStore.open(Path(args.store))
    settings = AgentSettings(
        agent_id=args.agent_id or socket.gethostname(),
        idle_timeout=args.idle_timeout,
        page_size=args.page_size,
        auth_method=args.require_auth,
        status=not args.no_status,
    )
    host, port = args.listen
    tls = _tls_context(args.tls_cert, args.tls_key)
    agent = Agent(settings, store)
    asyncio.run(serve(agent, host, port, tls, max_frame_bytes=args.max_message_bytes))
    return 0


def _tls_context(cert: str | None, key: str | None) -> ssl.SSLContext | None:
    if cert is None or key is None:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"--tls-cert/--tls-key: {exc}") from None
    return context


def create_app(
    agent: Agent, *, max_frame_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
) -> web.Application:
    """The agent's web app; a client frame over ``max_frame_bytes`` closes its socket (1009)."""
    app = web.Application()
    app[AGENT] = agent
    app[SOCKETS] = set()
    app[MAX_FRAME_BYTES] = max_frame_bytes
    app.router.add_get(PATH, _acp)
    app.on_shutdown.append(_close_sockets)
    return app


async def serve(
    agent: Agent,
    host: str,
    port: int,
    tls: ssl.SSLContext | None = None,
    *,
    max_frame_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
) -> None:
    """Serve until a stop signal; announce the bound address on stdout once listening
    (``wss://`` with a TLS context)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    app = create_app(agent, max_frame_bytes=max_frame_bytes)
    runner = web.AppRunner(app, shutdown_timeout=SHUTDOWN_TIMEOUT, access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port, ssl_context=tls)
        await site.start()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
        scheme = "ws" if tls is None else "wss"
        _announce(agent.settings.agent_id, scheme, host, _bound_port(runner))
        await stop.wait()
        logger.info("stopping")
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(signum)
        await runner.cleanup()


def _bound_port(runner: web.AppRunner) -> int:
    port: int = runner.addresses[0][1]
    return port


def _announce(agent_id: str, scheme: str, host: str, port: int) -> None:
    """The one stdout line tests and the demo parse to find the agent."""
    shown_host = f"[{host}]" if ":" in host else host
    sys.stdout.write(f"agent {agent_id} listening on {scheme}://{shown_host}:{port}{PATH}\n")
    sys.stdout.flush()


async def _acp(request: web.Request) -> web.StreamResponse:
    max_frame_bytes = request.app[MAX_FRAME_BYTES]
    ws = web.WebSocketResponse(
        heartbeat=HEARTBEAT_SECONDS, max_msg_size=reader_limit(max_frame_bytes)
    )
    await ws.prepare(request)
    sockets = request.app[SOCKETS]
    sockets.add(ws)
    try:
        await _serve_socket(request.app[AGENT], ws)
    finally:
        sockets.discard(ws)
    return ws


async def _serve_socket(agent: Agent, ws: web.WebSocketResponse) -> None:
    connection = agent.open_connection(ws)
    logger.debug("connection %d opened", connection.id)
    try:
        async with asyncio.TaskGroup() as tasks:
            try:
                await _read_frames(ws, connection, tasks)
            finally:
                agent.close_connection(connection)
    except Exception:  # the connection's boundary: log, close with 1011
        logger.exception("connection %d failed", connection.id)
        await ws.close(code=WSCloseCode.INTERNAL_ERROR, message=b"internal error")
    logger.debug("connection %d closed", connection.id)


async def _read_frames(
    ws: web.WebSocketResponse, connection: Connection, tasks: asyncio.TaskGroup
) -> None:
    async for frame in ws:
        if frame.type is WSMsgType.TEXT:
            await connection.receive(frame.data, tasks)
        elif frame.type is WSMsgType.BINARY:
            logger.debug("connection %d: ignoring a binary frame", connection.id)


async def _close_sockets(app: web.Application) -> None:
    """On shutdown: end every turn (so handlers can return) and close every socket."""
    app[AGENT].shutdown()
    sockets: set[web.WebSocketResponse] = app[SOCKETS]
    closing = [
        ws.close(code=WSCloseCode.GOING_AWAY, message=b"agent shutting down") for ws in sockets
    ]
    await asyncio.gather(*closing)
