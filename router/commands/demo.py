"""``acp-router demo``: the embedded default fleet.

Starts N reference agents on free loopback ports, sharing one temporary session
store, and the router in front of them with its status page (``/admin/``, under the
admin token given or one made up at start); prints how to try it and the page's link;
Ctrl-C (or SIGTERM) stops everything and removes the store.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import secrets
import sys
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

from router.commands.bearer import TOKEN_ENV
from router.protocol.errors import AcpRouterError
from router.server.config import Settings, settings_from
from router.server.process.serving import serve

_URL = re.compile(rb"listening on (ws://\S+)")
STARTUP_SECONDS = 20.0


@contextlib.asynccontextmanager
async def agent_process(store: Path, agent_id: str, log_level: str) -> AsyncIterator[str]:
    """Run one reference agent; yields its ``ws://`` URL."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "router", "--log-level", log_level,
        "agent", "--listen", "127.0.0.1:0", "--store", str(store), "--id", agent_id,
        stdout=asyncio.subprocess.PIPE,
        # Their own process group: Ctrl-C reaches only the demo, which stops the router
        # first and then its agents, so nothing logs the fleet "going down" on the way out.
        start_new_session=True,
    )  # fmt: skip
    try:
        assert process.stdout is not None
        async with asyncio.timeout(STARTUP_SECONDS):
            line = await process.stdout.readline()
        match = _URL.search(line)
        if match is None:
            raise AcpRouterError(f"agent {agent_id} did not start (it said {line!r})")
        yield match.group(1).decode()
    finally:
        if process.returncode is None:
            process.terminate()
        await process.wait()


def demo_settings(
    port: int, agent_urls: dict[str, str], token: str | None = None, *, admin_token: str
) -> Settings:
    data: dict[str, object] = {
        "router": {"listen": f"127.0.0.1:{port}"},
        "backends": [{"id": i, "url": url} for i, url in agent_urls.items()],
        "probe": {"timeout_ms": 500},
        "admin": {"tokens": [admin_token]},
    }
    if token is not None:
        data["auth"] = {"tokens": [token]}
    return settings_from(data, source="demo")


async def run_demo(
    agents: int,
    port: int,
    log_level: str = "WARNING",
    *,
    token: str | None = None,
    admin_token: str | None = None,
) -> None:
    """Run the fleet until Ctrl-C; ``admin_token`` opens the status page (None: one made
    up now, printed with the page's link)."""
    admin_token = admin_token or secrets.token_urlsafe(18)
    with tempfile.TemporaryDirectory(prefix="acp-router-demo-") as store:
        async with contextlib.AsyncExitStack() as stack:
            ids = [f"agent-{n}" for n in range(1, agents + 1)]
            urls = await asyncio.gather(
                *(stack.enter_async_context(agent_process(Path(store), i, log_level)) for i in ids)
            )
            agent_urls = dict(zip(ids, urls, strict=True))
            await serve(
                demo_settings(port, agent_urls, token, admin_token=admin_token),
                lambda front: _print_banner(front, agent_urls, store, token, admin_token),
            )


def _print_banner(
    front: str, agents: dict[str, str], store: str, token: str | None, admin_token: str
) -> None:
    base = front.replace("ws://", "http://").removesuffix("/acp")
    metrics = base + "/metrics"
    status_page = f"{base}/admin/#token={admin_token}"
    if token is None:
        try_it = f"{sys.executable} -m websockets {front}"
    else:  # the websockets CLI sends no headers: the bridge does, from the environment
        try_it = f"{TOKEN_ENV}='{token}' {sys.executable} -m router connect {front}"
    lines = [
        f"acp-router demo: {len(agents)} reference agents behind {front}",
        *(f"  {agent_id:<10} {url}" for agent_id, url in agents.items()),
        f"  session store  {store}",
        f"  metrics        {metrics}",
        f"  status page    {status_page}",
        f"  clients need   Authorization: Bearer {token}" if token else "  no token needed",
        "",
        f"Try it:  {try_it}",
        '  then paste:  {"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":1}}',
        '               {"jsonrpc":"2.0","id":1,"method":"session/new","params":{"cwd":"/tmp","mcpServers":[]}}',
        "Press Ctrl-C to stop.",
    ]
    print("\n".join(lines), flush=True)
