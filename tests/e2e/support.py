"""Helpers of the process tests (tests/e2e): a router's config file, its URL and reloads,
the admin token, the Streamable HTTP client, fleets of replicas, the SDK client."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import shutil
from collections import defaultdict
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, cast

import acp
import aiohttp
from acp.client.connection import ClientSideConnection
from acp.connection import StreamDirection, StreamEvent
from acp.schema import (
    AgentMessageChunk,
    AllowedOutcome,
    AudioContentBlock,
    EmbeddedResourceContentBlock,
    ImageContentBlock,
    PermissionOption,
    RequestPermissionResponse,
    ResourceContentBlock,
    TextContentBlock,
    UserMessageChunk,
)
from acp.ws import create_websocket_stream
from prometheus_client.parser import text_string_to_metric_families

from tests.relay import Relay, start_relay
from tests.support import (
    WAIT,
    AcpClient,
    AgentProcess,
    CliProcess,
    JsonObject,
    answered_by,
    speaker,
    start_agent,
)

# -- a router process: its config, URL, reloads and metrics ------------------------------------


#: the ``[router]`` table's line that lets the router take any free port
LISTEN = 'listen = "127.0.0.1:0"'
Backend = AgentProcess | tuple[str, str]


def write_config(
    path: Path,
    backends: Sequence[Backend],
    router: str = LISTEN,
    *,
    weights: Mapping[str, float] | None = None,
    extra: str = "",
) -> Path:
    """A router's config file at ``path``: ``router``, the lines of its ``[router]``
    table; ``extra``, any other tables; then a ``[[backends]]`` table for each agent or
    ``(id, url)``, with its weight if ``weights`` names it."""
    weights = weights or {}
    tables = ""
    for backend in backends:
        backend_id, url = (
            (backend.agent_id, backend.url) if isinstance(backend, AgentProcess) else backend
        )
        weight = f"weight = {weights[backend_id]}\n" if backend_id in weights else ""
        tables += f'[[backends]]\nid = "{backend_id}"\nurl = "{url}"\n{weight}'
    path.write_text(f"[router]\n{router}\n{extra}\n{tables}")
    return path


def router_url(serve: CliProcess) -> str:
    match = re.fullmatch(r"acp-router listening on (wss?://\S+)", serve.first_line)
    assert match is not None, serve.first_line
    return match.group(1)


async def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample /metrics serves, by name and labels."""
    base = url.removesuffix("/acp").replace("ws", "http", 1)
    async with aiohttp.ClientSession() as http, http.get(f"{base}/metrics") as response:
        text = await response.text()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


async def sessions_on_each(client: AcpClient, agents: int) -> dict[str, str]:
    """New sessions on ``client`` until ``agents`` agents hold one each (placement
    alternates): agent id -> session id."""
    owners: dict[str, str] = {}
    for _ in range(4 * agents):
        session_id = await client.new_session()
        owners.setdefault(await answered_by(client, session_id), session_id)
        if len(owners) == agents:
            break
    assert len(owners) == agents, owners
    return owners


async def placed_by_a_new_client(url: str, count: int) -> list[str]:
    """The agents that answer ``count`` new sessions of a new client."""
    async with AcpClient.connect(url) as fresh:
        await fresh.initialize()
        return [await answered_by(fresh, await fresh.new_session()) for _ in range(count)]


async def upgrade_status(url: str, token: str) -> int:
    headers = {"Authorization": f"Bearer {token}"}
    async with aiohttp.ClientSession() as http:
        try:
            async with http.ws_connect(url, headers=headers) as ws:
                await ws.close()
                return 101
        except aiohttp.WSServerHandshakeError as exc:
            return exc.status


async def post_reload(url: str, token: str | None) -> tuple[int, Any]:
    """``POST /admin/reload`` on the router at ``url``: the status and the JSON body."""
    base = url.removesuffix("/acp").replace("ws", "http", 1)
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{base}/admin/reload", headers=headers) as response,
    ):
        return response.status, await response.json(content_type=None)


async def wait_backends_up(cli: CliProcess, agents: list[AgentProcess]) -> None:
    for agent in agents:
        await cli.wait_for_log(f"backend {agent.agent_id} is up")


# -- a fleet behind relays ---------------------------------------------------------------------


NAMES = ("agent-1", "agent-2", "agent-3")


@contextlib.asynccontextmanager
async def relayed_fleet(
    tmp_path: Path,
) -> AsyncIterator[tuple[list[AgentProcess], dict[str, Relay]]]:
    """Three agents, each on its own store, each behind its own relay."""
    async with contextlib.AsyncExitStack() as stack:
        agents = []
        relays = {}
        for name in NAMES:
            store = tmp_path / name
            store.mkdir()
            agent = await stack.enter_async_context(start_agent(store, name))
            agents.append(agent)
            relays[name] = await stack.enter_async_context(start_relay(agent.url))
        yield agents, relays


def share_session(tmp_path: Path, session_id: str, home: str) -> None:
    """Copy the session's file from its home's store to the others' (their own copies:
    each may resume it, and nothing but the router keeps two copies from running)."""
    source = tmp_path / home / f"{session_id}.jsonl"
    for name in NAMES:
        if name != home:
            shutil.copy(source, tmp_path / name / f"{session_id}.jsonl")


def active_ones(statuses: dict[str, str]) -> list[str]:
    return sorted(name for name, status in statuses.items() if status == "active")


# -- the admin API -----------------------------------------------------------------------------


ADMIN_TOKEN = "admin-token-for-tests"
ADMIN = {"tokens": [ADMIN_TOKEN]}
ADMIN_BEARER = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


# -- Streamable HTTP ---------------------------------------------------------------------------


JSON = {"Content-Type": "application/json"}
EVENTS = {"Accept": "text/event-stream"}


def rpc(request_id: int | None, method: str, params: JsonObject | None = None) -> JsonObject:
    message: JsonObject = {"jsonrpc": "2.0", "method": method, "params": params or {}}
    if request_id is not None:
        message["id"] = request_id
    return message


INITIALIZE = rpc(0, "initialize", {"protocolVersion": 1, "clientCapabilities": {}})


class EventReader:
    """One raw server-sent event stream: JSON-RPC messages from its ``data:`` lines,
    comments as they are."""

    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self.response = response

    async def next(self) -> JsonObject | str:
        """The next event's message, or the next comment line (``: keepalive``)."""
        data: list[str] = []
        async with asyncio.timeout(WAIT):
            while True:
                raw = await self.response.content.readline()
                if not raw:
                    raise EOFError("the event stream ended")
                line = raw.decode().rstrip("\r\n")
                if line.startswith(":") and not data:
                    return line
                if line.startswith("data:"):
                    data.append(line.removeprefix("data:").removeprefix(" "))
                elif not line and data:
                    message: JsonObject = json.loads("\n".join(data))
                    return message

    async def message(self) -> JsonObject:
        """The next message, past any comments."""
        while isinstance(item := await self.next(), str):
            pass
        return item

    async def ended(self) -> None:
        """Wait until the router ends the stream (nothing but comments before)."""
        with contextlib.suppress(EOFError):
            while True:
                item = await self.next()
                assert isinstance(item, str), f"a message before the end: {item}"


class HttpClient:
    """A raw Streamable HTTP client: POSTs frames, reads event streams."""

    def __init__(self, http: aiohttp.ClientSession, url: str, token: str | None = None) -> None:
        self.http = http
        self.url = url
        self.auth = {"Authorization": f"Bearer {token}"} if token is not None else {}
        self.connection_id = ""

    def headers(self, session: str | None = None, **more: str) -> dict[str, str]:
        headers = {**self.auth, **more}
        if self.connection_id:
            headers["Acp-Connection-Id"] = self.connection_id
        if session is not None:
            headers["Acp-Session-Id"] = session
        return headers

    async def initialize(self) -> JsonObject:
        async with self.http.post(self.url, json=INITIALIZE, headers=self.auth) as response:
            assert response.status == 200, await response.text()
            assert response.content_type == "application/json"
            self.connection_id = response.headers["Acp-Connection-Id"]
            answer: JsonObject = await response.json()
            return answer

    async def post(self, message: JsonObject, session: str | None = None) -> int:
        headers = self.headers(session, **JSON)
        async with self.http.post(self.url, data=json.dumps(message), headers=headers) as response:
            return response.status

    @contextlib.asynccontextmanager
    async def stream(self, session: str | None = None) -> AsyncIterator[EventReader]:
        headers = self.headers(session, **EVENTS)
        async with self.http.get(self.url, headers=headers) as response:
            assert response.status == 200, await response.text()
            assert response.content_type == "text/event-stream"
            yield EventReader(response)

    async def delete(self) -> int:
        async with self.http.delete(self.url, headers=self.headers()) as response:
            return response.status


#: what ``ClientSideConnection.prompt`` takes (a list, so it must be spelled out whole)
PromptBlocks = list[
    TextContentBlock
    | ImageContentBlock
    | AudioContentBlock
    | ResourceContentBlock
    | EmbeddedResourceContentBlock
]


# -- the ACP SDK as a client -------------------------------------------------------------------


class RecordingClient:
    """An SDK client: records text chunks per session, allows every permission ask.

    It implements only the two methods this suite needs. The SDK resolves handlers by
    name and answers ``-32601`` for the ones a client lacks, so this does not subclass the
    ``acp.Client`` protocol (whose other methods would become silent ``None`` stubs).
    """

    def __init__(self) -> None:
        #: ``(sessionUpdate kind, text)`` of every text chunk, per session id
        self.chunks: defaultdict[str, list[tuple[str, str]]] = defaultdict(list)
        #: session ids of the permission requests answered, in order
        self.permission_asks: list[str] = []

    async def session_update(self, session_id: str, update: Any, **kwargs: Any) -> None:
        if isinstance(update, AgentMessageChunk | UserMessageChunk) and isinstance(
            update.content, TextContentBlock
        ):
            self.chunks[session_id].append((update.session_update, update.content.text))

    async def request_permission(
        self, session_id: str, tool_call: Any, options: list[PermissionOption], **kwargs: Any
    ) -> RequestPermissionResponse:
        self.permission_asks.append(session_id)
        allow = next(option for option in options if option.kind == "allow_once")
        return RequestPermissionResponse(
            outcome=AllowedOutcome(outcome="selected", option_id=allow.option_id)
        )

    def take(self, session_id: str) -> list[tuple[str, str]]:
        """The chunks recorded for ``session_id`` so far; forgets them."""
        return self.chunks.pop(session_id, [])


class Wire:
    """Every raw JSON-RPC message the SDK sent and received, in order (an SDK observer)."""

    def __init__(self) -> None:
        self.outgoing: list[JsonObject] = []
        self.incoming: list[JsonObject] = []

    def __call__(self, event: StreamEvent) -> None:
        sent = event.direction is StreamDirection.OUTGOING
        (self.outgoing if sent else self.incoming).append(event.message)

    def reply_index(self, method: str) -> int:
        """Where, among the received messages, the reply to the SDK's ``method`` request is."""
        request_id = next(m["id"] for m in self.outgoing if m.get("method") == method)
        return next(
            i
            for i, m in enumerate(self.incoming)
            if "method" not in m and m.get("id") == request_id
        )

    def result_of(self, method: str) -> JsonObject:
        result: JsonObject = self.incoming[self.reply_index(method)]["result"]
        return result


@asynccontextmanager
async def sdk_connection(
    url: str, client: RecordingClient, wire: Wire | None = None
) -> AsyncIterator[ClientSideConnection]:
    """An SDK client connection over the SDK's own WebSocket transport."""
    async with asyncio.timeout(WAIT):
        transport = await create_websocket_stream(url)
    observers = [] if wire is None else [wire]
    conn = acp.connect_to_agent(cast(acp.Client, client), transport, observers=observers)
    try:
        yield conn
    finally:
        await conn.close()


def prompt_of(text: str) -> PromptBlocks:
    return [acp.text_block(text)]


async def sdk_answered_by(
    conn: ClientSideConnection, client: RecordingClient, session_id: str, text: str
) -> str:
    """Prompt through the SDK; the id of the agent that answered."""
    client.take(session_id)
    async with asyncio.timeout(WAIT):
        response = await conn.prompt(session_id=session_id, prompt=prompt_of(text))
    assert response.stop_reason == "end_turn"
    # the SDK's prompt() waits until the session_update handlers for the turn have run
    chunks = client.take(session_id)
    assert len(chunks) == 1, chunks
    kind, said = chunks[0]
    assert kind == "agent_message_chunk"
    assert said == f"[{speaker(said)}] {text}"
    return speaker(said)
