"""``acp-router connect`` across router restarts: the bridge as a real subprocess, an
editor played on its stdin/stdout, and behind it either the real router (``serve``, a
real subprocess, restarted on the same port) or a scripted WebSocket "router" in this
process that shows every frame the bridge sends.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from http import HTTPStatus
from pathlib import Path
from typing import Any

import websockets
from websockets.asyncio.server import Server, ServerConnection
from websockets.http11 import Request as HttpRequest, Response as HttpResponse

from tests.fleet import start_fleet
from tests.support import (
    CWD,
    WAIT,
    CliProcess,
    LogLines,
    cli_command,
    occupied_port,
    run_cli,
    run_cli_to_exit,
    start_agent,
)

JsonObject = dict[str, Any]


# -- the editor's side: the bridge process -----------------------------------------------------


class BridgeProcess:
    """``acp-router connect URL`` with an editor's pipes: lines in, JSON objects out."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        assert process.stdin is not None
        assert process.stdout is not None
        assert process.stderr is not None
        self.process = process
        self.stdin = process.stdin
        #: every line the bridge wrote, parsed, in order
        self.seen: list[JsonObject] = []
        self.stderr = LogLines()
        self._changed = asyncio.Condition()
        self._drains = [
            asyncio.create_task(self._read(process.stdout)),
            asyncio.create_task(self.stderr.drain(process.stderr)),
        ]

    async def send(self, message: JsonObject) -> None:
        self.stdin.write(json.dumps(message).encode() + b"\n")
        await self.stdin.drain()

    async def call(self, request_id: Any, method: str, params: JsonObject) -> JsonObject:
        await self.send({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params})
        return await self.answer(request_id)

    async def answer(self, request_id: Any) -> JsonObject:
        """The bridge's answer to the editor's request ``request_id``."""
        return await self.first(lambda m: m.get("id") == request_id and "method" not in m)

    async def first(self, matches: Callable[[JsonObject], bool]) -> JsonObject:
        def found() -> JsonObject | None:
            return next((m for m in self.seen if matches(m)), None)

        async with asyncio.timeout(WAIT), self._changed:
            await self._changed.wait_for(lambda: found() is not None)
        message = found()
        assert message is not None
        return message

    def answers_to(self, request_id: Any) -> list[JsonObject]:
        return [m for m in self.seen if m.get("id") == request_id and "method" not in m]

    async def exit_status(self, *, close_stdin: bool = False) -> int:
        if close_stdin:
            self.stdin.close()
        async with asyncio.timeout(WAIT):
            status = await self.process.wait()
            await asyncio.gather(*self._drains)
        return status

    async def _read(self, stdout: asyncio.StreamReader) -> None:
        while line := await stdout.readline():
            async with self._changed:
                self.seen.append(json.loads(line))
                self._changed.notify_all()


@asynccontextmanager
async def bridge(url: str, *args: str) -> AsyncIterator[BridgeProcess]:
    process = await asyncio.create_subprocess_exec(
        *cli_command("connect", url, *args),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    running = BridgeProcess(process)
    try:
        yield running
    finally:
        if process.returncode is None:
            process.kill()
            await running.exit_status()


def call(request_id: Any, method: str, **params: Any) -> JsonObject:
    return {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}


INIT = {"protocolVersion": 1, "clientCapabilities": {}}


def assert_retryable_loss(answer: JsonObject) -> None:
    error = answer["error"]
    assert error["code"] == -32013, answer
    assert error["data"]["retryable"] is True
    assert "router connection was lost" in error["data"]["reason"]


# -- a scripted router ------------------------------------------------------------------------------


Script = Callable[["FakeRouter", ServerConnection, JsonObject], Awaitable[None]]


async def answer_ok(router: FakeRouter, ws: ServerConnection, message: JsonObject) -> None:
    """Answer every request with ``{}`` (initialize with resume and load)."""
    if "id" not in message or "method" not in message:
        return
    result: JsonObject = {}
    if message["method"] == "initialize":
        result = {
            "protocolVersion": 1,
            "agentCapabilities": {"loadSession": True, "sessionCapabilities": {"resume": {}}},
        }
    await ws.send(json.dumps({"jsonrpc": "2.0", "id": message["id"], "result": result}))


@dataclass
class FakeRouter:
    """A WebSocket server that records every frame, per connection, and runs ``script``
    on each; :meth:`restart` closes every connection with 1012 and stops listening,
    :meth:`listen_again` listens on the same port."""

    script: Script = answer_ok
    #: frames received, per connection, in order
    connections: list[list[JsonObject]] = field(default_factory=list)
    #: the HTTP status to refuse upgrades with (None: accept)
    refuse_with: HTTPStatus | None = None
    port: int = 0
    servers: list[Server] = field(default_factory=list)
    _changed: asyncio.Condition = field(default_factory=asyncio.Condition)

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/acp"

    async def listen_again(self) -> None:
        server = await websockets.serve(
            self._serve, "127.0.0.1", self.port, process_request=self._process_request
        )
        self.servers.append(server)
        self.port = server.sockets[0].getsockname()[1]

    def restart(self) -> None:
        """Stop listening now; close every connection with 1012 (service restart)."""
        server = self.servers[-1]
        server.server.close()
        server.close(code=1012, reason="router shutting down")

    async def received(self, count: int) -> list[JsonObject]:
        """The frames of connection ``count`` (from 1), once there are any."""
        async with asyncio.timeout(WAIT), self._changed:
            await self._changed.wait_for(
                lambda: len(self.connections) >= count and bool(self.connections[count - 1])
            )
        return self.connections[count - 1]

    def _process_request(self, ws: ServerConnection, request: HttpRequest) -> HttpResponse | None:
        if self.refuse_with is None:
            return None
        return ws.respond(self.refuse_with, "no\n")

    async def _serve(self, ws: ServerConnection) -> None:
        frames: list[JsonObject] = []
        self.connections.append(frames)
        try:
            async for text in ws:
                message = json.loads(text)
                async with self._changed:
                    frames.append(message)
                    self._changed.notify_all()
                await self.script(self, ws, message)
        except websockets.ConnectionClosed:
            pass


@asynccontextmanager
async def fake_router(router: FakeRouter) -> AsyncIterator[FakeRouter]:
    await router.listen_again()
    try:
        yield router
    finally:
        for server in router.servers:
            server.close()
            await server.wait_closed()


# -- the real router, restarted ---------------------------------------------------------------


def router_config(path: Path, listen: str, agents: list[Any]) -> Path:
    backends = "".join(f'[[backends]]\nid = "{a.agent_id}"\nurl = "{a.url}"\n' for a in agents)
    path.write_text(f'[router]\nlisten = "{listen}"\n{backends}')
    return path


@asynccontextmanager
async def serving(tmp_path: Path, agents: list[Any]) -> AsyncIterator[tuple[CliProcess, str]]:
    """``serve`` in front of ``agents`` on a free port, once every backend is up; its URL."""
    config = router_config(tmp_path / "router.toml", "127.0.0.1:0", agents)
    async with run_cli("serve", "--config", str(config)) as router:
        for agent in agents:
            await router.wait_for_log(f"backend {agent.agent_id} is up")
        yield router, router.first_line.removeprefix("acp-router listening on ")


async def test_the_bridge_rides_through_a_router_restart(tmp_path: Path) -> None:
    async with start_fleet(tmp_path / "store", 2) as agents:
        async with serving(tmp_path, agents) as (first, url):
            async with bridge(url) as editor:
                await editor.call(0, "initialize", INIT)
                params = {"cwd": CWD, "mcpServers": []}
                session_id = (await editor.call(1, "session/new", params))["result"]["sessionId"]
                other = (await editor.call(2, "session/new", params))["result"]["sessionId"]
                # a turn in flight on the other session when the router goes
                slow = [{"type": "text", "text": "/slow 30"}]
                await editor.send(call(3, "session/prompt", sessionId=other, prompt=slow))
                await editor.first(lambda m: m.get("method") == "session/update")
                assert await first.stop() == 0

                # the router itself answers what was in flight before its 1012; the bridge
                # passes that one answer on (and would make one if the router had not)
                stopped = await editor.answer(3)
                assert stopped["error"]["code"] == -32013, stopped
                assert stopped["error"]["data"]["reason"] == "the router is stopping"
                assert len(editor.answers_to(3)) == 1
                restarted = router_config(tmp_path / "again.toml", url.split("/")[2], agents)
                async with run_cli("serve", "--config", str(restarted)) as second:
                    assert second.first_line == first.first_line  # the same port
                    hello = [{"type": "text", "text": "again"}]
                    prompt = {"sessionId": session_id, "prompt": hello}
                    answer = await editor.call(4, "session/prompt", prompt)
                    assert answer.get("result") == {"stopReason": "end_turn"}, answer
                    said = [
                        m["params"]["update"]["content"]["text"]
                        for m in editor.seen
                        if m.get("method") == "session/update"
                        and m["params"]["sessionId"] == session_id
                    ]
                    assert len(said) == 1
                    assert re.fullmatch(r"\[agent-[12]\] again", said[0]), said
                    assert editor.process.returncode is None  # the editor saw no exit
                    # every request answered exactly once; the replay's answers stayed
                    for request_id in range(5):
                        assert len(editor.answers_to(request_id)) == 1, request_id
                    assert all("method" in m or m.get("id") in range(5) for m in editor.seen), (
                        editor.seen
                    )
                    assert await editor.exit_status(close_stdin=True) == 0
                assert "Traceback" not in editor.stderr.text, editor.stderr.text


def said(editor: BridgeProcess, session_id: str) -> list[str]:
    """The text of every chunk the editor saw for ``session_id``, in order."""
    return [
        m["params"]["update"]["content"]["text"]
        for m in editor.seen
        if m.get("method") == "session/update" and m["params"]["sessionId"] == session_id
    ]


async def test_the_bridge_waits_for_a_router_that_is_not_up_yet(tmp_path: Path) -> None:
    """An editor started during a router restart (on main: exit 2 within 0.2 s)."""
    with occupied_port() as port:
        url = f"ws://127.0.0.1:{port}/acp"  # nothing listens there once this block ends
    async with start_fleet(tmp_path / "store", 1) as agents, bridge(url) as editor:
        await editor.send(call(0, "initialize", **INIT))  # held until the router is up
        await editor.stderr.wait_for(f"cannot reach {url} yet")
        assert "retrying for up to 60 s" in editor.stderr.text, editor.stderr.text
        config = router_config(tmp_path / "router.toml", f"127.0.0.1:{port}", agents)
        async with run_cli("serve", "--config", str(config)) as router:
            assert (await editor.answer(0))["result"]["protocolVersion"] == 1
            await router.wait_for_log("backend agent-1 is up")
            params = {"cwd": CWD, "mcpServers": []}
            session_id = (await editor.call(1, "session/new", params))["result"]["sessionId"]
            hello = {"sessionId": session_id, "prompt": [{"type": "text", "text": "hello"}]}
            answer = await editor.call(2, "session/prompt", hello)
            assert answer.get("result") == {"stopReason": "end_turn"}, answer
            assert said(editor, session_id) == ["[agent-1] hello"]
            assert await editor.exit_status(close_stdin=True) == 0
    assert "Traceback" not in editor.stderr.text, editor.stderr.text


async def test_an_agent_restart_does_not_leave_the_editor_stuck(tmp_path: Path) -> None:
    """kill -9 of the agent under an editor's session, then the agent back on its port and
    store, default router settings (failover off): on main every prompt got -32010 ("send
    session/resume first"), which editors never do in the middle of a thread."""
    store = tmp_path / "store"
    async with start_fleet(store, 2) as agents:
        async with serving(tmp_path, agents) as (router, url):
            async with bridge(url) as editor:
                await editor.call(0, "initialize", INIT)
                params = {"cwd": CWD, "mcpServers": []}
                session_id = (await editor.call(1, "session/new", params))["result"]["sessionId"]
                one = {"sessionId": session_id, "prompt": [{"type": "text", "text": "one"}]}
                assert "result" in await editor.call(2, "session/prompt", one)
                (first,) = said(editor, session_id)
                holder = next(a for a in agents if first == f"[{a.agent_id}] one")

                logged = len(router.stderr.lines)
                holder.cli.process.kill()
                await holder.stop()
                port = int(holder.url.rsplit(":", 1)[1].split("/")[0])
                async with start_agent(store, holder.agent_id, port=port) as again:
                    assert again.url == holder.url
                    await router.wait_for_log(f"backend {holder.agent_id} is up", start=logged)
                    two = {"sessionId": session_id, "prompt": [{"type": "text", "text": "two"}]}
                    answer = await editor.call(3, "session/prompt", two)
                    assert answer.get("result") == {"stopReason": "end_turn"}, answer
                    assert re.fullmatch(r"\[agent-[12]\] two", said(editor, session_id)[-1])
                    errors = [m["error"] for m in editor.seen if "error" in m]
                    assert errors == [], errors
                    for request_id in range(4):
                        assert len(editor.answers_to(request_id)) == 1, request_id
                    assert await editor.exit_status(close_stdin=True) == 0
    assert "Traceback" not in editor.stderr.text, editor.stderr.text


# -- the scripted router -------------------------------------------------------------------------


def update(session_id: str, text: str) -> str:
    chunk = {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": text}}
    params = {"sessionId": session_id, "update": chunk}
    return json.dumps({"jsonrpc": "2.0", "method": "session/update", "params": params})


async def replaying(router: FakeRouter, ws: ServerConnection, message: JsonObject) -> None:
    """New sessions are ``s-ID``; a load sends history first (for the session loaded, and
    an update for ``s-1``); a close asks the client a question (id 77) first; request 5
    restarts the router."""
    method, params, request_id = message.get("method"), message.get("params", {}), message.get("id")
    if request_id == 5:
        router.restart()
        return
    if method == "session/new":
        created = {"sessionId": f"s-{request_id}"}
        await ws.send(json.dumps({"jsonrpc": "2.0", "id": request_id, "result": created}))
        return
    if method == "session/load":
        await ws.send(update(params["sessionId"], "history"))
        await ws.send(update("s-1", "news"))
    if method == "session/close":
        await ws.send(json.dumps(call(77, "session/request_permission", sessionId="s-1")))
    await answer_ok(router, ws, message)


async def test_the_replay_is_the_editors_own_and_stays_with_the_bridge() -> None:
    async with fake_router(FakeRouter(replaying)) as router, bridge(router.url) as editor:
        await editor.call(0, "initialize", INIT)
        await editor.call("a", "authenticate", {"methodId": "token"})
        await editor.call(1, "session/new", {"cwd": CWD, "mcpServers": []})
        await editor.call(2, "session/load", {"sessionId": "s-old", "cwd": CWD, "mcpServers": []})
        await editor.call(3, "session/new", {"cwd": CWD, "mcpServers": []})
        await editor.call(4, "session/close", {"sessionId": "s-3"})  # closed: forgotten
        await editor.first(lambda m: m.get("id") == 77 and "method" in m)
        seen_before = len(editor.seen)

        await editor.send(call(5, "session/prompt", sessionId="s-1", prompt=[]))
        assert_retryable_loss(await editor.answer(5))
        # meanwhile the editor answers the old connection's question (dropped: its id
        # meant something there only) and asks something new (sent after the replay)
        await editor.send({"jsonrpc": "2.0", "id": 77, "result": {"outcome": "late"}})
        await editor.send(call(6, "session/prompt", sessionId="s-1", prompt=[]))
        await router.listen_again()
        assert "result" in await editor.answer(6)

        first, replayed = router.connections
        assert [m.get("method") for m in replayed] == [
            "initialize",
            "authenticate",
            "session/resume",
            "session/load",
            "session/prompt",
        ], replayed
        ids = [m["id"] for m in replayed[:4]]
        assert all(isinstance(i, str) and i.startswith("acp-bridge:") for i in ids), ids
        assert len(set(ids)) == 4
        assert replayed[0]["params"] == first[0]["params"]  # the editor's own initialize
        assert replayed[1]["params"] == {"methodId": "token"}
        assert replayed[2]["params"] == {"sessionId": "s-1", "cwd": CWD, "mcpServers": []}
        assert replayed[3]["params"] == {"sessionId": "s-old", "cwd": CWD, "mcpServers": []}
        assert replayed[4]["id"] == 6
        # the editor saw none of the replay's answers, nor the history loaded again
        after = editor.seen[seen_before:]
        assert [m.get("id") for m in after if "method" not in m] == [5, 6]
        assert [m["params"]["sessionId"] for m in after if "method" in m] == ["s-1"]
        assert len(editor.answers_to(5)) == 1
        assert editor.process.returncode is None
        assert await editor.exit_status(close_stdin=True) == 0


async def test_the_bridge_gives_up_after_reconnect_for_with_one_line() -> None:
    async with (
        fake_router(FakeRouter()) as router,
        bridge(router.url, "--reconnect-for", "1") as editor,
    ):
        await editor.call(0, "initialize", INIT)
        router.restart()  # and nothing listens again
        assert await editor.exit_status() == 1
    (line,) = editor.stderr.lines
    assert f"cannot reconnect to {router.url} within 1 s" in line, line
    assert "Fatal Python error" not in editor.stderr.text


async def test_stdin_closing_ends_the_bridge_while_the_router_is_gone() -> None:
    async def silent(router: FakeRouter, ws: ServerConnection, message: JsonObject) -> None:
        if message.get("method") == "initialize":
            await answer_ok(router, ws, message)
        elif message.get("id") == 2:
            router.restart()  # 1 is in flight

    async with fake_router(FakeRouter(silent)) as router, bridge(router.url) as editor:
        await editor.call(0, "initialize", INIT)
        await editor.send(call(1, "session/prompt", sessionId="s", prompt=[]))
        await editor.send(call(2, "session/prompt", sessionId="s", prompt=[]))
        assert_retryable_loss(await editor.answer(1))
        assert_retryable_loss(await editor.answer(2))
        await editor.send(call(3, "session/prompt", sessionId="s", prompt=[]))  # held
        assert await editor.exit_status(close_stdin=True) == 0
    assert [len(editor.answers_to(n)) for n in (1, 2, 3)] == [1, 1, 1]
    assert_retryable_loss(editor.answers_to(3)[0])
    assert "Traceback" not in editor.stderr.text, editor.stderr.text


async def test_a_close_while_answers_drain_ends_the_bridge_without_reconnecting() -> None:
    async def close_on_last(router: FakeRouter, ws: ServerConnection, message: JsonObject) -> None:
        if message.get("method") == "initialize":
            await answer_ok(router, ws, message)
        elif message.get("method") == "test/last":
            await ws.close(1012, "router shutting down")  # the bridge is draining by now

    async with fake_router(FakeRouter(close_on_last)) as router, bridge(router.url) as editor:
        await editor.call(0, "initialize", INIT)
        await editor.send(call(1, "session/prompt", sessionId="s", prompt=[]))  # never answered
        await editor.send({"jsonrpc": "2.0", "method": "test/last"})
        assert await editor.exit_status(close_stdin=True) == 0
    assert len(router.connections) == 1  # no reconnect
    (lost,) = editor.answers_to(1)
    assert_retryable_loss(lost)


async def test_a_401_names_the_token_variable() -> None:
    async with fake_router(FakeRouter(refuse_with=HTTPStatus.UNAUTHORIZED)) as router:
        for command in (("connect", router.url), ("status", router.url, "sess_1")):
            run = await run_cli_to_exit(*command)
            assert run.returncode == 2, run
            (line,) = run.stderr.splitlines()
            assert "401" in line, line
            assert "set ACP_ROUTER_TOKEN to a token the router accepts" in line, line


async def test_a_401_for_a_token_sent_says_it_was_not_accepted() -> None:
    async with fake_router(FakeRouter(refuse_with=HTTPStatus.UNAUTHORIZED)) as router:
        for command in (("connect", router.url), ("status", router.url, "sess_1")):
            run = await run_cli_to_exit(*command, env={"ACP_ROUTER_TOKEN": "wrong"})
            assert run.returncode == 2, run
            (line,) = run.stderr.splitlines()
            assert "the router does not accept the token in ACP_ROUTER_TOKEN" in line, line


async def test_a_401_on_reconnect_is_not_retried() -> None:
    async with fake_router(FakeRouter()) as router, bridge(router.url) as editor:
        await editor.call(0, "initialize", INIT)
        router.restart()
        router.refuse_with = HTTPStatus.UNAUTHORIZED
        await router.listen_again()
        assert await editor.exit_status() == 1  # well before --reconnect-for (60 s)
    (line,) = editor.stderr.lines
    assert "ACP_ROUTER_TOKEN" in line, line


async def test_an_editor_that_closes_the_bridges_stdout_ends_it_quietly() -> None:
    async with fake_router(FakeRouter()) as router:
        read_end, write_end = os.pipe()
        process = await asyncio.create_subprocess_exec(
            *cli_command("connect", router.url),
            stdin=asyncio.subprocess.PIPE,
            stdout=write_end,
            stderr=asyncio.subprocess.PIPE,
        )
        os.close(write_end)
        os.close(read_end)  # nothing reads what the bridge writes
        assert process.stdin is not None
        assert process.stderr is not None
        process.stdin.write(json.dumps(call(0, "initialize", **INIT)).encode() + b"\n")
        async with asyncio.timeout(WAIT):  # stdin stays open: the answer ends the bridge
            stderr = await process.stderr.read()
            assert await process.wait() == 0
        process.stdin.close()
    assert stderr == b"", stderr
