"""The reference agent end to end: a real agent subprocess, real WebSocket clients."""

from __future__ import annotations

import asyncio
import json
import re
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from router import __version__
from router.protocol.acp import EPOCH_META_KEY as EPOCH
from tests.support import (
    CWD,
    WAIT,
    AcpClient,
    AgentProcess,
    JsonObject,
    occupied_port,
    run_cli_to_exit,
    start_agent,
    text_chunks,
)

AGENT_ID = "agent-a"
RESUME_FIRST = "is not loaded on this connection: call session/resume first"


@pytest.fixture
def store(tmp_path: Path) -> Path:
    return tmp_path / "store"


@pytest.fixture
async def agent(store: Path) -> AsyncIterator[AgentProcess]:
    async with start_agent(store, AGENT_ID) as agent:
        yield agent


@pytest.fixture
async def client(agent: AgentProcess) -> AsyncIterator[AcpClient]:
    async with AcpClient.connect(agent.url) as client:
        yield client


def result_of(response: JsonObject) -> Any:
    assert "result" in response, response
    return response["result"]


def answered_active(response: JsonObject) -> bool:
    """An ``active`` status answer, which also says when the session last did anything
    (``_meta.lastActivity``, milliseconds since the epoch)."""
    result = result_of(response)
    last = result.get("_meta", {}).get("lastActivity")
    assert isinstance(last, int), result
    assert last > 0, result
    return bool(result.get("status") == "active" and set(result) == {"status", "_meta"})


def error_of(response: JsonObject) -> JsonObject:
    assert "error" in response, response
    error: JsonObject = response["error"]
    return error


def not_found(session_id: str) -> JsonObject:
    return {"code": -32002, "message": "Resource not found", "data": {"sessionId": session_id}}


async def next_chunk(client: AcpClient) -> tuple[str, str]:
    message = await client.next_incoming()
    chunks = text_chunks([message])
    assert chunks, message
    return chunks[0]


async def next_request(client: AcpClient, method: str) -> JsonObject:
    message = await client.next_incoming()
    assert message.get("method") == method, message
    assert "id" in message, message
    return message


def store_snapshot(store: Path) -> dict[str, tuple[bytes, int]]:
    """Every file in the store: its bytes and mtime."""
    return {path.name: (path.read_bytes(), path.stat().st_mtime_ns) for path in store.iterdir()}


def load_params(session_id: str) -> JsonObject:
    return {"sessionId": session_id, "cwd": "/work/project", "mcpServers": []}


# -- initialize, new, prompt ----------------------------------------------------------------


async def test_initialize_advertises_the_capabilities(client: AcpClient) -> None:
    response = await client.request("initialize", {"protocolVersion": 7}, request_id=0)
    assert response["id"] == 0
    result = result_of(response)
    instance = result.pop("_meta")["instanceId"]
    assert isinstance(instance, str)
    assert len(instance) == 32
    again = await client.request("initialize", {"protocolVersion": 1})
    assert result_of(again)["_meta"] == {"instanceId": instance}, "one nonce per process"
    assert result == {
        "protocolVersion": 1,
        "agentCapabilities": {
            "loadSession": True,
            "promptCapabilities": {"image": False, "audio": False, "embeddedContext": False},
            "sessionCapabilities": {"list": {}, "resume": {}, "close": {}, "status": {}},
        },
        "agentInfo": {
            "name": "acp-router-reference-agent",
            "title": "acp-router reference agent",
            "version": __version__,
        },
        "authMethods": [],
    }


async def test_string_ids_are_echoed(client: AcpClient) -> None:
    response = await client.request("initialize", {"protocolVersion": 1}, request_id="init-1")
    assert response["id"] == "init-1"
    assert result_of(response)["protocolVersion"] == 1


async def test_prompt_echoes_each_text_block_naming_the_instance(client: AcpClient) -> None:
    session_id = await client.new_session()
    assert re.fullmatch(r"sess_[0-9a-f]{32}", session_id)

    response = await client.request(
        "session/prompt",
        {
            "sessionId": session_id,
            "prompt": [
                {"type": "text", "text": "hello"},
                {"type": "resource_link", "uri": "file:///x", "name": "x"},
                {"type": "text", "text": "world"},
            ],
        },
    )

    assert result_of(response) == {"stopReason": "end_turn"}
    updates = client.drain_incoming()  # they came before the response, on the same socket
    assert updates[0] == {
        "jsonrpc": "2.0",
        "method": "session/update",
        "params": {
            "sessionId": session_id,
            "update": {
                "sessionUpdate": "agent_message_chunk",
                "content": {"type": "text", "text": f"[{AGENT_ID}] hello"},
            },
        },
    }
    assert text_chunks(updates) == [
        ("agent_message_chunk", f"[{AGENT_ID}] hello"),
        ("agent_message_chunk", f"[{AGENT_ID}] world"),
    ]


# -- load and resume --------------------------------------------------------------------------


async def test_load_replays_the_history_before_answering(
    agent: AgentProcess, client: AcpClient
) -> None:
    session_id = await client.new_session()
    result_of(await client.prompt(session_id, "one"))
    result_of(await client.prompt(session_id, "two"))

    async with AcpClient.connect(agent.url) as other:
        assert result_of(await other.request("session/load", load_params(session_id))) == {}
        assert text_chunks(other.drain_incoming()) == [
            ("user_message_chunk", "one"),
            ("agent_message_chunk", f"[{AGENT_ID}] one"),
            ("user_message_chunk", "two"),
            ("agent_message_chunk", f"[{AGENT_ID}] two"),
        ]
        result_of(await other.prompt(session_id, "three"))
        assert text_chunks(other.drain_incoming()) == [
            ("agent_message_chunk", f"[{AGENT_ID}] three")
        ]


async def test_a_prompt_cut_inside_an_emoji_is_echoed_stored_and_replayed(
    agent: AgentProcess, client: AcpClient
) -> None:
    # "\ud83d" alone is legal JSON (the client's json.dumps writes it as an escape)
    session_id = await client.new_session()
    result_of(await client.prompt(session_id, "cut \ud83d"))
    assert text_chunks(client.drain_incoming()) == [
        ("agent_message_chunk", f"[{AGENT_ID}] cut \ud83d")
    ]
    async with AcpClient.connect(agent.url) as other:
        assert result_of(await other.request("session/load", load_params(session_id))) == {}
        assert text_chunks(other.drain_incoming()) == [
            ("user_message_chunk", "cut \ud83d"),
            ("agent_message_chunk", f"[{AGENT_ID}] cut \ud83d"),
        ]


async def test_resume_attaches_without_replay(agent: AgentProcess, client: AcpClient) -> None:
    session_id = await client.new_session()
    result_of(await client.prompt(session_id, "one"))

    async with AcpClient.connect(agent.url) as other:
        params = {"sessionId": session_id, "cwd": "/work/project"}  # mcpServers is optional
        assert result_of(await other.request("session/resume", params)) == {}
        result_of(await other.prompt(session_id, "two"))
        assert text_chunks(other.drain_incoming()) == [("agent_message_chunk", f"[{AGENT_ID}] two")]


# -- list ---------------------------------------------------------------------------------------


async def test_list_filters_by_cwd_and_pages(store: Path) -> None:
    async with (
        start_agent(store, AGENT_ID, "--page-size", "2") as agent,
        AcpClient.connect(agent.url) as client,
    ):
        in_a = {await client.new_session("/p/a") for _ in range(5)}
        in_b = {await client.new_session("/p/b") for _ in range(2)}

        pages = await list_all(client, {"cwd": "/p/a"})
        assert [len(page) for page in pages] == [2, 2, 1]
        listed = [entry for page in pages for entry in page]
        assert {entry["sessionId"] for entry in listed} == in_a
        assert all(entry["cwd"] == "/p/a" for entry in listed)
        stamps = [entry["updatedAt"] for entry in listed]
        assert stamps == sorted(stamps, reverse=True)
        assert all(re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", s) for s in stamps)

        everything = await list_all(client, {})
        assert {e["sessionId"] for page in everything for e in page} == in_a | in_b
        assert await list_all(client, {"cwd": "/p/none"}) == [[]]


async def list_all(client: AcpClient, params: JsonObject) -> list[list[JsonObject]]:
    pages: list[list[JsonObject]] = []
    while True:
        result = result_of(await client.request("session/list", params))
        pages.append(result["sessions"])
        if "nextCursor" not in result:
            return pages
        params = {**params, "cursor": result["nextCursor"]}


async def test_list_shows_the_title(client: AcpClient) -> None:
    session_id = await client.new_session()
    result_of(await client.prompt(session_id, "Fix the flaky test\nand more"))
    (entry,) = result_of(await client.request("session/list", {}))["sessions"]
    assert entry["sessionId"] == session_id
    assert entry["title"] == "Fix the flaky test"


async def test_list_rejects_an_invalid_cursor(client: AcpClient) -> None:
    response = await client.request("session/list", {"cursor": "garbage"})
    assert error_of(response)["code"] == -32602


# -- close and status ---------------------------------------------------------------------------


async def test_close_leaves_the_session_inactive(client: AcpClient) -> None:
    session_id = await client.new_session()
    assert answered_active(await client.status(session_id))

    assert result_of(await client.request("session/close", {"sessionId": session_id})) == {}

    assert result_of(await client.status(session_id))["status"] == "inactive"
    error = error_of(await client.prompt(session_id, "hi"))
    assert error["code"] == -32602
    assert RESUME_FIRST in error["message"]
    assert result_of(await client.request("session/close", {"sessionId": session_id})) == {}


async def test_a_session_closed_by_another_connection_tells_its_holders_to_resume_again(
    agent: AgentProcess, client: AcpClient
) -> None:
    """A copy closed from elsewhere (a router closing a stale copy over its control link)
    answers the connections that had it attached -32010, resume it again (what routers
    and the bridge heal), not -32602, "you never resumed it"."""
    session_id = await client.new_session()
    async with AcpClient.connect(agent.url) as closer:
        await closer.initialize()
        assert result_of(await closer.request("session/close", {"sessionId": session_id})) == {}
        # the closer never had it attached: it is told so, as before
        assert error_of(await closer.prompt(session_id, "hi"))["code"] == -32602
    moved = error_of(await client.prompt(session_id, "hi"))
    assert moved["code"] == -32010, moved
    assert moved["data"]["sessionId"] == session_id
    assert (
        result_of(await client.request("session/resume", {"sessionId": session_id, "cwd": "/w"}))
        == {}
    )
    assert result_of(await client.prompt(session_id, "again")) == {"stopReason": "end_turn"}


async def test_status_of_an_unknown_session_is_resource_not_found(client: AcpClient) -> None:
    response = await client.status("sess_unknown")
    assert error_of(response) == not_found("sess_unknown")


UNKNOWN_SESSION_CALLS: list[tuple[str, JsonObject]] = [
    ("session/status", {}),
    ("session/close", {}),
    ("session/load", {"cwd": "/w", "mcpServers": []}),
    ("session/resume", {"cwd": "/w"}),
    ("session/prompt", {"prompt": [{"type": "text", "text": "hi"}]}),
]


async def test_every_session_method_answers_unknown_sessions_with_32002(
    client: AcpClient, store: Path
) -> None:
    for session_id in ("sess_unknown", "../../etc/passwd", "x" * 129, "sess.jsonl"):
        for method, extra in UNKNOWN_SESSION_CALLS:
            response = await client.request(method, {"sessionId": session_id, **extra})
            assert response.get("error") == not_found(session_id), (method, response)
    assert store_snapshot(store) == {}


async def test_status_has_no_side_effects(
    agent: AgentProcess, client: AcpClient, store: Path
) -> None:
    session_id = await client.new_session()
    async with AcpClient.connect(agent.url) as other:
        assert answered_active(await other.status(session_id))
        error = error_of(await other.prompt(session_id, "hi"))  # status did not attach it
        assert error["code"] == -32602
        assert error["message"] == f"session {session_id} {RESUME_FIRST}"

        result_of(await client.request("session/close", {"sessionId": session_id}))
        before = store_snapshot(store)
        assert sorted(before) == [f"{session_id}.jsonl", f"{session_id}.lease"]
        for _ in range(3):
            assert result_of(await other.status(session_id))["status"] == "inactive"
        assert store_snapshot(store) == before


async def test_prompt_needs_the_session_attached_here(
    agent: AgentProcess, client: AcpClient
) -> None:
    session_id = await client.new_session()
    async with AcpClient.connect(agent.url) as other:
        error = error_of(await other.prompt(session_id, "hi"))
        assert error["code"] == -32602
        assert RESUME_FIRST in error["message"]
        assert error["data"] == {"sessionId": session_id}


# -- turns: /slow, cancel, /permission ------------------------------------------------------------


async def test_slow_streams_chunks_until_done(client: AcpClient) -> None:
    session_id = await client.new_session()
    loop = asyncio.get_running_loop()
    started = loop.time()
    response = await client.prompt(session_id, "/slow 0.5")
    assert result_of(response) == {"stopReason": "end_turn"}
    assert loop.time() - started >= 0.5
    chunks = text_chunks(client.drain_incoming())
    assert len(chunks) >= 2  # about 5, one per ~0.1 s
    assert all(text.startswith(f"[{AGENT_ID}] slow ") for _, text in chunks)


async def test_cancel_ends_a_slow_turn_promptly(client: AcpClient) -> None:
    session_id = await client.new_session()
    turn = asyncio.create_task(client.prompt(session_id, "/slow 30", timeout=5))
    try:
        assert await next_chunk(client) == ("agent_message_chunk", f"[{AGENT_ID}] slow 1")

        second = error_of(await client.prompt(session_id, "again"))
        assert second == {
            "code": -32016,
            "message": f"session {session_id} has a prompt turn running: send the prompt"
            " again after it ends, or after session/cancel",
            "data": {"sessionId": session_id, "retryable": True},
        }

        await client.notify("session/cancel", {"sessionId": session_id})
        assert result_of(await turn) == {"stopReason": "cancelled"}
    finally:
        turn.cancel()
    result_of(await client.prompt(session_id, "after"))  # the session takes prompts again


async def test_a_cancel_right_behind_its_prompt_ends_the_turn(client: AcpClient) -> None:
    """The two frames arrive together: the cancel must find the turn that the prompt
    before it starts (on main the turn often started after the cancel, and ran on)."""
    session_id = await client.new_session()
    cancel = {"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": session_id}}
    for request_id in range(100, 110):
        params = {"sessionId": session_id, "prompt": [{"type": "text", "text": "/slow 30"}]}
        prompt = {"jsonrpc": "2.0", "id": request_id, "method": "session/prompt", "params": params}
        await client.ws.send(json.dumps(prompt))
        await client.ws.send(json.dumps(cancel))
        while "method" in (answer := await client.next_incoming(timeout=5)):
            pass  # the turn's chunks, if it said anything before the cancel
        assert answer == {"jsonrpc": "2.0", "id": request_id, "result": {"stopReason": "cancelled"}}


async def test_a_turn_ends_when_the_connection_that_sent_it_closes(agent: AgentProcess) -> None:
    """Nobody can see that turn end; it must not hold the session against the retry of
    a client that reconnects (on main: -32602 until the turn had run its course)."""
    async with AcpClient.connect(agent.url) as first:
        session_id = await first.new_session()
        turn = asyncio.create_task(first.prompt(session_id, "/slow 30", timeout=5))
        assert await next_chunk(first) == ("agent_message_chunk", f"[{AGENT_ID}] slow 1")
    with pytest.raises(ConnectionError):
        await turn
    async with AcpClient.connect(agent.url) as again:
        result_of(await again.request("session/resume", load_params(session_id)))
        assert result_of(await again.prompt(session_id, "retried")) == {"stopReason": "end_turn"}
        assert answered_active(await again.status(session_id))


async def test_close_cancels_a_running_turn(client: AcpClient) -> None:
    session_id = await client.new_session()
    turn = asyncio.create_task(client.prompt(session_id, "/slow 30", timeout=5))
    try:
        await next_chunk(client)
        assert result_of(await client.request("session/close", {"sessionId": session_id})) == {}
        assert result_of(await turn) == {"stopReason": "cancelled"}
    finally:
        turn.cancel()
    assert result_of(await client.status(session_id))["status"] == "inactive"


async def test_permission_round_trip(client: AcpClient) -> None:
    session_id = await client.new_session()
    # agent->client ids count from 0 per connection
    for expected_id, option in ((0, "allow"), (1, "reject")):
        turn = asyncio.create_task(client.prompt(session_id, "/permission"))
        try:
            request = await next_request(client, "session/request_permission")
            assert request["id"] == expected_id
            params = request["params"]
            assert params["sessionId"] == session_id
            assert params["toolCall"]["status"] == "pending"
            assert [o["optionId"] for o in params["options"]] == ["allow", "reject"]
            assert [o["kind"] for o in params["options"]] == ["allow_once", "reject_once"]

            selected = {"outcome": "selected", "optionId": option}
            await client.respond(request["id"], {"outcome": selected})
            assert result_of(await turn) == {"stopReason": "end_turn"}
        finally:
            turn.cancel()
        chunks = text_chunks(client.drain_incoming())
        assert chunks == [("agent_message_chunk", f"[{AGENT_ID}] permission: {option}")]


async def test_permission_error_reply_counts_as_cancelled(client: AcpClient) -> None:
    session_id = await client.new_session()
    turn = asyncio.create_task(client.prompt(session_id, "/permission"))
    try:
        request = await next_request(client, "session/request_permission")
        await client.respond_error(request["id"], -32603, "the user closed the dialog")
        assert result_of(await turn) == {"stopReason": "end_turn"}
    finally:
        turn.cancel()
    assert text_chunks(client.drain_incoming()) == [
        ("agent_message_chunk", f"[{AGENT_ID}] permission: cancelled")
    ]


async def test_session_cancel_answers_a_pending_permission(client: AcpClient) -> None:
    session_id = await client.new_session()
    turn = asyncio.create_task(client.prompt(session_id, "/permission"))
    try:
        await next_request(client, "session/request_permission")
        await client.notify("session/cancel", {"sessionId": session_id})
        assert result_of(await turn) == {"stopReason": "cancelled"}
    finally:
        turn.cancel()
    assert text_chunks(client.drain_incoming()) == [
        ("agent_message_chunk", f"[{AGENT_ID}] permission: cancelled")
    ]


async def test_disconnect_cancels_pending_permission_requests(store: Path) -> None:
    async with start_agent(store, AGENT_ID, "--idle-timeout", "0.2") as agent:
        async with AcpClient.connect(agent.url) as client:
            session_id = await client.new_session()
            turn = asyncio.create_task(client.prompt(session_id, "/permission"))
            await next_request(client, "session/request_permission")
        with pytest.raises(ConnectionError):
            await turn
        # The idle clock starts only once the turn has ended with nobody attached.
        await agent.wait_for_log(f"session {session_id} evicted after idle timeout")
        async with AcpClient.connect(agent.url) as client:
            result_of(await client.request("session/load", load_params(session_id)))
            assert text_chunks(client.drain_incoming())[-1] == (
                "agent_message_chunk",
                f"[{AGENT_ID}] permission: cancelled",
            )


# -- JSON-RPC errors ------------------------------------------------------------------------------


async def test_malformed_json_is_a_parse_error_with_a_null_id(client: AcpClient) -> None:
    response = await client.send_raw("{not json", expect_id=None)
    assert response["id"] is None
    assert error_of(response)["code"] == -32700


INVALID_REQUESTS: list[tuple[str, int | None]] = [
    ('{"jsonrpc": "1.0", "id": 8, "method": "initialize"}', 8),
    ('{"jsonrpc": "2.0", "id": 9}', 9),
    ('{"jsonrpc": "2.0", "id": 10, "method": 5}', 10),
    ('{"jsonrpc": "2.0", "id": 1.5, "method": "initialize"}', None),
    ("[1, 2]", None),
    ('"just a string"', None),
]


async def test_invalid_requests(client: AcpClient) -> None:
    for frame, expect_id in INVALID_REQUESTS:
        response = await client.send_raw(frame, expect_id=expect_id)
        assert response.get("error", {}).get("code") == -32600, (frame, response)


async def test_unknown_methods(client: AcpClient) -> None:
    for method in ("session/set_mode", "_vendor/extension", "authenticate"):
        response = await client.request(method, {"sessionId": "sess_x"})
        assert error_of(response) == {
            "code": -32601,
            "message": f"Method not found: {method}",
            "data": {"method": method},
        }


BAD_PARAMS: list[tuple[str, Any]] = [
    ("initialize", {}),
    ("initialize", None),
    ("session/new", {"cwd": "/w"}),
    ("session/new", {"cwd": "relative/path", "mcpServers": []}),
    ("session/new", ["/w", []]),
    ("session/load", {"sessionId": "sess_x", "mcpServers": []}),
    ("session/resume", {"sessionId": "sess_x", "cwd": "/w", "mcpServers": {}}),
    ("session/status", {}),
    ("session/status", {"sessionId": 5}),
    ("session/close", {"sessionId": None}),
    ("session/list", {"cwd": 5}),
    ("session/list", {"cursor": 5}),
    ("session/prompt", {"sessionId": 5, "prompt": []}),
]


async def test_bad_params(client: AcpClient) -> None:
    for method, params in BAD_PARAMS:
        message = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}
        if params is None:
            del message["params"]
        response = await client.send_raw(json.dumps(message), expect_id=1)
        assert response.get("error", {}).get("code") == -32602, (method, params, response)


async def test_bad_prompts(client: AcpClient) -> None:
    session_id = await client.new_session()
    for prompt in (
        None,
        "text",
        [{"text": "no type"}],
        [{"type": "text"}],
        [{"type": "text", "text": "/slow x"}],
        [{"type": "text", "text": "/slow -1"}],
    ):
        params = {"sessionId": session_id, "prompt": prompt}
        response = await client.request("session/prompt", params)
        assert response.get("error", {}).get("code") == -32602, (prompt, response)
    result_of(await client.prompt(session_id, "fine"))


async def test_a_failing_handler_answers_internal_error_and_the_connection_lives_on(
    client: AcpClient, store: Path
) -> None:
    session_id = await client.new_session()
    remove_file(store / f"{session_id}.jsonl")  # the store write in the turn now fails

    response = await client.prompt(session_id, "hi")

    assert error_of(response) == {"code": -32603, "message": "Internal error"}
    assert answered_active(await client.status(session_id))
    assert (await client.new_session()).startswith("sess_")


def remove_file(path: Path) -> None:
    path.unlink()


async def test_unknown_notifications_and_binary_frames_are_ignored(client: AcpClient) -> None:
    await client.notify("_vendor/ping", {"x": 1})
    await client.notify("session/cancel", {"sessionId": "sess_unknown"})
    await client.notify("session/cancel", None)
    await client.ws.send(b"\x00binary")
    response = await client.request("initialize", {"protocolVersion": 1})
    assert result_of(response)["protocolVersion"] == 1
    assert client.drain_incoming() == []


# -- idle eviction, shutdown, instances sharing a store -------------------------------------------


async def test_idle_sessions_are_evicted_but_attached_ones_stay(store: Path) -> None:
    async with (
        start_agent(store, AGENT_ID, "--idle-timeout", "0.3") as agent,
        AcpClient.connect(agent.url) as keeper,
    ):
        kept = await keeper.new_session()
        async with AcpClient.connect(agent.url) as leaver:
            left = await leaver.new_session()
        await agent.wait_for_log(f"session {left} evicted after idle timeout")
        assert result_of(await keeper.status(left))["status"] == "inactive"
        assert answered_active(await keeper.status(kept))
        result_of(await keeper.prompt(kept, "still here"))


async def test_sigterm_stops_the_agent_cleanly_mid_turn(store: Path) -> None:
    async with start_agent(store, AGENT_ID) as agent, AcpClient.connect(agent.url) as client:
        session_id = await client.new_session()
        turn = asyncio.create_task(client.prompt(session_id, "/slow 30"))
        await next_chunk(client)
        assert await agent.stop() == 0
        assert "Traceback" not in agent.cli.stderr.text
        try:
            await turn  # the turn was ended, not dropped, or the socket closed under it
        except ConnectionError:
            pass
        else:
            assert result_of(turn.result()) == {"stopReason": "cancelled"}


async def test_sigint_stops_the_agent_cleanly(agent: AgentProcess) -> None:
    agent.cli.process.send_signal(signal.SIGINT)
    async with asyncio.timeout(WAIT):
        assert await agent.cli.process.wait() == 0


async def test_instances_sharing_a_store_can_resume_each_others_sessions(store: Path) -> None:
    async with start_agent(store, "agent-a") as a, start_agent(store, "agent-b") as b:
        async with AcpClient.connect(a.url) as on_a, AcpClient.connect(b.url) as on_b:
            session_id = await on_a.new_session()
            result_of(await on_a.prompt(session_id, "hello"))

            assert result_of(await on_b.status(session_id))["status"] == "inactive"
            listed = result_of(await on_b.request("session/list", {}))["sessions"]
            assert [entry["sessionId"] for entry in listed] == [session_id]

            result_of(await on_b.request("session/resume", load_params(session_id)))
            assert answered_active(await on_b.status(session_id))
            result_of(await on_b.prompt(session_id, "hello again"))
            assert text_chunks(on_b.drain_incoming()) == [
                ("agent_message_chunk", "[agent-b] hello again")
            ]

        async with AcpClient.connect(a.url) as fresh:
            result_of(await fresh.request("session/load", load_params(session_id)))
            assert [text for _, text in text_chunks(fresh.drain_incoming())] == [
                "hello",
                "[agent-a] hello",
                "hello again",
                "[agent-b] hello again",
            ]


# -- fencing: a session moved to another instance is never written here again -----------------------


def records_of(store: Path, session_id: str) -> list[JsonObject]:
    lines = (store / f"{session_id}.jsonl").read_bytes().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def texts_of(store: Path, session_id: str) -> list[str]:
    return [record["text"] for record in records_of(store, session_id) if "text" in record]


def moved(session_id: str) -> str:
    return f"session {session_id} moved to another instance: send session/resume again"


async def test_a_session_resumed_elsewhere_is_dropped_here_not_appended_to(store: Path) -> None:
    """A forced double resume: on A, then directly on B (no router to prevent it)."""
    async with start_agent(store, "agent-a") as a, start_agent(store, "agent-b") as b:
        async with AcpClient.connect(a.url) as on_a, AcpClient.connect(b.url) as on_b:
            session_id = await on_a.new_session()
            result_of(await on_a.prompt(session_id, "one"))
            result_of(await on_b.request("session/resume", load_params(session_id)))

            assert result_of(await on_a.status(session_id))["status"] == "inactive"
            assert answered_active(await on_b.status(session_id))
            before = records_of(store, session_id)
            error = error_of(await on_a.prompt(session_id, "two"))
            assert (error["code"], error["message"]) == (-32010, moved(session_id))
            assert error["data"] == {"sessionId": session_id, "retryable": False}  # never ran
            assert records_of(store, session_id) == before
            await a.wait_for_log(f"session {session_id} moved to another instance")
            assert result_of(await on_a.status(session_id))["status"] == "inactive"

            result_of(await on_b.prompt(session_id, "three"))
            # Resuming on A again takes it back; now B is the one fenced off.
            result_of(await on_a.request("session/resume", load_params(session_id)))
            result_of(await on_a.prompt(session_id, "four"))
            assert error_of(await on_b.prompt(session_id, "five"))["code"] == -32010

    assert texts_of(store, session_id) == [
        "one",
        "[agent-a] one",
        "three",
        "[agent-b] three",
        "four",
        "[agent-a] four",
    ]


async def test_a_running_turn_stops_writing_when_its_session_moves(store: Path) -> None:
    async with start_agent(store, "agent-a") as a, start_agent(store, "agent-b") as b:
        async with AcpClient.connect(a.url) as on_a, AcpClient.connect(b.url) as on_b:
            session_id = await on_a.new_session()
            turn = asyncio.create_task(on_a.prompt(session_id, "/slow 5"))
            try:
                assert await next_chunk(on_a) == ("agent_message_chunk", "[agent-a] slow 1")
                result_of(await on_b.request("session/resume", load_params(session_id)))
                result_of(await on_b.prompt(session_id, "mine now"))
                error = error_of(await turn)  # at A's next write, not after 5 s
                assert (error["code"], error["message"]) == (-32010, moved(session_id))
                # it ran in part: a bridge must not send it again as if it never had
                assert error["data"] == {
                    "sessionId": session_id,
                    "retryable": False,
                    "turnStarted": True,
                }
            finally:
                turn.cancel()
            sent_by_a = ["[agent-a] slow 1", *(t for _, t in text_chunks(on_a.drain_incoming()))]

    texts = texts_of(store, session_id)
    assert texts[0] == "/slow 5"
    mine_now = texts.index("mine now")
    assert texts[1:mine_now] == sent_by_a  # A wrote what it sent, and nothing after B took it
    assert texts[mine_now:] == ["mine now", "[agent-b] mine now"]


# -- frame size --------------------------------------------------------------------------------------


async def test_frames_up_to_the_routers_default_limit_are_accepted(client: AcpClient) -> None:
    """A 5 MB frame passes the router's default limit (16 MiB), so the agent takes it too."""
    response = await client.request("session/list", {"cwd": "/" + "x" * (5 * 1024 * 1024)})
    assert result_of(response)["sessions"] == []


async def test_max_message_bytes_closes_on_a_bigger_frame(store: Path) -> None:
    async with (
        start_agent(store, AGENT_ID, "--max-message-bytes", "4096") as agent,
        AcpClient.connect(agent.url) as client,
    ):
        result_of(await client.request("session/list", {"cwd": "/" + "x" * 3000}))
        head = '{"jsonrpc":"2.0","id":99,"method":"session/list","params":{"cwd":"/'
        exact = head + "x" * (4096 - len(head) - 3) + '"}}'
        assert len(exact.encode()) == 4096  # exactly the limit: still answered
        result_of(await client.send_raw(exact, expect_id=99))
        with pytest.raises(ConnectionError):
            await client.request("session/list", {"cwd": "/" + "x" * 5000})
        assert client.ws.close_code == 1009


# -- failing to start -----------------------------------------------------------------------------


async def test_a_store_that_is_a_file_fails_with_one_line(tmp_path: Path) -> None:
    not_a_folder = tmp_path / "file"
    not_a_folder.write_text("")
    run = await run_cli_to_exit(
        "agent", "--listen", "127.0.0.1:0", "--store", str(not_a_folder), "--id", AGENT_ID
    )
    assert run.returncode != 0
    assert run.stdout == ""
    (line,) = run.stderr.splitlines()
    assert "--store" in line


async def test_a_port_in_use_fails_with_one_line(store: Path) -> None:
    with occupied_port() as port:
        run = await run_cli_to_exit(
            "agent", "--listen", f"127.0.0.1:{port}", "--store", str(store), "--id", AGENT_ID
        )
    assert run.returncode != 0
    assert run.stdout == ""
    (line,) = run.stderr.splitlines()
    assert "address already in use" in line.lower()


async def test_status_says_when_the_session_last_did_anything(client: AcpClient) -> None:
    """``_meta.lastActivity`` of an active answer moves with a prompt, never with a probe
    (status has no side effects): how router replicas agree which of two copies of a
    session is the live one."""
    session_id = await client.new_session()
    first = result_of(await client.status(session_id))["_meta"]["lastActivity"]
    assert result_of(await client.status(session_id))["_meta"]["lastActivity"] == first
    result_of(await client.prompt(session_id, "hello"))
    after = result_of(await client.status(session_id))["_meta"]["lastActivity"]
    assert after >= first
    assert result_of(await client.status(session_id))["_meta"]["lastActivity"] == after


async def test_a_resume_epoch_is_kept_with_the_session_and_reported_by_status(
    client: AcpClient, store: Path
) -> None:
    """The router's fencing token (``_meta`` of a resume): kept when it is higher, never
    lowered, reported active or not, and by another process on the same store."""
    session_id = await client.new_session()
    assert result_of(await client.status(session_id))["_meta"][EPOCH] == 0

    async def resumed(epoch: int) -> int:
        params = {"sessionId": session_id, "cwd": CWD, "_meta": {EPOCH: epoch}}
        result_of(await client.request("session/resume", params))
        return int(result_of(await client.status(session_id))["_meta"][EPOCH])

    assert await resumed(1_000) == 1_000
    assert await resumed(999) == 1_000  # a lower one changes nothing
    assert await resumed(2_000) == 2_000
    result_of(await client.request("session/close", {"sessionId": session_id}))
    closed = result_of(await client.status(session_id))
    assert (closed["status"], closed["_meta"][EPOCH]) == ("inactive", 2_000)
    async with start_agent(store, "agent-b") as other, AcpClient.connect(other.url) as there:
        await there.initialize()
        assert result_of(await there.status(session_id))["_meta"][EPOCH] == 2_000
