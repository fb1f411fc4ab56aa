"""Test helpers shared by the agent and router suites: real processes, a raw ACP client.

* :func:`run_cli` starts ``python -m router ...`` as a real subprocess and waits for its
  first stdout line; :func:`start_agent` does that for a reference agent and parses
  its URL; :func:`run_cli_to_exit` runs a command that is expected to exit.
* :class:`AcpClient` is a deliberately dumb ACP client on the ``websockets`` library
  (not project code): it sends raw JSON text frames and hands back raw JSON objects.

Nothing here sleeps to wait: every wait is on a line, a queue or a future, bounded by
``asyncio.timeout``.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import os
import signal
import socket
import ssl
import sys
from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from router.commands.cli import build_parser

#: Bound on every single wait in a test (a reply, a line, a process start).
WAIT = 10.0

JsonObject = dict[str, Any]
RequestId = int | str


# -- processes ----------------------------------------------------------------------------------


class LogLines:
    """Lines of a stream, drained by an owned task so the child never blocks on a pipe."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.eof = False
        self._changed = asyncio.Condition()

    @property
    def text(self) -> str:
        return "".join(self.lines)

    async def drain(self, stream: asyncio.StreamReader) -> None:
        while line := await stream.readline():
            async with self._changed:
                self.lines.append(line.decode(errors="replace"))
                self._changed.notify_all()
        async with self._changed:
            self.eof = True
            self._changed.notify_all()

    async def wait_for(self, substring: str, timeout: float = WAIT, *, start: int = 0) -> str:
        """The first line from line ``start`` on containing ``substring``, waiting up to
        ``timeout`` seconds.

        Raises:
            AssertionError: the stream ended or the time ran out first.
        """

        def found() -> str | None:
            return next((line for line in self.lines[start:] if substring in line), None)

        try:
            async with asyncio.timeout(timeout), self._changed:
                await self._changed.wait_for(lambda: found() is not None or self.eof)
        except TimeoutError:
            raise AssertionError(
                f"no line with {substring!r} within {timeout}s; so far:\n{self.text}"
            ) from None
        line = found()
        if line is None:
            raise AssertionError(f"stream ended without {substring!r}; it said:\n{self.text}")
        return line


class CliProcess:
    """A running ``python -m router ...``; its stderr (and, once its first line is read,
    its stdout) are drained by owned tasks that :meth:`stop` waits for."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        assert process.stdout is not None
        assert process.stderr is not None
        self.process = process
        self.first_line = ""
        self.stdout = LogLines()
        self.stderr = LogLines()
        self._drains = [asyncio.create_task(self.stderr.drain(process.stderr))]

    async def read_first_line(self, timeout: float = WAIT) -> str:
        """The first stdout line (without its newline); then stdout is drained too.

        Raises:
            TimeoutError: no line within ``timeout``.
            EOFError: the process closed stdout (exited) without a line.
        """
        assert self.process.stdout is not None
        async with asyncio.timeout(timeout):
            line = await self.process.stdout.readline()
        if not line:
            raise EOFError("the process exited before printing a line")
        self.first_line = line.decode().rstrip("\n")
        self._drains.append(asyncio.create_task(self.stdout.drain(self.process.stdout)))
        return self.first_line

    async def wait_for_log(self, substring: str, timeout: float = WAIT, *, start: int = 0) -> str:
        """Wait for a stderr line (from line ``start`` on) containing ``substring``."""
        return await self.stderr.wait_for(substring, timeout, start=start)

    async def stop(self, timeout: float = WAIT) -> int:
        """SIGTERM, wait (SIGKILL after ``timeout``), finish draining; the exit status.

        Idempotent: a process that already exited just reports its status.
        """
        if self.process.returncode is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            async with asyncio.timeout(timeout):
                returncode = await self.process.wait()
        except TimeoutError:
            self.process.kill()
            returncode = await self.process.wait()
        await self._finish_draining(timeout)
        return returncode

    async def _finish_draining(self, timeout: float) -> None:
        try:
            async with asyncio.timeout(timeout):
                await asyncio.gather(*self._drains)
        except TimeoutError:
            for task in self._drains:
                task.cancel()
            await asyncio.gather(*self._drains, return_exceptions=True)


@contextmanager
def occupied_port() -> Iterator[int]:
    """A loopback port that is bound and listening for the duration of the block."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        yield taken.getsockname()[1]


def free_port(host: str = "127.0.0.1") -> int:
    """A port free on ``host`` now, for a process that must be told its port (Prometheus,
    a router restarted on the same port). It leaves a small race: another process may
    take the port first, and then the process started on it fails saying so."""
    with socket.socket() as probe:
        probe.bind((host, 0))
        port: int = probe.getsockname()[1]
        return port


def cli_command(*args: str) -> list[str]:
    """The argv that runs the project's CLI with this interpreter."""
    return [sys.executable, "-m", "router", *args]


def _child_env(more: Mapping[str, str] | None = None) -> dict[str, str]:
    return {**os.environ, "PYTHONUNBUFFERED": "1", **(more or {})}


@asynccontextmanager
async def run_cli(
    *args: str, ready_timeout: float = WAIT, env: Mapping[str, str] | None = None
) -> AsyncIterator[CliProcess]:
    """Run the CLI until it prints its first stdout line; stop it (SIGTERM) on exit;
    ``env``: variables set for it beside this process's.

    Raises:
        AssertionError: the process exited or stayed silent instead of starting.
    """
    process = await asyncio.create_subprocess_exec(
        *cli_command(*args),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=_child_env(env),
    )
    cli = CliProcess(process)
    try:
        try:
            await cli.read_first_line(ready_timeout)
        except (TimeoutError, EOFError):
            await cli.stop()
            command = " ".join(args)
            raise AssertionError(f"{command} did not start; stderr:\n{cli.stderr.text}") from None
        yield cli
    finally:
        await cli.stop()


@dataclass(frozen=True, slots=True)
class CompletedRun:
    returncode: int
    stdout: str
    stderr: str


async def run_cli_to_exit(
    *args: str,
    timeout: float = WAIT,
    stdin: bytes | None = None,
    env: Mapping[str, str] | None = None,
) -> CompletedRun:
    """Run the CLI to completion (a command expected to exit by itself), feeding it
    ``stdin`` when given (else /dev/null); ``env``: variables set for it beside ours."""
    return await run_to_exit(*cli_command(*args), timeout=timeout, stdin=stdin, env=_child_env(env))


async def run_to_exit(
    *argv: str,
    timeout: float = WAIT,
    stdin: bytes | None = None,
    env: Mapping[str, str] | None = None,
) -> CompletedRun:
    """Run a program to completion, its output captured, fed ``stdin`` when given (else
    /dev/null); ``env``: its whole environment (None: ours)."""
    process = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.DEVNULL if stdin is None else asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
    )
    try:
        async with asyncio.timeout(timeout):
            stdout, stderr = await process.communicate(stdin)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert process.returncode is not None
    return CompletedRun(process.returncode, stdout.decode(), stderr.decode())


@dataclass(frozen=True, slots=True)
class AgentProcess:
    """A reference agent subprocess; ``url`` is the one it announced."""

    url: str
    agent_id: str
    cli: CliProcess

    async def wait_for_log(self, substring: str, timeout: float = WAIT) -> str:
        return await self.cli.wait_for_log(substring, timeout)

    async def stop(self, timeout: float = WAIT) -> int:
        return await self.cli.stop(timeout)


@asynccontextmanager
async def start_agent(
    store: Path, agent_id: str, *extra_args: str, port: int = 0
) -> AsyncIterator[AgentProcess]:
    """Start ``acp-router agent`` on loopback ``port`` (0: a free one); terminate it on exit.

    ``extra_args`` go after the required ones, e.g. ``"--idle-timeout", "0.3"``.
    """
    listen = f"127.0.0.1:{port}"
    args = ("agent", "--listen", listen, "--store", str(store), "--id", agent_id)
    async with run_cli(*args, *extra_args) as cli:
        prefix = f"agent {agent_id} listening on "
        assert cli.first_line.startswith(prefix), cli.first_line
        yield AgentProcess(cli.first_line.removeprefix(prefix), agent_id, cli)


# -- a raw ACP client -------------------------------------------------------------------------


class AcpClient:
    """A raw JSON-RPC-over-WebSocket client: frames in, JSON objects out.

    Responses are matched to :meth:`request` calls by id; everything else the agent
    sends (notifications and agent->client requests) goes to :attr:`incoming`.
    """

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws
        self.incoming: asyncio.Queue[JsonObject] = asyncio.Queue()
        #: every text frame received, exactly as it arrived
        self.raw_frames: list[str] = []
        self._ids = itertools.count(1)
        self._awaited: dict[RequestId | None, asyncio.Future[JsonObject]] = {}
        self._reader: asyncio.Task[None] | None = None

    @classmethod
    @asynccontextmanager
    async def connect(
        cls,
        url: str,
        *,
        token: str | None = None,
        tls: ssl.SSLContext | None = None,
        source: str | None = None,
    ) -> AsyncIterator[AcpClient]:
        """Connect to ``url``, with ``Authorization: Bearer token`` when one is given, from
        the local address ``source`` when one is given (e.g. ``127.0.0.2``)."""
        headers = {"Authorization": f"Bearer {token}"} if token is not None else None
        local: dict[str, Any] = {"local_addr": (source, 0)} if source is not None else {}
        async with asyncio.timeout(WAIT):
            ws = await connect(url, max_size=None, additional_headers=headers, ssl=tls, **local)
        client = cls(ws)
        client._reader = asyncio.create_task(client._read())
        try:
            yield client
        finally:
            await client.close()

    async def close(self) -> None:
        await self.ws.close()
        if self._reader is not None:
            await self._reader  # it ends with the socket: nothing to cancel

    async def request(
        self,
        method: str,
        params: JsonObject | None = None,
        *,
        request_id: RequestId | None = None,
        timeout: float = WAIT,
    ) -> JsonObject:
        """Send a request and return the whole response object (``result`` or ``error``)."""
        message: JsonObject = {"jsonrpc": "2.0", "id": request_id, "method": method}
        if message["id"] is None:
            message["id"] = next(self._ids)
        if params is not None:
            message["params"] = params
        return await self.send_raw(json.dumps(message), expect_id=message["id"], timeout=timeout)

    async def send_raw(
        self, text: str, *, expect_id: RequestId | None, timeout: float = WAIT
    ) -> JsonObject:
        """Send any text frame and return the response carrying ``expect_id`` (may be None)."""
        assert expect_id not in self._awaited, f"id {expect_id!r} is already awaited"
        reply: asyncio.Future[JsonObject] = asyncio.get_running_loop().create_future()
        self._awaited[expect_id] = reply
        try:
            await self.ws.send(text)
            async with asyncio.timeout(timeout):
                return await reply
        finally:
            del self._awaited[expect_id]

    async def notify(self, method: str, params: JsonObject | None = None) -> None:
        message: JsonObject = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            message["params"] = params
        await self.ws.send(json.dumps(message))

    async def respond(self, request_id: RequestId, result: Any) -> None:
        """Answer an agent->client request."""
        await self.ws.send(json.dumps({"jsonrpc": "2.0", "id": request_id, "result": result}))

    async def respond_error(self, request_id: RequestId, code: int, message: str) -> None:
        """Answer an agent->client request with a JSON-RPC error."""
        error = {"code": code, "message": message}
        await self.ws.send(json.dumps({"jsonrpc": "2.0", "id": request_id, "error": error}))

    async def next_incoming(self, timeout: float = WAIT) -> JsonObject:
        """The next notification or agent->client request."""
        async with asyncio.timeout(timeout):
            return await self.incoming.get()

    def drain_incoming(self) -> list[JsonObject]:
        """Everything received and not yet taken, without waiting."""
        messages = []
        while not self.incoming.empty():
            messages.append(self.incoming.get_nowait())
        return messages

    # -- ACP conveniences ----------------------------------------------------------------

    async def initialize(self) -> JsonObject:
        return await self.request("initialize", {"protocolVersion": 1, "clientCapabilities": {}})

    async def new_session(self, cwd: str = "/work/project") -> str:
        response = await self.request("session/new", {"cwd": cwd, "mcpServers": []})
        assert "result" in response, response
        session_id: str = response["result"]["sessionId"]
        return session_id

    async def prompt(self, session_id: str, text: str, *, timeout: float = WAIT) -> JsonObject:
        return await self.request(
            "session/prompt",
            {"sessionId": session_id, "prompt": [{"type": "text", "text": text}]},
            timeout=timeout,
        )

    async def status(self, session_id: str) -> JsonObject:
        return await self.request("session/status", {"sessionId": session_id})

    async def _read(self) -> None:
        try:
            async for frame in self.ws:
                assert isinstance(frame, str), "ACP frames are text"
                self.raw_frames.append(frame)
                self._dispatch(json.loads(frame))
        except ConnectionClosed:
            pass
        finally:
            for reply in self._awaited.values():
                if not reply.done():
                    reply.set_exception(ConnectionError("the connection closed before a reply"))

    def _dispatch(self, message: JsonObject) -> None:
        if "method" in message:
            self.incoming.put_nowait(message)
            return
        reply = self._awaited.get(message.get("id"))
        if reply is not None and not reply.done():
            reply.set_result(message)
        else:
            self.incoming.put_nowait(message)  # a stray response: let the test see it


def text_chunks(messages: list[JsonObject]) -> list[tuple[str, str]]:
    """``(sessionUpdate kind, text)`` of each text chunk notification in ``messages``."""
    chunks = []
    for message in messages:
        if message.get("method") != "session/update":
            continue
        update = message["params"]["update"]
        content = update.get("content", {})
        if content.get("type") == "text":
            chunks.append((update["sessionUpdate"], content["text"]))
    return chunks


# -- conversations with the reference agent ---------------------------------------------

CWD = "/work/project"


def chunk_texts(messages: list[JsonObject], session_id: str) -> list[str]:
    return [
        m["params"]["update"]["content"]["text"]
        for m in messages
        if m.get("method") == "session/update"
        and m["params"]["sessionId"] == session_id
        and m["params"]["update"].get("sessionUpdate") == "agent_message_chunk"
    ]


def speaker(text: str) -> str:
    """The agent id an echo chunk names: ``[agent-2] hello`` -> ``agent-2``."""
    assert text.startswith("["), text
    return text[1 : text.index("]")]


async def answered_by(client: AcpClient, session_id: str, text: str = "hello") -> str:
    """Prompt ``session_id`` and return the id of the agent that answered."""
    client.drain_incoming()
    response = await client.prompt(session_id, text)
    assert response.get("result") == {"stopReason": "end_turn"}, response
    texts = chunk_texts(client.drain_incoming(), session_id)
    assert texts, "the prompt produced no chunk"
    assert len({speaker(t) for t in texts}) == 1
    return speaker(texts[0])


async def resume(client: AcpClient, session_id: str) -> JsonObject:
    return await client.request("session/resume", {"sessionId": session_id, "cwd": CWD})


async def direct_statuses(agents_urls: dict[str, str], session_id: str) -> dict[str, str]:
    """Ask every agent directly (not through the router) for the session's status."""
    statuses: dict[str, str] = {}
    for agent_id, url in agents_urls.items():
        async with AcpClient.connect(url) as direct:
            answer = await direct.status(session_id)
            statuses[agent_id] = answer["result"]["status"] if "result" in answer else "unknown"
    return statuses


class LogWaiter(logging.Handler):
    """Sets :attr:`seen` when a record's message contains ``text``."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text
        self.seen = asyncio.Event()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if self.text in message:
            self.messages.append(message)
            self.seen.set()


@contextmanager
def watching(text: str) -> Iterator[LogWaiter]:
    waiter = LogWaiter(text)
    root = logging.getLogger("router")
    level = root.level
    root.addHandler(waiter)
    root.setLevel(logging.INFO)  # the control link says why it failed at INFO
    try:
        yield waiter
    finally:
        root.removeHandler(waiter)
        root.setLevel(level)


def parses(argv: list[str]) -> bool:
    """Whether ``acp-router`` accepts ``argv`` (its real argument parser, types included)."""
    try:
        build_parser().parse_args(argv)
    except SystemExit:
        return False
    return True
