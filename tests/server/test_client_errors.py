"""Every error the router answers itself is counted under its code: a real router,
scripted backends on real sockets, /metrics over HTTP (tests/e2e/test_client_errors.py:
expected events log no ERROR)."""

from __future__ import annotations

import json

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from tests.fleet import (
    CLOSE,
    RouterUnderTest,
    error_reply,
    never_answer,
    start_router,
    start_scripted,
)
from tests.support import AcpClient, JsonObject

CREATED = '{"jsonrpc":"2.0","id":$ID,"result":{"sessionId":"sess_1"}}'


async def client_errors(router: RouterUnderTest) -> dict[str, float]:
    """``acp_router_client_errors_total`` by code, as /metrics serves it."""
    async with aiohttp.ClientSession() as http, http.get(f"{router.base}/metrics") as response:
        text = await response.text()
    (family,) = (
        f for f in text_string_to_metric_families(text) if f.name == "acp_router_client_errors"
    )
    return {s.labels["code"]: s.value for s in family.samples if s.name.endswith("_total")}


def code(answer: JsonObject) -> int:
    assert "error" in answer, answer
    value: int = answer["error"]["code"]
    return value


async def test_each_error_the_router_answers_is_counted_under_its_code() -> None:
    async with start_scripted("s", never_answer) as backend:
        backend.scripted = {
            "session/new": [CREATED],
            "session/status": [error_reply(-32002, "Resource not found")],
            "_x/hang": [],  # never answered
            "_x/die": [CLOSE],
        }
        async with (
            start_router(
                [("s", backend.url)],
                router={"max_in_flight_per_connection": 3, "max_sessions_per_connection": 1},
            ) as router,
            AcpClient.connect(router.url) as client,
        ):
            assert code(await client.request("session/new", {"cwd": "/w"})) == -32600  # too early
            assert code(await client.send_raw("{not json", expect_id=None)) == -32700
            await client.initialize()
            assert code(await client.request("_x/ext")) == -32601  # no backend used yet
            assert code(await client.request("session/prompt", {"prompt": []})) == -32602
            assert code(await client.status("sess_nobody")) == -32002
            prompt = {"sessionId": "sess_elsewhere", "prompt": []}
            assert code(await client.request("session/prompt", prompt)) == -32010
            assert await client.new_session() == "sess_1"
            assert (
                code(await client.request("session/new", {"cwd": "/w", "mcpServers": []})) == -32015
            )

            for hung in ("h1", "h2", "h3"):  # three in flight, never answered
                await client.ws.send(
                    json.dumps({"jsonrpc": "2.0", "id": hung, "method": "_x/hang"})
                )
            assert code(await client.request("_x/hang", request_id="h1")) == -32600  # in flight
            assert code(await client.request("_x/hang")) == -32014  # a fourth
            await client.notify("_x/die")  # the backend closes the link: h1..h3 are lost
            lost = [await client.next_incoming() for _ in range(3)]
            assert sorted((m["id"], code(m)) for m in lost) == [
                ("h1", -32013),
                ("h2", -32013),
                ("h3", -32013),
            ]
            counted = await client_errors(router)
        assert counted == {
            "-32700": 1,
            "-32600": 2,
            "-32601": 1,
            "-32602": 1,
            "-32002": 1,
            "-32010": 1,
            "-32015": 1,
            "-32014": 1,
            "-32013": 3,
        }


async def test_no_backend_and_an_unanswered_probe_are_counted() -> None:
    async with (
        start_scripted("silent", never_answer) as silent,
        start_router([("silent", silent.url)], probe={"timeout_ms": 50}) as router,
        start_router([("gone", "ws://127.0.0.1:9/acp")], wait_for=0) as empty,
        AcpClient.connect(router.url) as client,
        AcpClient.connect(empty.url) as lonely,
    ):
        await client.initialize()
        resume = {"sessionId": "sess_x", "cwd": "/w"}
        assert code(await client.request("session/resume", resume)) == -32012
        await lonely.initialize()
        assert code(await lonely.request("session/new", {"cwd": "/w", "mcpServers": []})) == -32011
        assert await client_errors(router) == {"-32012": 1}
        assert await client_errors(empty) == {"-32011": 1}
