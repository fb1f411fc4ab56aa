"""The docs stay usable: the curl walk-through of docs/transport.md runs as written against
``acp-router demo`` (tests/server/test_docs.py: the README and the links)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import shlex
import shutil
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Protocol

import aiohttp

from tests.support import WAIT, CliProcess, JsonObject, run_cli
from tests.topology import REPO

CURL = shutil.which("curl")
DOCUMENTED_FRONT = "127.0.0.1:8765"


@dataclass(frozen=True, slots=True)
class Step:
    """One ``curl`` command of the walk-through, as written."""

    argv: tuple[str, ...]

    @property
    def streams(self) -> bool:
        return "-sN" in self.argv

    @property
    def body(self) -> JsonObject:
        body: JsonObject = json.loads(self.argv[self.argv.index("-d") + 1])
        return body

    def filled(self, front: str, connection: str, session: str) -> list[str]:
        """The command for a router at ``front``, with the ids put where it says ``…``."""
        return [
            part.replace(DOCUMENTED_FRONT, front)
            .replace("sess_…", session)
            .replace("…", connection)
            for part in self.argv
        ]


def walkthrough() -> list[Step]:
    """The commands of the ``sh`` block under "By hand with curl", lines joined."""
    text = (REPO / "docs" / "transport.md").read_text()
    section = text[text.index("### By hand with curl") :]
    start = section.index("```sh\n") + len("```sh\n")
    block = section[start : section.index("\n```", start)]
    commands = re.sub(r"\\\n\s*", "", block).splitlines()
    return [Step(tuple(shlex.split(c))) for c in commands if c and not c.startswith("#")]


@dataclass(frozen=True, slots=True)
class Answered:
    """What ``curl -si`` printed: the status, the headers and the body."""

    status: int
    headers: dict[str, str]
    body: str

    @classmethod
    def of(cls, output: str) -> Answered:
        head, _, body = output.partition("\r\n\r\n")
        status_line, *header_lines = head.split("\r\n")
        headers = {}
        for line in header_lines:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        return cls(int(status_line.split()[1]), headers, body)


class Stream:
    """A ``curl -sN`` event stream running: its events as they come."""

    def __init__(self, lines: asyncio.Queue[str | None]) -> None:
        self._lines = lines

    async def message(self) -> JsonObject:
        """The next event's JSON-RPC message (comments skipped)."""
        data: list[str] = []
        async with asyncio.timeout(WAIT):
            while True:
                line = await self._lines.get()
                assert line is not None, "the event stream ended"
                if line.startswith("data:"):
                    data.append(line.removeprefix("data:").strip())
                elif not line.strip() and data:
                    message: JsonObject = json.loads("\n".join(data))
                    return message

    async def ended(self) -> None:
        async with asyncio.timeout(WAIT):
            while await self._lines.get() is not None:
                pass


async def _run(argv: list[str]) -> Answered:
    """One request, the way the docs say: with curl, or, where there is none, the same
    HTTP request with aiohttp."""
    if CURL is not None:
        process = await asyncio.create_subprocess_exec(
            CURL, *argv[1:], stdout=asyncio.subprocess.PIPE
        )
        async with asyncio.timeout(WAIT):
            output, _ = await process.communicate()
        assert process.returncode == 0, argv
        return Answered.of(output.decode())
    method, url, headers, data = _request(argv)
    async with aiohttp.ClientSession() as http, asyncio.timeout(WAIT):
        async with http.request(method, url, headers=headers, data=data) as response:
            body = await response.text()
            return Answered(
                response.status, {k.lower(): v for k, v in response.headers.items()}, body
            )


class Lines(Protocol):
    async def readline(self) -> bytes: ...


@contextlib.asynccontextmanager
async def _streaming(argv: list[str]) -> AsyncIterator[Stream]:
    """An event stream the way the docs open it, its lines queued as they come; the
    block ends once it has ended."""
    lines: asyncio.Queue[str | None] = asyncio.Queue()

    async def pump(output: Lines) -> None:
        while line := await output.readline():
            lines.put_nowait(line.decode())
        lines.put_nowait(None)

    async with _stream_output(argv) as output:
        reader = asyncio.create_task(pump(output))
        try:
            yield Stream(lines)
            async with asyncio.timeout(WAIT):
                await reader
        finally:
            reader.cancel()


@contextlib.asynccontextmanager
async def _stream_output(argv: list[str]) -> AsyncIterator[Lines]:
    """What the stream's command prints: curl's output, or, where there is no curl, the
    body of the same request made with aiohttp."""
    if CURL is None:
        method, url, headers, _ = _request(argv)
        async with aiohttp.ClientSession() as http:
            async with http.request(method, url, headers=headers) as response:
                assert response.status == 200
                yield response.content
        return
    process = await asyncio.create_subprocess_exec(CURL, *argv[1:], stdout=asyncio.subprocess.PIPE)
    assert process.stdout is not None
    try:
        yield process.stdout
        async with asyncio.timeout(WAIT):
            assert await process.wait() == 0
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


def _request(argv: list[str]) -> tuple[str, str, dict[str, str], str | None]:
    """What a curl command line asks: method, URL, headers, body."""
    headers, data, method, url = {}, None, None, ""
    parts = iter(argv[1:])
    for part in parts:
        if part == "-H":
            name, _, value = next(parts).partition(":")
            headers[name.strip()] = value.strip()
        elif part == "-d":
            data = next(parts)
        elif part == "-X":
            method = next(parts)
        elif not part.startswith("-"):
            url = part
    return method or ("POST" if data is not None else "GET"), url, headers, data


async def _demo_front(demo: CliProcess) -> str:
    match = re.search(r"behind ws://(\S+)/acp", demo.first_line)
    assert match is not None, demo.first_line
    await demo.wait_for_log("backend agent-1 is up")
    return match.group(1)


async def test_the_curl_walkthrough_runs_as_written_against_the_demo() -> None:
    steps = walkthrough()
    kinds = [
        s.body["method"] if "-d" in s.argv else ("stream" if s.streams else "end") for s in steps
    ]
    assert kinds == [
        "initialize", "stream", "session/new", "stream", "session/prompt", "end",
    ]  # fmt: skip
    async with run_cli("demo", "--port", "0", "--agents", "1") as demo:
        front = await _demo_front(demo)

        def filled(step: Step, connection: str = "", session: str = "") -> list[str]:
            return step.filled(front, connection, session)

        initialize = await _run(filled(steps[0]))
        assert initialize.status == 200
        assert json.loads(initialize.body)["result"]["protocolVersion"] == 1
        connection = initialize.headers["acp-connection-id"]
        async with _streaming(filled(steps[1], connection)) as connection_stream:
            assert (await _run(filled(steps[2], connection))).status == 202
            created = await connection_stream.message()
            assert created["id"] == 1, created
            session = created["result"]["sessionId"]
            async with _streaming(filled(steps[3], connection, session)) as session_stream:
                assert (await _run(filled(steps[4], connection, session))).status == 202
                update = await session_stream.message()
                assert update["params"]["update"]["content"]["text"] == "[agent-1] hello"
                answer = await session_stream.message()
                assert answer == {"jsonrpc": "2.0", "id": 2, "result": {"stopReason": "end_turn"}}
                assert (await _run(filled(steps[5], connection))).status == 202
                await session_stream.ended()
            await connection_stream.ended()
