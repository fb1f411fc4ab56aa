"""The ``acp-router`` command line.

Every failure to start ends with one line on stderr and a non-zero exit status,
never a traceback.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from router import __version__
from router.commands import log_format
from router.protocol.errors import AcpRouterError, ConfigError
from router.protocol.jsonrpc import DEFAULT_MAX_MESSAGE_BYTES

if TYPE_CHECKING:
    from router.server.process.workers import WorkerRole


def _host_port(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {value!r}")
    return host.strip("[]"), int(port)


def _positive_float(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {value!r}") from None
    if number <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {value!r}")
    return number


def _positive_int(value: str) -> int:
    if not value.isdigit() or int(value) == 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value!r}")
    return int(value)


def _json_object(value: str) -> dict[str, object]:
    try:
        parsed = json.loads(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {value!r}") from None
    if not isinstance(parsed, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {value!r}")
    return parsed


#: each command's help page: what it does (``description``) and how it is run (``epilog``)
DESCRIPTIONS = {
    "agent": """\
Run the reference ACP agent: a small, real ACP v1 agent over WebSocket at /acp that echoes
prompts instead of calling a model and names itself in every reply, so routing is visible.
Sessions live in --store, one file each; agents sharing the folder can resume each other's
sessions. It answers session/status as the session-status RFD says (not with --no-status).""",
    "host": """\
Serve an existing stdio ACP agent over WebSocket at /acp, so a router can use it as a
backend: the command runs once, every client shares that process, and the host answers
session/status for it. Prints "host NAME listening on ws://.../acp" once the agent has
answered initialize.""",
    "demo": """\
Start N reference agents on free loopback ports, sharing a temporary session store, and the
router in front of them on ws://127.0.0.1:P/acp; print how to talk to the fleet, and the
link to the router's status page (its admin token: --admin-token, or one made up at
start). Ctrl-C stops everything.""",
    "serve": """\
Run the router: one WebSocket front door (/acp) in front of the backends that FILE names,
with /metrics, /healthz and /readyz beside it (and /admin/ with an [admin] section). The
configuration is TOML, checked at start: a bad key or value stops the router with one line
naming it. SIGHUP (or POST /admin/reload) re-reads FILE; SIGTERM drains, then exits 0.
With router.workers = N it runs N worker processes on the one port and passes the
signals on to them. config/router.example.toml lists every key with its default.""",
    "connect": """\
Bridge stdin/stdout to a router's (or an agent's) WebSocket: give it to an editor as the
agent command and the editor uses the whole fleet. One JSON-RPC message per line each way.
Sends Authorization: Bearer $ACP_ROUTER_TOKEN when that variable is set.

It rides through router restarts. When the router is not up yet, or goes away, it keeps
trying to reach it (a jittered backoff from 0.1 s doubling to 5 s) for --reconnect-for
seconds, holding what the editor writes; requests the router was answering when it went
get the retryable -32013, once. On a new connection it replays the editor's initialize,
authenticate and open sessions. A request for an open session that the router no longer
has attached (-32010, after the agent holding it restarted, say) is held: the bridge
resumes (or loads) the session again and sends the request once more (a prompt whose
turn had begun gets the retryable -32013 instead); if the router will not attach it, the
editor gets that refusal when it is retryable, else the -32010.

Exit status: 0 when stdin closes (after the answers it owes, up to 60 s) or the router
closes normally; 1 when the router is lost for good (not reached again within
--reconnect-for, another close code, a refused token or handshake); 2 when it was never
reached (its token or the URL refused, or nothing within --reconnect-for).""",
    "status": """\
Ask a router or an agent for one session's status (session/status) and print the answer,
over WebSocket (ws://, wss://) or Streamable HTTP (http://, https://). Exit status: 0
active, 3 inactive, 4 unknown session. Sends Authorization: Bearer $ACP_ROUTER_TOKEN when
that variable is set.""",
}
EXAMPLES = {
    "agent": """\
example:
  acp-router agent --listen 127.0.0.1:9001 --store /tmp/acp-store --id agent-1""",
    "host": """\
examples:
  acp-router host --listen 0.0.0.0:9001 --id claude-1 -- claude-code-acp
  acp-router host --listen 0.0.0.0:9002 --id py-1 -- python my_agent.py --flag""",
    "demo": """\
examples:
  acp-router demo
  acp-router demo --agents 5 --port 9000 --token s3cret
  acp-router demo --admin-token adm1n-s3cret""",
    "serve": """\
examples:
  acp-router serve --config config/router.example.toml
  acp-router --log-format json serve --config /etc/acp-router/router.toml

a minimal FILE:
  [router]
  listen = "127.0.0.1:8765"

  [[backends]]
  id = "agent-1"
  url = "ws://127.0.0.1:9001/acp"
""",
    "connect": """\
example (Zed's settings.json: "command": "acp-router", "args": ["connect", URL]):
  acp-router connect ws://router.internal:8765/acp""",
    "status": """\
examples:
  acp-router status ws://127.0.0.1:8765/acp sess_0123456789abcdef
  acp-router status http://127.0.0.1:8765/acp sess_0123456789abcdef""",
}


def _command(
    commands: argparse._SubParsersAction[argparse.ArgumentParser],
    name: str,
    summary: str,
    usage: str | None = None,
) -> argparse.ArgumentParser:
    """A subcommand with its one-line summary (in ``acp-router --help``), its description and
    its examples (in ``acp-router NAME --help``), laid out as written."""
    return commands.add_parser(
        name,
        help=summary,
        description=DESCRIPTIONS[name],
        epilog=EXAMPLES[name],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        usage=usage,
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="acp-router",
        description="Session-aware routing proxy for ACP agents.",
        epilog="Run `acp-router COMMAND --help` for what a command does, its options and"
        " an example.",
    )
    parser.add_argument("--version", action="version", version=f"acp-router {__version__}")
    parser.add_argument(
        "--log-level",
        default="INFO",
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        help="the least severe records written (default INFO; DEBUG shows every reconnect)",
    )
    parser.add_argument(
        "--log-format",
        default="text",
        choices=["text", "json"],
        help="text lines, or one JSON object per line with connection, backend and session",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    agent = _command(commands, "agent", "run the reference ACP agent")
    agent.add_argument(
        "--listen", type=_host_port, required=True, metavar="HOST:PORT", help="where to serve /acp"
    )
    agent.add_argument("--store", required=True, metavar="DIR", help="session store folder")
    agent.add_argument(
        "--id",
        dest="agent_id",
        default=None,
        metavar="NAME",
        help="the name in its replies (default the host name)",
    )
    agent.add_argument(
        "--idle-timeout",
        type=_positive_float,
        default=3600.0,
        metavar="SECONDS",
        help="evict a session with no client attached after this long (default 3600)",
    )
    agent.add_argument(
        "--page-size",
        type=_positive_int,
        default=50,
        metavar="N",
        help="sessions per session/list page (default 50)",
    )
    agent.add_argument("--tls-cert", metavar="PEM", help="serve wss:// with this certificate")
    agent.add_argument("--tls-key", metavar="PEM", help="the certificate's private key")
    agent.add_argument(
        "--require-auth",
        metavar="METHOD_ID",
        help="offer one auth method and refuse session/new, load, resume, close and prompt"
        " (-32000) until the connection authenticates with exactly that method id",
    )
    agent.add_argument(
        "--max-message-bytes",
        type=_positive_int,
        default=DEFAULT_MAX_MESSAGE_BYTES,
        metavar="N",
        help="largest frame accepted from a client; a bigger one closes its connection"
        f" (default {DEFAULT_MAX_MESSAGE_BYTES}, the router's router.max_message_bytes)",
    )
    agent.add_argument(
        "--no-status",
        action="store_true",
        help="act like agents without the session-status RFD: no session/status",
    )
    host = _command(
        commands,
        "host",
        "serve an existing stdio ACP agent over WebSocket, answering session/status for it",
        usage="acp-router host --listen HOST:PORT [--id NAME] [--client-capabilities JSON] "
        "[--startup-timeout SECONDS] -- CMD [ARGS...]",
    )
    host.add_argument(
        "--listen", type=_host_port, required=True, metavar="HOST:PORT", help="where to serve /acp"
    )
    host.add_argument(
        "--id",
        dest="host_id",
        default=None,
        metavar="NAME",
        help="its name (default the host name)",
    )
    host.add_argument(
        "--client-capabilities",
        type=_json_object,
        default={},
        metavar="JSON",
        help="clientCapabilities the host initializes the agent with (default {})",
    )
    host.add_argument(
        "--startup-timeout",
        type=_positive_float,
        default=30.0,
        metavar="SECONDS",
        help="how long the agent may take to answer initialize (default 30)",
    )
    host.add_argument(
        "agent_command", nargs="+", metavar="CMD", help="the stdio agent command and its arguments"
    )
    demo = _command(commands, "demo", "run reference agents and the router in front of them")
    demo.add_argument("--agents", type=int, default=3, metavar="N", help="how many agents (3)")
    demo.add_argument("--port", type=int, default=8765, metavar="P", help="router port (8765)")
    demo.add_argument(
        "--token", default=None, metavar="TOKEN", help="require this bearer token from clients"
    )
    demo.add_argument(
        "--admin-token",
        default=None,
        metavar="TOKEN",
        help="the status page's (/admin/) token (default: one made up at start); the banner"
        " prints the page's link with it",
    )

    serve = _command(commands, "serve", "run the router")
    serve.add_argument("--config", required=True, metavar="FILE", help="TOML configuration")
    # the parent of a router with workers starts each one with these (router.server.process.workers)
    serve.add_argument("--worker", help=argparse.SUPPRESS)
    serve.add_argument("--worker-folder", help=argparse.SUPPRESS)
    serve.add_argument("--worker-fds", help=argparse.SUPPRESS)

    connect = _command(
        commands, "connect", "bridge stdio (an editor's agent command) to a router or agent URL"
    )
    connect.add_argument(
        "url", metavar="URL", help="ws://HOST:PORT/acp (token: $ACP_ROUTER_TOKEN, if set)"
    )
    connect.add_argument(
        "--reconnect-for",
        type=_positive_float,
        default=60.0,
        metavar="SECONDS",
        help="keep trying to reach the router this long, at the start and each time it"
        " goes away, then exit (2 at the start, 1 later) (default 60)",
    )

    status = _command(commands, "status", "ask a router or an agent for one session's status")
    status.add_argument(
        "url", metavar="URL", help="ws://HOST:PORT/acp, or http://HOST:PORT/acp (or wss, https)"
    )
    status.add_argument("session_id", metavar="SESSION_ID", help="the session to ask about")
    status.add_argument(
        "--timeout",
        type=_positive_float,
        default=10.0,
        metavar="SECONDS",
        help="give up after this long (default 10)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.worker_role = role = _worker_role(args)
    log_format.configure(args.log_level, args.log_format, None if role is None else role.index)
    try:
        return _run(args)
    except AcpRouterError as exc:
        print(f"acp-router: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"acp-router: {exc.strerror or exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


def _worker_role(args: argparse.Namespace) -> WorkerRole | None:
    """The role a worker was started with (``serve --worker ...``), or None."""
    worker: str | None = getattr(args, "worker", None)
    folder: str | None = getattr(args, "worker_folder", None)
    fds: str | None = getattr(args, "worker_fds", None)
    if worker is None and folder is None and fds is None:
        return None
    from router.server.process.workers import WorkerRole

    try:
        if worker is None or folder is None or fds is None:
            raise ValueError("a worker needs all three")
        return WorkerRole.of(worker, folder, fds)
    except ValueError:
        raise SystemExit(
            "acp-router: --worker, --worker-folder and --worker-fds go together; the parent"
            " of a router with workers gives them to its worker processes"
        ) from None


def _freeze_the_start() -> None:
    """Leave what the start built (the imported modules: some 60,000 objects) out of every
    later garbage collection. They live until the exit, where the interpreter's last
    collections walked them all: about 0.1 s of CPU between the process's last log line
    and its exit (several times that on a busy machine), and a full collection's pause
    while it runs."""
    gc.freeze()


def _serve(args: argparse.Namespace) -> int:
    """``serve``: one router process; or, with ``router.workers`` above 1, the parent of
    that many (:mod:`router.server.process.supervisor`); or one of those workers."""
    import asyncio

    from router.server.config import load_settings
    from router.server.loops import runner
    from router.server.process.serving import serve

    settings = load_settings(args.config)
    config_path = Path(args.config)
    role = args.worker_role
    _freeze_the_start()
    if role is not None:
        with runner(settings.router.event_loop) as loop:
            loop.run(serve(settings, config_path=config_path, worker=role))
        return 0
    if settings.router.workers > 1:
        from router.server.process.serving import announce
        from router.server.process.supervisor import serve_workers

        command = [sys.executable, "-m", "router", "--log-level", args.log_level,
                   "--log-format", args.log_format, "serve", "--config", args.config]  # fmt: skip
        return asyncio.run(
            serve_workers(settings, announce, config_path=config_path, command=command)
        )
    with runner(settings.router.event_loop) as loop:
        loop.run(serve(settings, config_path=config_path))
    return 0


def _run(args: argparse.Namespace) -> int:
    if args.command == "demo":
        from router.commands.demo import run_demo
        from router.server.loops import default_event_loop, runner

        if not 1 <= args.agents <= 64:
            raise ConfigError("--agents: expected 1 to 64")
        _freeze_the_start()
        # the loop a router gets by default (uvloop where it installs), agents and all
        with runner(default_event_loop()) as loop:
            loop.run(
                run_demo(args.agents, args.port, token=args.token, admin_token=args.admin_token)
            )
        return 0
    if args.command == "serve":
        return _serve(args)
    if args.command == "connect":
        import asyncio

        from router.commands.connect import run_bridge

        return asyncio.run(run_bridge(args.url, reconnect_for=args.reconnect_for))
    if args.command == "status":
        import asyncio

        from router.commands.status import ask_status

        return asyncio.run(ask_status(args.url, args.session_id, time_limit=args.timeout))
    if args.command == "host":
        import asyncio
        import socket

        from router.host.shell import HostSettings, serve as serve_host

        hosted = HostSettings(
            command=tuple(args.agent_command),
            host_id=args.host_id or socket.gethostname(),
            client_capabilities=args.client_capabilities,
            startup_timeout=args.startup_timeout,
        )
        asyncio.run(serve_host(hosted, args.listen))
        return 0
    if args.command == "agent":
        from router.agent.listener import run_agent

        if (args.tls_cert is None) != (args.tls_key is None):
            raise ConfigError("--tls-cert and --tls-key go together")
        _freeze_the_start()
        return run_agent(args)
    raise AssertionError(args.command)
