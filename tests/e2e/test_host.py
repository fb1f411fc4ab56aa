"""``acp-router host`` in front of a real stdio agent built on the official Python SDK.

The host runs as a real subprocess (``python -m router host -- python -m
tests.agents.sdk_echo_agent``); clients are raw WebSocket clients, so every frame the
host makes is seen as it is.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
from websockets.asyncio.client import ClientConnection, connect

from tests.agents.rough_agent import REASON
from tests.hosted import SDK_AGENT, pid_of, start_host
from tests.support import WAIT, AcpClient, run_cli_to_exit, text_chunks


async def prompted(client: AcpClient, session_id: str, text: str) -> int:
    """Prompt; the pid of the agent process that echoed."""
    response = await client.prompt(session_id, text)
    assert response.get("result") == {"stopReason": "end_turn"}, response
    chunks = text_chunks(client.drain_incoming())
    assert len(chunks) == 1, chunks
    kind, said = chunks[0]
    assert kind == "agent_message_chunk"
    assert said.endswith(f"] {text}")
    return pid_of(said)


async def test_a_session_outlives_its_client_on_the_one_agent_process() -> None:
    async with start_host("h1", *SDK_AGENT) as host:
        async with AcpClient.connect(host.url) as first:
            init = (await first.initialize())["result"]
            caps = init["agentCapabilities"]
            assert caps["sessionCapabilities"] == {"resume": {}, "close": {}, "status": {}}
            assert caps["loadSession"] is True
            assert init["agentInfo"]["name"] == "sdk-echo-agent"
            session_id = await first.new_session()
            pid = await prompted(first, session_id, "hello")
            assert (await first.status(session_id))["result"]["status"] == "active"

        async with AcpClient.connect(host.url) as second:
            await second.initialize()
            # still in memory with nobody attached
            assert (await second.status(session_id))["result"]["status"] == "active"
            resumed = await second.request(
                "session/resume", {"sessionId": session_id, "cwd": "/work/project"}
            )
            assert resumed == {"jsonrpc": "2.0", "id": resumed["id"], "result": {}}
            assert await prompted(second, session_id, "again") == pid

            # a load replays the history to the client loading, before its answer
            async with AcpClient.connect(host.url) as third:
                await third.initialize()
                load = {"sessionId": session_id, "cwd": "/work/project", "mcpServers": []}
                loaded = await third.request("session/load", load)
                assert loaded.get("result") == {}, loaded
                replayed = [json.loads(frame) for frame in third.raw_frames[1:]]
                assert [m.get("method") for m in replayed] == ["session/update"] * 2 + [None]
                assert [said for _, said in text_chunks(replayed)] == [
                    f"[pid {pid}] hello",
                    f"[pid {pid}] again",
                ]
                assert second.drain_incoming() == []  # nothing leaked to the other client

            closed = await second.request("session/close", {"sessionId": session_id})
            assert closed.get("result") == {}, closed
            # the agent advertises loadSession: a closed session may be restored
            assert (await second.status(session_id))["result"]["status"] == "inactive"

            unknown = await second.status("sess_nobody")
            assert unknown["error"]["code"] == -32002
            assert unknown["error"]["data"] == {"sessionId": "sess_nobody"}
            missing = await second.request("session/status", {})
            assert missing["error"]["code"] == -32602


async def test_resume_needs_the_agent_to_offer_it_and_load_does_without() -> None:
    # what docs/agents.md says of a stdio agent without session/resume
    async with start_host("h1", *SDK_AGENT, "--no-resume") as host:
        async with AcpClient.connect(host.url) as first:
            caps = (await first.initialize())["result"]["agentCapabilities"]
            assert "resume" not in caps["sessionCapabilities"]
            assert caps["loadSession"] is True
            session_id = await first.new_session()
            pid = await prompted(first, session_id, "hello")
        async with AcpClient.connect(host.url) as second:
            await second.initialize()
            resume = {"sessionId": session_id, "cwd": "/work/project"}
            refused = await second.request("session/resume", resume)
            assert refused["error"]["code"] == -32601, refused
            loaded = await second.request("session/load", {**resume, "mcpServers": []})
            assert loaded.get("result") == {}, loaded
            assert [said for _, said in text_chunks(second.drain_incoming())] == [
                f"[pid {pid}] hello"
            ]
            assert await prompted(second, session_id, "again") == pid


async def test_clients_with_the_same_ids_get_their_own_answers() -> None:
    async with start_host("h1", *SDK_AGENT) as host:
        async with AcpClient.connect(host.url) as one, AcpClient.connect(host.url) as two:
            await one.initialize()
            await two.initialize()
            # both clients use request id 7 at the same time
            params = {"cwd": "/work/project", "mcpServers": []}
            a, b = await asyncio.gather(
                one.request("session/new", params, request_id=7),
                two.request("session/new", params, request_id=7),
            )
            assert a["id"] == b["id"] == 7
            sid_a, sid_b = a["result"]["sessionId"], b["result"]["sessionId"]
            assert sid_a != sid_b

            # the agent asks the owner of the session, and only it
            prompt = asyncio.create_task(one.prompt(sid_a, "/permission"))
            ask = await one.next_incoming()
            assert ask["method"] == "session/request_permission"
            assert ask["params"]["sessionId"] == sid_a
            await one.respond(ask["id"], {"outcome": {"outcome": "selected", "optionId": "allow"}})
            assert (await prompt)["result"] == {"stopReason": "end_turn"}
            assert text_chunks(one.drain_incoming())[0][1].endswith("permission: allow")
            assert two.drain_incoming() == []

            # before initialize, nothing is forwarded
            async with AcpClient.connect(host.url) as early:
                refused = await early.request("session/new", params)
                assert refused["error"]["code"] == -32600


async def test_when_the_agent_dies_its_sessions_are_gone_and_it_comes_back() -> None:
    async with start_host("h1", *SDK_AGENT) as host:
        async with AcpClient.connect(host.url) as client:
            await client.initialize()
            session_id = await client.new_session()
            pid = await prompted(client, session_id, "hello")
            os.kill(pid, signal.SIGKILL)
            await host.cli.wait_for_log(f"agent process {pid} exited")
            # the host disconnects its clients: their sessions died with the agent
            async with asyncio.timeout(WAIT):
                await client.ws.wait_closed()
            assert client.ws.close_code == 1012

        await host.cli.wait_for_log("is up", timeout=WAIT)
        async with AcpClient.connect(host.url) as client:
            await client.initialize()
            gone = await client.status(session_id)
            assert gone["error"]["code"] == -32002
            fresh = await client.new_session()
            assert await prompted(client, fresh, "again") != pid


async def test_the_host_refuses_what_is_not_json_rpc() -> None:
    async with start_host("h1", *SDK_AGENT) as host:
        async with AcpClient.connect(host.url) as client:
            bad = await client.send_raw("{not json", expect_id=None)
            assert bad["error"]["code"] == -32700
            batch = await client.send_raw("[]", expect_id=None)
            assert batch["error"]["code"] == -32600
            assert "result" in await client.initialize()  # still connected and served


async def test_an_agent_command_that_cannot_start_fails_the_host_with_one_line() -> None:
    missing = await run_cli_to_exit("host", "--listen", "127.0.0.1:0", "--", "no-such-agent-cmd")
    assert missing.returncode == 2
    assert (
        missing.stderr.strip().splitlines()[-1].startswith("acp-router: cannot run no-such-agent")
    )
    dies = await run_cli_to_exit("host", "--listen", "127.0.0.1:0", "--", sys.executable, "-c", "0")
    assert dies.returncode == 2
    assert "the agent exited during initialize" in dies.stderr


ROUGH = (sys.executable, "-m", "tests.agents.rough_agent")


async def test_an_agent_that_fails_to_initialize_fails_the_host() -> None:
    refused = await run_cli_to_exit("host", "--listen", "127.0.0.1:0", "--", *ROUGH, "refuse")
    assert refused.returncode == 2
    assert "the agent did not initialize" in refused.stderr
    silent = await run_cli_to_exit(
        "host", "--listen", "127.0.0.1:0", "--startup-timeout", "0.5", "--", *ROUGH, "silent"
    )
    assert silent.returncode == 2
    assert "did not answer initialize within 0.5 s" in silent.stderr


async def test_a_noisy_stubborn_agent_is_skipped_over_and_killed_on_stop() -> None:
    async with start_host("h1", *ROUGH, "noisy") as host:
        await host.cli.wait_for_log("is not JSON-RPC")
        async with AcpClient.connect(host.url) as client:
            assert (await client.initialize())["result"]["agentCapabilities"] == {
                "sessionCapabilities": {"status": {}}
            }
        # the agent ignores the end of its stdin and SIGTERM: stopping the host kills it
        assert await host.cli.stop(timeout=WAIT) == 0


async def test_an_agent_that_cannot_come_back_leaves_the_host_up_but_not_ready(
    tmp_path: Path,
) -> None:
    async with start_host("h1", *ROUGH, "once", str(tmp_path / "started")) as host:
        base = host.url.removesuffix("/acp").replace("ws://", "http://")
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{base}/readyz") as ready:
                assert ready.status == 200
            async with http.get(f"{base}/acp") as plain:
                assert plain.status == 426
            started = await host.cli.wait_for_log("agent process ")
            pid = int(started.split("agent process ")[1].split()[0])
            os.kill(pid, signal.SIGKILL)
            await host.cli.wait_for_log("restarting the agent failed")
            async with http.get(f"{base}/readyz") as ready:
                assert ready.status == 503
            async with http.get(f"{base}/healthz") as health:
                assert health.status == 200


async def test_client_capabilities_must_be_a_json_object() -> None:
    for bad in ("[1]", "{nope"):
        run = await run_cli_to_exit(
            "host", "--listen", "127.0.0.1:0", "--client-capabilities", bad, "--", "agent"
        )
        assert run.returncode == 2
        assert "expected a JSON object" in run.stderr


# -- stopping, restarts, slow clients, the agent's own words -------------------------------------


def gone(pid: int) -> bool:
    """Whether process ``pid`` has ended (a zombie nobody reaped yet counts as ended)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


async def test_stopping_the_host_stops_the_agents_whole_process_group() -> None:
    async with start_host("h1", *ROUGH, "family") as host:
        started = await host.cli.wait_for_log("agent process ")
        agent_pid = int(started.split("agent process ")[1].split()[0])
        grandchild = int((await host.cli.wait_for_log("grandchild ")).split()[-1])
        assert not gone(grandchild)
        async with AcpClient.connect(host.url) as client:
            await client.initialize()
            # a turn in flight: the agent never answers it
            in_flight = asyncio.create_task(client.new_session())
            # the agent and its child both ignore SIGTERM, and the child holds the pipes
            assert await host.cli.stop(timeout=WAIT) == 0  # not SIGKILLed by the test
            async with asyncio.timeout(WAIT):
                await client.ws.wait_closed()
            assert client.ws.close_code == 1001
            in_flight.cancel()
            await asyncio.gather(in_flight, return_exceptions=True)
    assert gone(agent_pid)
    assert gone(grandchild), "the agent's child was left running"


async def test_each_agent_process_has_its_own_instance_id() -> None:
    async with start_host("h1", *SDK_AGENT) as host:
        async with AcpClient.connect(host.url) as client:
            first = (await client.initialize())["result"]["_meta"]["instanceId"]
            async with AcpClient.connect(host.url) as other:  # the same process
                assert (await other.initialize())["result"]["_meta"]["instanceId"] == first
            session_id = await client.new_session()
            pid = await prompted(client, session_id, "hello")
            os.kill(pid, signal.SIGKILL)
            await host.cli.wait_for_log("is up", start=len(host.cli.stderr.lines))
        async with AcpClient.connect(host.url) as client:
            second = (await client.initialize())["result"]["_meta"]["instanceId"]
    assert isinstance(first, str)
    assert isinstance(second, str)
    assert len(first) >= 16
    assert second != first


async def test_the_agents_own_words_reach_the_client_when_it_refuses_or_dies() -> None:
    async with start_host("h1", *ROUGH, "refuse-sessions") as host:
        async with AcpClient.connect(host.url) as client:
            init = (await client.initialize())["result"]
            assert init["_meta"]["agent"] == "rough"  # the agent's _meta is kept
            assert isinstance(init["_meta"]["instanceId"], str)
            refused = await client.request("session/new", {"cwd": "/w", "mcpServers": []})
            assert refused["error"]["message"] == "Query closed before response received"
            assert refused["error"]["data"] == {
                "agentStderr": f"starting the model client\n{REASON}"
            }
            # its stderr still flows to the host's
            await host.cli.wait_for_log(REASON)

            # an agent that dies owing an answer: its last words go with the -32013
            prompt = {"sessionId": "sess_1", "prompt": []}
            lost = await client.request("session/prompt", prompt)
            assert lost["error"]["code"] == -32013
            assert lost["error"]["data"]["retryable"] is True
            assert lost["error"]["data"]["agentStderr"].endswith("fatal: the model client crashed")


async def test_a_client_that_stops_reading_delays_no_other_client() -> None:
    async with start_host("h1", *SDK_AGENT) as host:
        async with AcpClient.connect(host.url) as other:
            await other.initialize()
            baseline = await timed_new_session(other)
            async with stalled_client(host.url) as (stalled, session_id):
                # a reply far larger than the socket buffers: the host cannot send it all
                await stalled.send(prompt_frame(session_id, ["/flood 6000000"]))
                await host.cli.wait_for_log("flooded")  # the agent wrote it all
                took = await timed_new_session(other)
                assert took < baseline + 0.1, (took, baseline)
                assert (await other.status(session_id))["result"]["status"] == "active"


async def test_a_client_whose_outbox_overflows_is_closed_and_its_sessions_let_go() -> None:
    async with start_host("h1", *SDK_AGENT) as host:
        async with stalled_client(host.url) as (stalled, session_id):
            # the large reply blocks the writer; 4100 more frames overflow the outbox
            blocks = ["/flood 6000000", *("y" * 4100)]
            await stalled.send(prompt_frame(session_id, blocks))
            await host.cli.wait_for_log("does not read fast enough")
            stalled.transport.resume_reading()
            async with asyncio.timeout(WAIT):
                await stalled.wait_closed()
        async with AcpClient.connect(host.url) as other:
            await other.initialize()
            # owned by nobody now, still in memory: another client resumes it
            resumed = await other.request("session/resume", {"sessionId": session_id, "cwd": "/w"})
            assert resumed.get("result") == {}, resumed


async def timed_new_session(client: AcpClient) -> float:
    loop = asyncio.get_running_loop()
    start = loop.time()
    await client.new_session()
    return loop.time() - start


def prompt_frame(session_id: str, texts: list[str]) -> str:
    blocks = [{"type": "text", "text": text} for text in texts]
    params = {"sessionId": session_id, "prompt": blocks}
    return json.dumps({"jsonrpc": "2.0", "id": 99, "method": "session/prompt", "params": params})


@asynccontextmanager
async def stalled_client(url: str) -> AsyncIterator[tuple[ClientConnection, str]]:
    """A client with a session that, from then on, reads nothing (a small receive
    buffer, and its transport paused)."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
    async with asyncio.timeout(WAIT):
        ws = await connect(url, sock=sock, max_size=None, compression=None)

    async def call(request_id: int, method: str, params: dict[str, Any]) -> dict[str, Any]:
        request = {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}
        await ws.send(json.dumps(request))
        async with asyncio.timeout(WAIT):
            answer: dict[str, Any] = json.loads(await ws.recv())
        return answer

    try:
        await call(0, "initialize", {"protocolVersion": 1})
        created = await call(1, "session/new", {"cwd": "/w", "mcpServers": []})
        session_id: str = created["result"]["sessionId"]
        ws.transport.pause_reading()
        yield ws, session_id
    finally:
        ws.transport.abort()
