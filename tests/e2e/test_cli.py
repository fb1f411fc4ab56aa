"""The ``acp-router`` command line as real subprocesses: ``serve``, ``status`` and ``demo``.

(``agent``'s own start-up failures, a port in use included, are in ``test_agent.py``.)
"""

from __future__ import annotations

import asyncio
import json
import platform
import re
import signal
import textwrap
import tomllib
from pathlib import Path
from urllib.parse import urlsplit

import aiohttp
import pytest

from router.server.config import settings_from
from tests.e2e.support import wait_backends_up, write_config
from tests.fleet import backends_of, start_fleet, start_router
from tests.support import (
    CWD,
    WAIT,
    AcpClient,
    CliProcess,
    CompletedRun,
    occupied_port,
    parses,
    run_cli,
    run_cli_to_exit,
    text_chunks,
)

BACKEND = '[[backends]]\nid = "agent-1"\nurl = "ws://127.0.0.1:9001/acp"\n'


def one_line_failure(run: CompletedRun) -> str:
    """The single stderr line of a command that failed to start."""
    assert run.returncode != 0, run
    assert run.stdout == ""
    assert "Traceback" not in run.stderr, run.stderr
    (line,) = run.stderr.splitlines()
    return line


async def prompted_by(client: AcpClient, session_id: str) -> str:
    """Prompt ``session_id`` over ``client``; the id of the agent that answered."""
    client.drain_incoming()
    response = await client.prompt(session_id, "hello")
    assert response.get("result") == {"stopReason": "end_turn"}, response
    (chunk,) = text_chunks(client.drain_incoming())
    kind, text = chunk
    match = re.fullmatch(r"\[(agent-\d+)\] hello", text)
    assert kind == "agent_message_chunk"
    assert match is not None, text
    return match.group(1)


async def refuses_connections(url: str) -> bool:
    parts = urlsplit(url)
    assert parts.hostname is not None
    assert parts.port is not None
    try:
        async with asyncio.timeout(WAIT):
            _, writer = await asyncio.open_connection(parts.hostname, parts.port)
    except ConnectionRefusedError:
        return True
    writer.close()
    await writer.wait_closed()
    return False


# -- serve: failing to start -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "names"),
    [
        pytest.param(
            f'[router]\nlisen = "127.0.0.1:0"\n{BACKEND}',
            "router: unknown key 'lisen' (did you mean 'listen'?)",
            id="unknown-key",
        ),
        pytest.param(
            '[[backends]]\nid = "agent-1"\nurl = "http://127.0.0.1:9001/acp"\n',
            "backends (the 1st [[backends]] table): 'url' must be a ws:// or wss:// URL",
            id="bad-backend-url",
        ),
        pytest.param('[router]\nlisten = "127.0.0.1:0"\n', "backends", id="no-backends"),
        pytest.param(
            '[router]\nlisen = "127.0.0.1:0"\n[[backend]]\nid = "agent-1"\n'
            '[probe]\ntimeout_ms = "500"\n',
            "3 problems: router: unknown key 'lisen' (did you mean 'listen'?); probe:"
            " 'timeout_ms' must be an integer, not the string \"500\"; unknown table"
            " [[backend]] (did you mean [[backends]]?)",
            id="three-mistakes",
        ),
        pytest.param(f'[router\nlisten = "127.0.0.1:0"\n{BACKEND}', "TOML", id="invalid-toml"),
    ],
)
async def test_serve_with_a_bad_config_fails_with_one_line(
    tmp_path: Path, text: str, names: str
) -> None:
    config = tmp_path / "router.toml"
    config.write_text(text)
    line = one_line_failure(await run_cli_to_exit("serve", "--config", str(config)))
    assert str(config) in line
    assert names in line


async def test_serve_with_a_missing_config_fails_with_one_line(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere.toml"
    line = one_line_failure(await run_cli_to_exit("serve", "--config", str(missing)))
    assert str(missing) in line
    assert "No such file" in line


async def test_serve_on_a_port_in_use_fails_with_one_line(tmp_path: Path) -> None:
    with occupied_port() as port:
        config = tmp_path / "router.toml"
        config.write_text(f'[router]\nlisten = "127.0.0.1:{port}"\n{BACKEND}')
        line = one_line_failure(await run_cli_to_exit("serve", "--config", str(config)))
    assert "address already in use" in line.lower()


# -- serve and status --------------------------------------------------------------------------


async def test_serve_routes_and_status_answers(tmp_path: Path) -> None:
    async with start_fleet(tmp_path / "store", 2) as agents:
        config = write_config(tmp_path / "router.toml", agents)
        async with run_cli("serve", "--config", str(config)) as serve:
            match = re.fullmatch(
                r"acp-router listening on (ws://127\.0\.0\.1:(\d+)/acp)", serve.first_line
            )
            assert match is not None, serve.first_line
            assert int(match.group(2)) != 0
            router_url = match.group(1)
            await wait_backends_up(serve, agents)

            async with AcpClient.connect(router_url) as client:
                await client.initialize()
                session_id = await client.new_session(CWD)
                owner = await prompted_by(client, session_id)
                by_id = {agent.agent_id: agent for agent in agents}
                (other,) = (agent for agent in agents if agent.agent_id != owner)

                # the router over both profiles of the transport, the agent over WebSocket
                http_url = router_url.replace("ws://", "http://")
                for url in (router_url, http_url, by_id[owner].url):
                    run = await run_cli_to_exit("status", url, session_id)
                    assert (run.returncode, run.stdout) == (0, f"{session_id}: active\n"), run
                # the other instance shares the store: it knows the session, not active there
                run = await run_cli_to_exit("status", other.url, session_id)
                assert (run.returncode, run.stdout) == (3, f"{session_id}: inactive\n"), run

                for url in (router_url, http_url, other.url):
                    run = await run_cli_to_exit("status", url, "sess_nobody")
                    assert (run.returncode, run.stdout) == (4, "sess_nobody: unknown\n"), run
                # each Streamable HTTP question ended its connection with a DELETE
                metrics = (await fetch(http_url.replace("/acp", "/metrics")))[1]
                deleted = 'acp_router_http_connections_ended_total{reason="deleted"} 2.0'
                assert deleted in metrics.splitlines(), metrics

                # an agent serves WebSocket only: over HTTP, one line says so
                run = await run_cli_to_exit("status", other.url.replace("ws://", "http://"), "s")
                assert run.returncode == 2, run
                assert run.stderr.startswith("acp-router: cannot ask http://"), run.stderr
                assert "Traceback" not in run.stderr, run.stderr

            assert await serve.stop() == 0
        assert "Traceback" not in serve.stderr.text, serve.stderr.text


@pytest.mark.parametrize("setting", ["", 'event_loop = "uvloop"', 'event_loop = "asyncio"'])
async def test_serve_routes_on_the_loop_it_names(tmp_path: Path, setting: str) -> None:
    """uvloop by default (it is installed with the package); the start line names the
    loop and the Python."""
    loop = "asyncio" if "asyncio" in setting else "uvloop"
    async with start_fleet(tmp_path / "store", 1) as agents:
        router = f'listen = "127.0.0.1:0"\n{setting}'
        config = write_config(tmp_path / "router.toml", agents, router)
        async with run_cli("serve", "--config", str(config)) as serve:
            match = re.fullmatch(r"acp-router listening on (ws://\S+/acp)", serve.first_line)
            assert match is not None, serve.first_line
            await serve.wait_for_log(f"event loop: {loop}, Python {platform.python_version()}")
            metrics_url = match.group(1).replace("ws://", "http://").replace("/acp", "/metrics")
            metrics = (await fetch(metrics_url))[1]
            assert f'acp_router_event_loop_info{{loop="{loop}"}} 1.0' in metrics.splitlines()
            await wait_backends_up(serve, agents)
            async with AcpClient.connect(match.group(1)) as client:
                await client.initialize()
                session_id = await client.new_session(CWD)
                assert await prompted_by(client, session_id) == agents[0].agent_id
            assert await serve.stop() == 0
        assert "Traceback" not in serve.stderr.text, serve.stderr.text


# -- demo --------------------------------------------------------------------------------------


async def status_page_of(demo: CliProcess) -> tuple[str, str]:
    """The status page's address and admin token, from the demo's banner."""
    line = await demo.stdout.wait_for("status page")
    match = re.fullmatch(r"\s+status page\s+(http://\S+/admin/)#token=(\S+)\s*", line)
    assert match is not None, line
    return match.group(1), match.group(2)


async def fetch(url: str, token: str | None = None) -> tuple[int, str]:
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    async with aiohttp.ClientSession() as http, asyncio.timeout(WAIT):
        async with http.get(url, headers=headers) as response:
            return response.status, await response.text()


@pytest.mark.parametrize("given", [None, "adm-7d1c93e0b2"])
async def test_the_demo_serves_its_status_page_under_the_token_it_prints(given: str | None) -> None:
    options = () if given is None else ("--admin-token", given)
    async with run_cli("demo", "--port", "0", "--agents", "1", *options) as demo:
        page, token = await status_page_of(demo)
        assert token == (given or token)
        assert len(token) >= 14
        await demo.wait_for_log("backend agent-1 is up")
        status, html = await fetch(page)
        assert status == 200  # the page itself holds no data: it loads without a token
        assert "<html" in html.lower()
        assert (await fetch(f"{page}backends"))[0] == 401
        status, body = await fetch(f"{page}backends", token)
        assert status == 200, body
        assert [b["id"] for b in json.loads(body)["backends"]] == ["agent-1"]


async def test_demo_serves_and_stops_cleanly_on_ctrl_c() -> None:
    async with run_cli("demo", "--port", "0", "--agents", "2") as demo:
        match = re.fullmatch(
            r"acp-router demo: 2 reference agents behind (ws://127\.0\.0\.1:\d+/acp)",
            demo.first_line,
        )
        assert match is not None, demo.first_line
        front = match.group(1)
        await demo.stdout.wait_for("Press Ctrl-C to stop.")
        banner = demo.stdout.text
        agent_urls = dict(re.findall(r"^\s+(agent-\d+)\s+(ws://\S+)$", banner, re.MULTILINE))
        assert sorted(agent_urls) == ["agent-1", "agent-2"], banner
        store_line = re.search(r"^\s+session store\s+(\S+)$", banner, re.MULTILINE)
        assert store_line is not None, banner
        store = Path(store_line.group(1))
        assert await asyncio.to_thread(store.is_dir)
        for agent_id in agent_urls:
            await demo.wait_for_log(f"backend {agent_id} is up")
        # the demo runs on the loop a router gets by default (uvloop: installed with it)
        await demo.wait_for_log(f"event loop: uvloop, Python {platform.python_version()}")

        async with AcpClient.connect(front) as client:
            await client.initialize()
            session_id = await client.new_session(CWD)
            assert await prompted_by(client, session_id) in agent_urls

            demo.process.send_signal(signal.SIGINT)
            async with asyncio.timeout(WAIT):
                returncode = await demo.process.wait()
                await client.ws.wait_closed()
            assert client.ws.close_code == 1012  # "service restart": reconnect and resume
        assert returncode == 0
        assert await demo.stop() == 0  # already exited: finishes reading its output
    assert "Traceback" not in demo.stderr.text, demo.stderr.text
    for url in (front, *agent_urls.values()):
        assert await refuses_connections(url), f"{url} still accepts connections"
    assert not await asyncio.to_thread(store.exists), "the temporary session store is removed"


async def test_connect_to_nothing_fails_after_reconnect_for() -> None:
    with occupied_port() as port:  # listening, but not a WebSocket server
        url = f"ws://127.0.0.1:{port}/acp"
    run = await run_cli_to_exit("connect", url, "--reconnect-for", "0.3")
    assert (run.returncode, run.stdout) == (2, "")
    assert "Traceback" not in run.stderr, run.stderr
    retrying, failure = run.stderr.splitlines()
    assert f"cannot reach {url} yet" in retrying, retrying
    assert "retrying for up to 0.3 s" in retrying, retrying
    assert failure.startswith(f"acp-router: cannot connect to {url} within 0.3 s: "), failure


async def test_connect_to_a_url_that_is_not_a_websocket_fails_at_once() -> None:
    run = await run_cli_to_exit("connect", "http://127.0.0.1:1/acp")
    assert "cannot connect to http://127.0.0.1:1/acp: " in one_line_failure(run)


async def test_connect_bridges_stdin_lines_to_the_router_and_back(tmp_path: Path) -> None:
    async with start_fleet(tmp_path, 1) as agents, start_router(backends_of(agents)) as router:
        lines = [
            {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {"protocolVersion": 1}},
            {
                "jsonrpc": "2.0",
                "id": "n",
                "method": "session/new",
                "params": {"cwd": "/w", "mcpServers": []},
            },
            {
                "jsonrpc": "2.0",
                "id": 2,
                "method": "session/status",
                "params": {"sessionId": "nope"},
            },
        ]
        stdin = "".join(json.dumps(line) + "\n" for line in lines) + "\n{broken\n"
        run = await run_cli_to_exit("connect", router.url, stdin=stdin.encode())
    assert run.returncode == 0, run.stderr
    answers = [json.loads(line) for line in run.stdout.splitlines()]
    by_id = {answer["id"]: answer for answer in answers}
    assert set(by_id) == {0, "n", 2, None}  # stdin ended, yet every answer came through
    assert by_id[0]["result"]["protocolVersion"] == 1
    assert by_id["n"]["result"]["sessionId"].startswith("sess_")
    assert by_id[2]["error"]["code"] == -32002
    assert by_id[None]["error"]["code"] == -32700


async def test_connect_pipes_a_resume_and_a_prompt_as_a_script_would(tmp_path: Path) -> None:
    """The lines go out back to back: the prompt must wait for the resume (on main it got
    -32010), and a prompt behind a resume that failed gets a truthful -32010."""
    async with start_fleet(tmp_path, 2) as agents, start_router(backends_of(agents)) as router:
        async with AcpClient.connect(router.url) as creator:
            await creator.initialize()
            session_id = await creator.new_session("/w")

        def call(request_id: int, method: str, **params: object) -> dict[str, object]:
            return {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}

        hello = [{"type": "text", "text": "hello"}]
        lines = [
            call(0, "initialize", protocolVersion=1),
            call(1, "session/resume", sessionId=session_id, cwd="/w"),
            call(2, "session/prompt", sessionId=session_id, prompt=hello),
            call(3, "session/resume", sessionId="sess_nobody", cwd="/w"),
            call(4, "session/prompt", sessionId="sess_nobody", prompt=hello),
        ]
        stdin = "".join(json.dumps(line) + "\n" for line in lines)
        run = await run_cli_to_exit("connect", router.url, stdin=stdin.encode())
    assert run.returncode == 0, run.stderr
    frames = [json.loads(line) for line in run.stdout.splitlines()]
    answers = {frame["id"]: frame for frame in frames if "id" in frame and "method" not in frame}
    assert answers[1]["result"] == {}
    assert answers[2]["result"] == {"stopReason": "end_turn"}, answers[2]
    chunks = [f["params"]["update"]["content"]["text"] for f in frames if "method" in f]
    assert len(chunks) == 1
    assert re.fullmatch(r"\[agent-[12]\] hello", chunks[0]), chunks
    assert answers[3]["error"]["code"] == -32002
    assert answers[4]["error"]["code"] == -32010
    assert answers[4]["error"]["data"]["sessionId"] == "sess_nobody"


# -- help ------------------------------------------------------------------------------------------

COMMANDS = ("agent", "host", "demo", "serve", "connect", "status")


@pytest.mark.parametrize("command", COMMANDS)
async def test_every_command_has_a_description_and_an_example(command: str) -> None:
    run = await run_cli_to_exit(command, "--help")
    assert run.returncode == 0, run.stderr
    usage, description, *rest = run.stdout.split("\n\n")
    assert usage.startswith(f"usage: acp-router {command} ")
    assert len(description.split()) >= 20, description  # a paragraph, not a title
    [example] = [part for part in rest if part.startswith("example")]
    commands = [line.strip() for line in example.splitlines()[1:]]
    assert commands
    assert all(re.match(rf"acp-router( --\S+ \S+)* {command}( |$)", c) for c in commands), commands
    for line in commands:  # each example is a command line the real parser accepts
        assert parses(line.split()[1:]), line


async def test_serve_help_says_what_the_router_serves_and_shows_a_config() -> None:
    run = await run_cli_to_exit("serve", "--help")
    for words in ("/acp", "/metrics", "SIGHUP", "config/router.example.toml", "[[backends]]"):
        assert words in run.stdout, words
    minimal = run.stdout[run.stdout.index("a minimal FILE:") :].split("\n", 1)[1]
    settings = settings_from(tomllib.loads(textwrap.dedent(minimal)))
    assert [b.id for b in settings.backends] == ["agent-1"]


async def test_connect_help_says_when_it_retries_and_how_it_exits() -> None:
    """What the bridge does that an editor's user must know (tests/e2e/test_connect.py runs it)."""
    text = " ".join((await run_cli_to_exit("connect", "--help")).stdout.split())
    for words in (
        "When the router is not up yet, or goes away, it keeps trying to reach it",
        "for --reconnect-for seconds, holding what the editor writes",
        "(-32010, after the agent holding it restarted, say) is held: the bridge resumes (or"
        " loads) the session again and sends the request once more",
        "2 when it was never reached",
        "at the start and each time it goes away, then exit (2 at the start, 1 later)",
    ):
        assert words in text, words


async def test_the_command_list_points_at_each_command_help() -> None:
    run = await run_cli_to_exit("--help")
    assert run.returncode == 0
    assert "acp-router COMMAND --help" in run.stdout
    for command in COMMANDS:
        assert re.search(rf"^    {command} +\S", run.stdout, re.MULTILINE), command
