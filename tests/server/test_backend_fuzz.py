"""Hostile backends against the live router: every client request still gets exactly
one answer, and the router stays up.

Two :class:`~tests.hostile.HostileBackend` servers answer each request (on client
links and on the control link) in a seeded random hostile way: garbage frames, answers
to unknown ids, duplicate answers, legal but odd JSON, agent requests and
notifications, stalls, late answers, half-closed and dropped sockets. A client sends
waves of session and extension requests, notifications, replies to agent requests and
``$/cancel_request`` on one connection. Stalled requests are owed an answer once their
link dies, so after the waves the backends drop every socket; then every request must
be answered exactly once, every agent request the client left unanswered must have
been withdrawn, and the connection and the pool must still work.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections import Counter
from typing import Any

import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.protocol import State

from tests.fleet import start_router
from tests.hostile import HostileBackend, start_hostile
from tests.support import CWD, WAIT

WAVES = 12
#: the requests later frames of their session wait behind, in the router
HOLDING = ("session/resume", "session/load", "session/close")
#: the ids of the resumes a failover makes (the router's own)
FAILOVER_ID = "acp-router:failover:"
#: hang-ups after the waves: each answers what the backends held, and may free frames
#: that were waiting behind it, which a backend may hold again
ROUNDS = 20
WAVE = 25


class Client:
    """One client connection: what it sent, and what came back."""

    def __init__(self, ws: ClientConnection, changed: asyncio.Condition, seed: int) -> None:
        self.ws = ws
        self.changed = changed
        self.rng = random.Random(seed)
        self.expected: set[int] = set()
        self.answers: Counter[Any] = Counter()
        self.asked: list[Any] = []  # agent request ids as the client saw them
        self.replied: set[Any] = set()
        self.withdrawn: set[Any] = set()
        self.created: list[str] = []
        #: (id, method, sessionId) of every request, in the order sent
        self.sent: list[tuple[int, str, Any]] = []
        self._next = 0

    async def read(self) -> None:
        async for frame in self.ws:
            message = json.loads(frame)
            method = message.get("method")
            if method == "$/cancel_request":
                self.withdrawn.add(message["params"]["requestId"])
            elif method is not None and "id" in message:
                self.asked.append(message["id"])
            elif method is None:
                self.answers[message.get("id")] += 1
                result = message.get("result")
                if isinstance(result, dict) and isinstance(result.get("sessionId"), str):
                    self.created.append(result["sessionId"])
            async with self.changed:
                self.changed.notify_all()

    async def send(self, message: dict[str, Any]) -> None:
        await self.ws.send(json.dumps({"jsonrpc": "2.0", **message}))

    async def request(self, method: str, params: Any) -> None:
        self._next += 1
        self.expected.add(self._next)
        session = params.get("sessionId") if isinstance(params, dict) else None
        self.sent.append((self._next, method, session))
        await self.send({"id": self._next, "method": method, "params": params})

    def session(self) -> str:
        """Mostly a session the backends created; sometimes one nobody did."""
        if self.created and self.rng.random() < 0.8:
            return self.rng.choice(self.created)
        return f"sess_h{self.rng.choice((1, 2))}_{self.rng.randrange(100, 108)}"

    async def random_frame(self) -> None:
        choice = self.rng.randrange(10)
        if choice in (0, 1):
            await self.request("session/new", {"cwd": CWD, "mcpServers": []})
        elif choice in (2, 3):
            text = [{"type": "text", "text": "fuzz"}]
            await self.request("session/prompt", {"sessionId": self.session(), "prompt": text})
        elif choice == 4:
            await self.request("session/resume", {"sessionId": self.session(), "cwd": CWD})
        elif choice == 5:
            await self.request(
                self.rng.choice(("session/status", "session/list", "_vendor/x")),
                {"sessionId": self.session()},
            )
        elif choice == 6:
            await self.send({"method": "session/cancel", "params": {"sessionId": self.session()}})
        elif choice == 7 and self.asked:
            asked = self.rng.choice(self.asked)
            self.replied.add(asked)
            outcome = {"outcome": {"outcome": "selected", "optionId": "allow"}}
            await self.send({"id": asked, "result": outcome})
        else:
            named = self.rng.randrange(1, self._next + 2)
            await self.send({"method": "$/cancel_request", "params": {"requestId": named}})

    def settled(self, backends: list[HostileBackend]) -> bool:
        """Every request is answered, held by a backend until its link dies, or waiting in
        the router behind its session's resume, load or close (or a failover's resume)
        that is itself one of those."""
        held = set().union(*(b.unanswered for b in backends))
        # sessions whose later frames wait in the router: behind a failover's own resume
        # (held by a backend) from the start, and behind the client's held calls below
        blocking: set[Any] = {
            session
            for b in backends
            for request_id, session in b.unanswered_sessions.items()
            if isinstance(request_id, str) and request_id.startswith(FAILOVER_ID)
        }
        for request_id, method, session in self.sent:
            if self.answers[request_id]:
                continue
            if request_id not in held and session not in blocking:
                return False
            if method in HOLDING:
                blocking.add(session)
        return True

    def all_answered(self) -> bool:
        return all(self.answers[i] for i in self.expected)

    def owed(self, backends: list[HostileBackend]) -> str:
        """What is still unanswered, for a failure message."""
        held = set().union(*(b.unanswered for b in backends))
        waiting = [(i, m, s, i in held) for i, m, s in self.sent if not self.answers[i]]
        behaviours = [b.behaviours[-8:] for b in backends]
        return f"unanswered (id, method, session, held): {waiting}; last behaviours {behaviours}"

    async def wait_settled(self, backends: list[HostileBackend]) -> None:
        try:
            async with asyncio.timeout(WAIT), self.changed:
                await self.changed.wait_for(lambda: self.settled(backends))
        except TimeoutError:
            raise AssertionError(self.owed(backends)) from None


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_hostile_backends_cannot_cost_a_request_its_answer(seed: int) -> None:
    changed = asyncio.Condition()
    async with (
        start_hostile("h1", seed=seed, changed=changed) as h1,
        start_hostile("h2", seed=seed + 1000, changed=changed) as h2,
        start_router(
            [("h1", h1.url), ("h2", h2.url)],
            probe={"timeout_ms": 200},
            router={"connect_timeout_ms": 1000},
            # failover (on by default) holds a lost session's frames until its backend is
            # known back or gone; a hostile backend may be neither: bounded here well
            # inside the test's wait, so every frame is still owed its one answer
            failover={"wait_ms": 300},
        ) as router,
        connect(router.url, max_size=None) as ws,
    ):
        backends = [h1, h2]
        client = Client(ws, changed, seed)
        reader = asyncio.create_task(client.read())
        await client.request("initialize", {"protocolVersion": 1})
        for _ in range(WAVES):
            for _ in range(WAVE):
                await client.random_frame()
            await client.wait_settled(backends)
        for _ in range(ROUNDS):  # what the backends held is owed an answer now
            for backend in backends:
                backend.hang_up_all()
            await client.wait_settled(backends)
            if client.all_answered():
                break
        assert client.all_answered(), client.owed(backends)
        for backend in backends:  # links opened since: their agent requests go too
            backend.hang_up_all()
        async with asyncio.timeout(WAIT), changed:
            await changed.wait_for(lambda: set(client.asked) - client.replied <= client.withdrawn)

        await router.wait_backends(2)  # the control links came back
        await client.request("session/list", {})  # anything still owed would come twice
        last = max(client.expected)
        async with asyncio.timeout(WAIT), changed:
            await changed.wait_for(lambda: client.answers[last] == 1)
        reader.cancel()

        behaviours = Counter(h1.behaviours + h2.behaviours)
        assert behaviours.total() >= 15, behaviours  # the fuzz reached the backends
        assert len(behaviours) >= 6, behaviours
        assert {i: n for i, n in client.answers.items() if n != 1} == {}, behaviours
        assert set(client.answers) == client.expected
        assert ws.state is State.OPEN
