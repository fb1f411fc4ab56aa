"""A hostile client against the live router: every request gets exactly one answer.

A seeded mix of valid ACP requests, requests for sessions that do not exist or are
not attached, unknown methods, malformed JSON, non-objects, broken envelopes,
notifications and stray responses, sent back to back on one socket. The router
must answer each request exactly once (an id-null error for each frame it could
not read as a request), send nothing for notifications and responses, and keep
the connection open.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from websockets.asyncio.client import connect

from tests.fleet import backends_of, start_fleet, start_router
from tests.support import CWD, WAIT

FRAMES = 300


class Script:
    """Frames to send, and what the router owes for them."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.frames: list[str] = []
        self.expected_ids: set[int | str] = set()
        self.expected_null = 0
        self.sessions: list[str] = []  # filled in by the test once known
        self._next = 1000

    def _id(self) -> int | str:
        self._next += 1
        return self._next if self.rng.random() < 0.7 else f"s-{self._next}"

    def request(self, method: str, params: Any = None) -> None:
        request_id = self._id()
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": method}
        if params is not None:
            message["params"] = params
        self.frames.append(json.dumps(message))
        self.expected_ids.add(request_id)

    def silent(self, message: dict[str, Any]) -> None:
        self.frames.append(json.dumps(message))

    def unreadable(self, text: str) -> None:
        self.frames.append(text)
        self.expected_null += 1

    def session(self) -> str:
        pool = [*self.sessions, "sess_nobody", "", "../../etc/passwd", "x" * 300]
        return self.rng.choice(pool)

    def add_random(self) -> None:
        r = self.rng.random
        choice = self.rng.randrange(14)
        if choice == 0:
            self.request("session/new", {"cwd": CWD, "mcpServers": []})
        elif choice == 1:
            prompt = [{"type": "text", "text": f"fuzz {self.rng.randrange(10**6)}"}]
            self.request("session/prompt", {"sessionId": self.session(), "prompt": prompt})
        elif choice == 2:
            self.request("session/status", {"sessionId": self.session()})
        elif choice == 3:
            self.request("session/resume", {"sessionId": self.session(), "cwd": CWD})
        elif choice == 4:
            self.request("session/list", {"cwd": CWD} if r() < 0.5 else {"cursor": "bogus"})
        elif choice == 5:
            self.request(self.rng.choice(["_vendor/x", "nope", "session/unknown", ""]), {})
        elif choice == 6:
            bad: Any = self.rng.choice([None, 5, "x", [], {"sessionId": 7}, {"sessionId": None}])
            self.request("session/prompt", bad)
        elif choice == 7:
            self.unreadable(self.rng.choice(["{", "nul", '{"a":', "\x00", "[1,", "", " "]))
        elif choice == 8:
            self.unreadable(json.dumps(self.rng.choice([[], [1], 3, "str", None, True])))
        elif choice == 9:  # broken envelopes: no readable id, so the answer's id is null
            self.unreadable(
                json.dumps(
                    self.rng.choice(
                        [
                            {"jsonrpc": "1.0", "method": "x"},
                            {"jsonrpc": "2.0", "id": None, "method": "x"},
                            {"jsonrpc": "2.0", "id": 1.5, "method": "x"},
                            {"jsonrpc": "2.0", "id": True, "method": "x"},
                            {"jsonrpc": "2.0", "method": 7},
                            {"jsonrpc": "2.0"},
                            {"jsonrpc": "2.0", "id": {"a": 1}, "result": 1},
                        ]
                    )
                )
            )
        elif choice == 10:
            self.silent(
                {
                    "jsonrpc": "2.0",
                    "method": "session/cancel",
                    "params": {"sessionId": self.session()},
                }
            )
        elif choice == 11:
            self.silent(
                {
                    "jsonrpc": "2.0",
                    "method": "$/cancel_request",
                    "params": {"requestId": self.rng.choice([1, "z", [1], None])},
                }
            )
        elif choice == 12:
            self.silent({"jsonrpc": "2.0", "id": self.rng.randrange(5), "result": {"outcome": {}}})
        else:
            self.silent({"jsonrpc": "2.0", "method": "_vendor/notice", "params": {"n": r()}})


@pytest.mark.parametrize("seed", [1, 2])
async def test_every_request_gets_exactly_one_answer(tmp_path: Path, seed: int) -> None:
    async with (
        start_fleet(tmp_path, 2) as agents,
        start_router(backends_of(agents)) as router,
        connect(router.url, max_size=None) as ws,
    ):
        answers: Counter[int | str | None] = Counter()
        results: dict[int | str, Any] = {}
        seen = asyncio.Condition()

        async def read() -> None:
            async for frame in ws:
                message = json.loads(frame)
                if "method" in message:
                    continue  # updates and agent requests: not answers
                async with seen:
                    answers[message.get("id")] += 1
                    if message.get("id") is not None:
                        results[message["id"]] = message.get("result")
                    seen.notify_all()

        reader = asyncio.create_task(read())
        script = Script(seed)
        script.request("initialize", {"protocolVersion": 1})
        for frame in script.frames:
            await ws.send(frame)
        script.frames.clear()
        # a few real sessions for the fuzz to hit
        for _ in range(3):
            script.request("session/new", {"cwd": CWD, "mcpServers": []})
        for frame in script.frames:
            await ws.send(frame)
        script.frames.clear()
        async with asyncio.timeout(WAIT), seen:
            await seen.wait_for(lambda: all(i in results for i in script.expected_ids))
        script.sessions = [r["sessionId"] for r in results.values() if r and "sessionId" in r]
        assert len(script.sessions) == 3
        for _ in range(FRAMES):
            script.add_random()
        for frame in script.frames:
            await ws.send(frame)

        def settled() -> bool:
            return (
                all(answers[i] >= 1 for i in script.expected_ids)
                and answers[None] >= script.expected_null
            )

        async with asyncio.timeout(WAIT * 2), seen:
            await seen.wait_for(settled)
        # a last round trip: anything still owed would be a second answer
        await ws.send(json.dumps({"jsonrpc": "2.0", "id": "last", "method": "session/list"}))
        async with asyncio.timeout(WAIT), seen:
            await seen.wait_for(lambda: answers["last"] == 1)
        reader.cancel()

        duplicates = {i: n for i, n in answers.items() if i is not None and n > 1}
        assert duplicates == {}
        assert answers[None] == script.expected_null
        assert set(answers) - {None, "last"} == script.expected_ids
        assert ws.state.name == "OPEN"
