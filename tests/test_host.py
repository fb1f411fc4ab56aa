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
import sys
from pathlib import Path

import aiohttp

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
            assert (await first.status(session_id))["result"] == {"status": "active"}

        async with AcpClient.connect(host.url) as second:
            await second.initialize()
            # still in memory with nobody attached
            assert (await second.status(session_id))["result"] == {"status": "active"}
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
            assert (await second.status(session_id))["result"] == {"status": "inactive"}

            unknown = await second.status("sess_nobody")
            assert unknown["error"]["code"] == -32002
            assert unknown["error"]["data"] == {"sessionId": "sess_nobody"}
            missing = await second.request("session/status", {})
            assert missing["error"]["code"] == -32602


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
