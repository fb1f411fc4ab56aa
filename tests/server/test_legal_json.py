"""Legal JSON that orjson rejects crosses the router both ways, byte for byte.

Agents cut strings inside an emoji (a lone surrogate escape), write numbers beyond a
double, and nest deeply; every such frame is legal JSON and answers a request, so it
must reach the client as it was sent. Only nesting deeper than the router reads
(about a thousand levels) is refused: dropped and counted from a backend, -32600
naming the id to a client. A real router, a scripted backend on a real socket, and a
raw WebSocket client that compares text.
"""

from __future__ import annotations

import asyncio
import json

from websockets.asyncio.client import ClientConnection, connect

from tests.fleet import never_answer, start_router, start_scripted
from tests.support import WAIT

#: a session id cut inside an emoji, as a backend writes it and as the client echoes it
SESSION = '"cut \\ud83d"'
DEPTH = 250  # 500 levels ({"a":[ is two): deep, and still read
TOO_DEEP = 50_000  # beyond what the router reads on any Python (3.11: ~1,000; 3.12+: ~10,000)


def reply(result: str) -> str:
    return '{"jsonrpc":"2.0","id":$ID,"result":' + result + "}"


def call(request_id: int, method: str, params: str) -> str:
    return f'{{"jsonrpc":"2.0","id":{request_id},"method":"{method}","params":{params}}}'


async def exchange(ws: ClientConnection, frame: str) -> str:
    await ws.send(frame)
    async with asyncio.timeout(WAIT):
        answer = await ws.recv()
    assert isinstance(answer, str)
    return answer


async def test_odd_but_legal_replies_reach_the_client_intact() -> None:
    deep = '{"a":[' * DEPTH + '"\\udc00"' + "]}" * DEPTH
    created = reply(f'{{"sessionId":{SESSION}}}')
    prompted = reply('{"stopReason":"end_turn","_meta":{"tokens":1e400}}')
    nested = reply(f'{{"tree":{deep}}}')
    too_deep = reply('{"tree":' + "[" * TOO_DEEP + "]" * TOO_DEEP + "}")
    async with start_scripted("odd", never_answer) as backend:
        backend.scripted = {
            "session/new": [created],
            "session/prompt": ['{"jsonrpc":"2.0","method":"x","params":"not an object"}', prompted],
            "_odd/tree": ["{not json", "[]", too_deep, nested],
        }
        async with (
            start_router([("odd", backend.url)]) as router,
            connect(router.url, max_size=None) as ws,
        ):
            init = await exchange(ws, call(1, "initialize", '{"protocolVersion":1}'))
            assert json.loads(init)["id"] == 1

            new = call(2, "session/new", '{"cwd":"/w","mcpServers":[]}')
            assert await exchange(ws, new) == created.replace("$ID", "2")

            # the client's lone surrogate is routed too: the session it names is attached
            prompt = call(3, "session/prompt", f'{{"sessionId":{SESSION},"prompt":[]}}')
            assert await exchange(ws, prompt) == prompted.replace("$ID", "3")
            assert prompt in backend.frames

            tree = await exchange(ws, call(4, "_odd/tree", "{}"))
            assert tree == nested.replace("$ID", "4")

            dropped = "acp_router_backend_frames_dropped_total"
            assert router.metric(dropped, backend="odd", reason="not_json") == 1
            assert router.metric(dropped, backend="odd", reason="not_jsonrpc") == 2
            assert router.metric(dropped, backend="odd", reason="too_deep") == 1
            assert router.metric("acp_router_client_errors_total", code="-32700") == 0

            # a client's frame nested too deep: refused at once, naming its id
            deep_call = call(5, "_odd/tree", "[" * TOO_DEEP + "]" * TOO_DEEP)
            refused = json.loads(await exchange(ws, deep_call))
            assert refused["id"] == 5
            assert refused["error"]["code"] == -32600
            assert "nesting is too deep" in refused["error"]["message"]
