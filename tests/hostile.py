"""A hostile ACP backend on a real socket: what a well-behaved agent never does.

:class:`HostileBackend` is a ``websockets`` server that answers ``initialize`` like an
agent, then does what it is told: hold client links' handshakes until a gate opens,
never answer WebSocket upgrades, stop reading, or (given a seed) answer each request
in a randomly chosen hostile way: garbage frames, answers to unknown ids, duplicate
answers, legal but odd JSON, agent requests and notifications, stalls, late answers,
and half-closed or dropped sockets.

The control link and a client connection's link are told apart by the id of their
``initialize``: the router replays a client's ``initialize`` as
``acp-router:initialize``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import random
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import websockets
from websockets.asyncio.server import ServerConnection
from websockets.http11 import Request as HttpRequest, Response as HttpResponse

LINK_INITIALIZE = "acp-router:initialize"

JsonObject = dict[str, Any]

INITIALIZE_RESULT: JsonObject = {
    "protocolVersion": 1,
    "agentCapabilities": {
        "loadSession": True,
        "sessionCapabilities": {"resume": {}, "list": {}, "status": {}},
    },
}

GARBAGE = ["{", "nul", "[1,", "", '""', "[]", '{"jsonrpc":"2.0"}', '{"jsonrpc":"2.0","id":1.5}']

#: the ways :meth:`HostileBackend.fuzz` may answer a request
BEHAVIOURS = (
    "ok",
    "error",
    "garbage",
    "unknown_id",
    "duplicate",
    "odd_json",
    "agent_request",
    "notify",
    "stall",
    "late",
    "half_close",
    "hang_up",
)

CONTROL_BEHAVIOURS = tuple(b for b in BEHAVIOURS if b not in ("stall", "late"))


def _frame(message: JsonObject) -> str:
    return json.dumps(message)


@dataclass
class HostileBackend:
    backend_id: str
    url: str = ""
    #: when set, client links' ``initialize`` is answered only once it is set
    gate: asyncio.Event | None = None
    #: upgrades from this connection on (0: every one) are never answered
    stall_upgrades_from: int | None = None
    #: when set, each request (``initialize`` aside) is answered in a hostile way
    rng: random.Random | None = None
    #: client links stop reading once their ``initialize`` is answered
    deaf: bool = False
    #: every frame received on client links, in order
    link_frames: list[str] = field(default_factory=list)
    #: request ids (as sent) a hostile answer left unanswered until the link dies
    unanswered: set[Any] = field(default_factory=set)
    #: the session each of those requests named (a failover's resume holds its
    #: session's later frames in the router, as a client's resume does)
    unanswered_sessions: dict[Any, Any] = field(default_factory=dict)
    upgrades: int = 0
    behaviours: list[str] = field(default_factory=list)
    #: notified on every upgrade, link frame and unanswered request (may be shared)
    changed: asyncio.Condition = field(default_factory=asyncio.Condition)
    stopping: asyncio.Event = field(default_factory=asyncio.Event)
    sockets: set[ServerConnection] = field(default_factory=set)
    _sessions: itertools.count[int] = field(default_factory=itertools.count)

    async def wait_for(self, predicate: Callable[[], bool]) -> None:
        async with self.changed:
            await self.changed.wait_for(predicate)

    async def _notify(self) -> None:
        async with self.changed:
            self.changed.notify_all()

    async def _upgrade(self, ws: ServerConnection, request: HttpRequest) -> HttpResponse | None:
        index = self.upgrades
        self.upgrades += 1
        await self._notify()
        if self.stall_upgrades_from is not None and index >= self.stall_upgrades_from:
            await self.stopping.wait()  # never answered while the backend runs
            return ws.respond(503, "stopping\n")
        return None

    async def _serve(self, ws: ServerConnection) -> None:
        self.sockets.add(ws)
        answers: set[asyncio.Task[None]] = set()
        try:
            await self._read(ws, answers)
        except websockets.ConnectionClosed:
            pass  # a dropped or half-closed socket: hostile, and expected
        finally:  # a stalled answer never finishes: stop when the socket goes
            self.sockets.discard(ws)
            for answer in answers:
                answer.cancel()
            await asyncio.gather(*answers, return_exceptions=True)

    async def _read(self, ws: ServerConnection, answers: set[asyncio.Task[None]]) -> None:
        deferred: list[JsonObject] = []
        is_link = False
        async for frame in ws:
            assert isinstance(frame, str)
            message = json.loads(frame)
            if message.get("id") == LINK_INITIALIZE:
                is_link = True
            if is_link:
                self.link_frames.append(frame)
                await self._notify()
            answer = asyncio.create_task(self._answer(ws, message, deferred, is_link))
            answers.add(answer)
            answer.add_done_callback(answers.discard)
            if is_link and self.deaf:
                await ws.wait_closed()  # reads nothing more: the router's writes back up

    async def _answer(
        self, ws: ServerConnection, message: JsonObject, deferred: list[JsonObject], is_link: bool
    ) -> None:
        with contextlib.suppress(websockets.ConnectionClosed):
            if message.get("method") == "initialize":
                if message.get("id") == LINK_INITIALIZE and self.gate is not None:
                    await self.gate.wait()
                await ws.send(_frame(self._result(message, INITIALIZE_RESULT)))
            elif "method" in message and "id" in message:
                if self.rng is None:
                    await ws.send(_frame(self._ok(message)))
                else:
                    await self._hostile(ws, message, deferred, is_link)

    def _ok(self, message: JsonObject) -> JsonObject:
        method = message.get("method")
        if method == "session/new":
            session_id = f"sess_{self.backend_id}_{next(self._sessions)}"
            return self._result(message, {"sessionId": session_id})
        if method == "session/prompt":
            return self._result(message, {"stopReason": "end_turn"})
        if method == "session/status":
            named = (message.get("params") or {}).get("sessionId")
            if isinstance(named, str) and named.startswith(f"sess_{self.backend_id}_"):
                return self._result(message, {"status": "inactive"})
            error = {
                "code": -32002,
                "message": "Resource not found",
                "data": {"sessionId": named},
            }
            return {"jsonrpc": "2.0", "id": message["id"], "error": error}
        if method == "session/list":
            return self._result(message, {"sessions": []})
        return self._result(message, {})

    @staticmethod
    def _result(message: JsonObject, result: Any) -> JsonObject:
        return {"jsonrpc": "2.0", "id": message["id"], "result": result}

    async def _hostile(
        self, ws: ServerConnection, message: JsonObject, deferred: list[JsonObject], is_link: bool
    ) -> None:
        assert self.rng is not None
        rng = self.rng
        # the control link's calls have deadlines of seconds: stalling them only slows a test
        behaviour = rng.choice(BEHAVIOURS if is_link else CONTROL_BEHAVIOURS)
        self.behaviours.append(behaviour)
        for late in deferred:  # a late answer goes out after a later request arrived
            await ws.send(_frame(self._ok(late)))
        deferred.clear()
        ok = _frame(self._ok(message))
        if behaviour == "ok":
            await ws.send(ok)
        elif behaviour == "error":
            error = {"code": -32603, "message": "hostile", "data": {"why": [1, None]}}
            await ws.send(_frame({"jsonrpc": "2.0", "id": message["id"], "error": error}))
        elif behaviour == "garbage":
            for text in rng.sample(GARBAGE, 3):
                await ws.send(text)
            await ws.send(b"\x00binary")
            await ws.send(ok)
        elif behaviour == "unknown_id":
            for stray in (987654, "nobody", None):
                await ws.send(_frame({"jsonrpc": "2.0", "id": stray, "result": {}}))
            await ws.send(ok)
        elif behaviour == "duplicate":
            await ws.send(ok)
            await ws.send(ok)
        elif behaviour == "odd_json":
            await ws.send(_odd(self._ok(message)))
        elif behaviour == "agent_request":
            asked = {"sessionId": "sess_anything", "options": []}
            for agent_id in (1, "a-1", 1):
                request = {"jsonrpc": "2.0", "id": agent_id, "method": "session/request_permission"}
                await ws.send(_frame({**request, "params": asked}))
            await ws.send(ok)
        elif behaviour == "notify":
            for note in (
                {"method": "session/update", "params": {"sessionId": "sess_x", "update": {}}},
                {"method": "$/cancel_request", "params": {"requestId": 424242}},
                {"method": "_vendor/odd", "params": [1, 2]},
            ):
                await ws.send(_frame({"jsonrpc": "2.0", **note}))
            await ws.send(ok)
        else:  # the answer is late, or never comes
            if is_link:
                self.unanswered.add(message["id"])
                params = message.get("params")
                named = params.get("sessionId") if isinstance(params, dict) else None
                self.unanswered_sessions[message["id"]] = named
                await self._notify()
            if behaviour == "late":
                deferred.append(message)
            elif behaviour == "half_close":
                ws.transport.write_eof()
            elif behaviour == "hang_up":
                ws.transport.abort()

    def hang_up_all(self) -> None:
        """Drop every socket at once (the router must answer what they held)."""
        self.unanswered.clear()
        self.unanswered_sessions.clear()
        for ws in list(self.sockets):
            ws.transport.abort()


def _odd(answer: JsonObject) -> str:
    """A legal JSON-RPC response (a result or an error) written the odd ways JSON allows."""
    outcome = "result" if "result" in answer else "error"
    nested: Any = answer[outcome]
    for _ in range(50):
        nested = [nested]
    extra = '{"a":"\\u00e9\\ud83d\\ude00\\/","n":[1E+2,-0,0.5e-3,123456789012345678901234567890]}'
    return (
        f'\n {{ "{outcome}" :\t'
        + json.dumps(answer[outcome])
        + ' , "_meta": '
        + extra
        + ', "deep": '
        + json.dumps(nested)
        + ', "id" : '
        + json.dumps(answer["id"])
        + ' ,"jsonrpc":"2.0" } \r\n'
    )


@contextlib.asynccontextmanager
async def start_hostile(
    backend_id: str,
    *,
    seed: int | None = None,
    gate: asyncio.Event | None = None,
    stall_upgrades_from: int | None = None,
    deaf: bool = False,
    changed: asyncio.Condition | None = None,
) -> AsyncIterator[HostileBackend]:
    backend = HostileBackend(
        backend_id,
        changed=changed or asyncio.Condition(),
        gate=gate,
        stall_upgrades_from=stall_upgrades_from,
        rng=None if seed is None else random.Random(seed),
        deaf=deaf,
    )
    process: Callable[[ServerConnection, HttpRequest], Awaitable[HttpResponse | None]]
    process = backend._upgrade
    async with websockets.serve(
        backend._serve,
        "127.0.0.1",
        0,
        process_request=process,
        open_timeout=None,
        max_size=None,
        max_queue=1,
    ) as server:
        port = next(iter(server.sockets)).getsockname()[1]
        backend.url = f"ws://127.0.0.1:{port}/acp"
        try:
            yield backend
        finally:
            backend.stopping.set()
            backend.hang_up_all()
