"""Helpers of the one-process tests (tests/server) that other tests use too: frames and
constants of the front door, the tracing frames, readings of the docs and deploy files,
a raw client of the router's WebSocket, the agent store's lines."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from router.agent.store import SessionStore
from tests.fleet import (
    ScriptedBackend,
    active,
    start_scripted,
)
from tests.monitoring import dashboard, panel_expressions, rules
from tests.support import CWD, WAIT, AcpClient, JsonObject
from tests.topology import DOCKERFILE

# -- tracing -----------------------------------------------------------------------------------


CLIENT_TRACE = "0af7651916cd43dd8448eb211c80319c"
CLIENT_SPAN = "b7ad6b7169203331"
TRACEPARENT = f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"
TRACESTATE = "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7"
BAGGAGE = "userId=alice,isProduction=false"
META = {"traceparent": TRACEPARENT, "tracestate": TRACESTATE, "baggage": BAGGAGE}
SESSION = "s-traced"
SECRET = "the prompt text must never reach a span or a log line"


def prompt_text(request_id: int, meta: JsonObject | None, session_id: str = SESSION) -> str:
    """A prompt as a client writes it (spaced, ``_meta`` among other members)."""
    params: JsonObject = {"sessionId": session_id}
    if meta is not None:
        params["_meta"] = meta
    params["prompt"] = [{"type": "text", "text": SECRET}]
    frame = {"jsonrpc": "2.0", "id": request_id, "method": "session/prompt", "params": params}
    return json.dumps(frame)


# -- the front door ----------------------------------------------------------------------------


TOKEN = "tok-alpha-5f1c2a"


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


NEW = {"cwd": CWD, "mcpServers": []}
V2_INITIALIZE = {
    "protocolVersion": 2,
    "info": {"name": "tests", "version": "0"},
    "capabilities": {},
}


# -- turns a client abandons -------------------------------------------------------------------


def dropped(client: AcpClient) -> None:
    """Cut the client's connection as a crash or a network fault does: no close frame."""
    client.ws.transport.abort()


@contextlib.asynccontextmanager
async def turns_never_end() -> AsyncIterator[ScriptedBackend]:
    """A backend that has every session active, resumes it, and never answers a prompt
    (its turn runs until it is cancelled, and a cancel ends nothing)."""
    async with start_scripted("agent-1", active) as backend:
        backend.scripted["session/prompt"] = []
        yield backend


def cancels(backend: ScriptedBackend) -> list[dict[str, Any]]:
    return [m for m in backend.received if m.get("method") == "session/cancel"]


def prompts_in(backend: ScriptedBackend) -> list[dict[str, Any]]:
    return [m for m in backend.received if m.get("method") == "session/prompt"]


async def prompting(client: AcpClient, backend: ScriptedBackend) -> asyncio.Task[JsonObject]:
    """Resume ``s1`` over ``client`` and prompt it; the prompt's answer to come, once the
    backend has the prompt."""
    await client.initialize()
    resumed = await client.request("session/resume", {"sessionId": "s1", "cwd": CWD})
    assert "result" in resumed, resumed
    prompts = len(prompts_in(backend))
    turn = asyncio.create_task(client.prompt("s1", "hello", timeout=WAIT * 3))
    async with asyncio.timeout(WAIT):
        await backend.until(lambda: len(prompts_in(backend)) > prompts)
    return turn


# -- bounds and deadlines ----------------------------------------------------------------------


async def client_status(client: AcpClient, session_id: str) -> JsonObject:
    return await client.request("session/status", {"sessionId": session_id})


@contextlib.asynccontextmanager
async def raw(
    port: int, source: str = "127.0.0.1"
) -> AsyncIterator[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    """A plain TCP connection to the router, from ``source``."""
    async with asyncio.timeout(WAIT):
        reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0))
    try:
        yield reader, writer
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()


# -- workers -----------------------------------------------------------------------------------


#: connections opened to see both workers take some: the kernel hashes each one to a
#: worker, so all of them land on one worker with probability 2 ** -(CLIENTS - 1)
CLIENTS = 24
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def samples(exposition: str) -> Samples:
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(exposition)
        for sample in family.samples
    }


def value(found: Samples, name: str, **labels: str) -> float | None:
    return found.get((name, frozenset(labels.items())))


# -- the agent's store -------------------------------------------------------------------------


CREATED = datetime(2026, 8, 1, 10, 0, tzinfo=UTC)


def lines_of(store: SessionStore, session_id: str) -> list[bytes]:
    return store.path(session_id).read_bytes().splitlines(keepends=True)


# -- the Dockerfile ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Instruction:
    keyword: str
    arguments: str


def dockerfile() -> list[Instruction]:
    """The Dockerfile's instructions, continuation lines joined, comments dropped."""
    instructions, pending = [], ""
    for line in DOCKERFILE.read_text().splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        pending += line.rstrip("\\").strip() + " "
        if not line.endswith("\\"):
            keyword, _, arguments = pending.strip().partition(" ")
            instructions.append(Instruction(keyword.upper(), arguments.strip()))
            pending = ""
    return instructions


def exec_form(instruction: str) -> list[str]:
    """ENTRYPOINT, CMD or HEALTHCHECK in exec form (a JSON array): no shell in between."""
    found = [i.arguments for i in dockerfile() if i.keyword == instruction]
    assert len(found) == 1, f"one {instruction}"
    text = found[0]
    if instruction == "HEALTHCHECK":
        text = text[text.index("CMD ") + len("CMD ") :]
    argv: list[str] = json.loads(text)
    return argv


def base_images() -> set[str]:
    """The images the Dockerfile builds on: each FROM that names no stage of its own, its
    ``${ARG}`` read as that ARG's default (``docker build`` without ``--build-arg``)."""
    instructions = dockerfile()
    defaults = dict(
        i.arguments.partition("=")[::2]
        for i in instructions
        if i.keyword == "ARG" and "=" in i.arguments
    )
    stages = {i.arguments.split()[-1] for i in instructions if " AS " in i.arguments.upper()}
    named = {i.arguments.split()[0] for i in instructions if i.keyword == "FROM"} - stages
    return {re.sub(r"\$\{(\w+)\}", lambda m: defaults[m[1]], name) for name in named}


def healthcheck_url() -> str:
    code = exec_form("HEALTHCHECK")[-1]
    return code[code.index("'http://") + 1 : code.index("/healthz'") + len("/healthz")]


# -- the monitoring files ----------------------------------------------------------------------


_PROMQL_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and",
                 "or", "unless", "offset", "inf", "nan"}  # fmt: skip


def metric_names(expression: str) -> set[str]:
    """The metric names a PromQL expression selects (Grafana variables allowed)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expression)  # label values may look like names
    text = re.sub(r"\$\w+", "", text)
    text = re.sub(r"\{[^}]*\}|\[[^\]]*\]", "", text)  # matchers and ranges
    text = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", text)
    names = set()
    for match in re.finditer(r"(?<![\w.])[A-Za-z_:][\w:]*", text):  # not the m of 1m
        is_function = text[match.end() :].lstrip().startswith("(")
        if not is_function and match.group().lower() not in _PROMQL_WORDS:
            names.add(match.group())
    return names


def variable_expressions() -> Iterator[tuple[str, str]]:
    """(variable name, the selector of its ``label_values(selector, label)`` query)."""
    for variable in dashboard()["templating"]["list"]:
        match = re.fullmatch(r"label_values\((.*),\s*\w+\)", variable["query"]["query"])
        assert match, variable["name"]
        yield variable["name"], match.group(1)


def used_metrics() -> dict[str, set[str]]:
    """Metric name -> where it is used."""
    uses: dict[str, set[str]] = {}
    sources = [(f"rule {r['alert']}", r["expr"]) for r in rules()]
    sources += [(f"panel {t}", e) for t, e in panel_expressions()]
    sources += [(f"variable {n}", e) for n, e in variable_expressions()]
    for where, expression in sources:
        names = metric_names(expression)
        assert names, f"{where}: no metric in {expression!r}"
        for name in names:
            uses.setdefault(name, set()).add(where)
    return uses


# -- the metrics table -------------------------------------------------------------------------


OPERATIONS = Path(__file__).resolve().parents[2] / "docs" / "operations.md"
#: a row of the metrics table: name, labels, the HELP text
ROW = re.compile(r"^\| `(acp_router_\w+)` \| (.*?) \| (.*) \|$", re.MULTILINE)


def documented_metrics() -> dict[str, tuple[tuple[str, ...], str]]:
    """The metrics table of docs/operations.md: each name with its labels and its text
    (without the backticks Markdown may add)."""
    text = OPERATIONS.read_text()
    section = text[text.index("## Metrics") : text.index("## Deploying it")]
    rows: dict[str, tuple[tuple[str, ...], str]] = {}
    for name, labels, help_text in ROW.findall(section):
        assert name not in rows, f"{name} is in the table twice"
        names = tuple(re.findall(r"`(\w+)`", labels))
        rows[name] = (names, help_text.replace("`", "").replace("\\|", "|"))
    return rows
