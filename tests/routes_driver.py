"""The routing core of one client connection (router.core.routes), driven by hand.

Frame builders make the JSON-RPC text a client or a backend would send. :class:`Client`
plays the shell (router.server.connection.client): it hands each frame to the core, carries out the
effects a shell records (links opened and closed, attachments, locations learned) and
hands back the rest, in order, for the test to check; ``last()`` is the whole tuple of
the last call. Work that waits on the pool (Initialize, Place, Locate, AskPool,
AwaitBackend) comes back to the test, which plays the pool by calling ``initialized``,
``placed``, ``located``, ``answer``, ``fail`` or ``backend_known``.
"""

from __future__ import annotations

import json
from typing import Any

import orjson

from router.core.effects import (
    Attach,
    CancelTurn,
    Change,
    CloseLink,
    Deliver,
    Detach,
    Dropped,
    Effect,
    Effects,
    Initialize,
    Learned,
    Notify,
    OpenLink,
    Place,
    Reply,
    Send,
)
from router.core.health import Health
from router.core.quotas import Budget
from router.core.routes import ClientRoutes, Limits
from router.protocol.errors import ErrorObject, JsonRpcError
from router.protocol.ids import BackendId, SessionId
from router.protocol.jsonrpc import Request, RequestId
from router.protocol.reading import parse


def _alone(session_id: SessionId, backend: BackendId) -> int:
    """No other client connection holds any session (the directory's count, for one
    connection driven alone)."""
    return 0


# -- frames ------------------------------------------------------------------------------------


def request(request_id: RequestId, method: str, params: Any = None) -> str:
    obj: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": method}
    if params is not None:
        obj["params"] = params
    return json.dumps(obj)


def notification(method: str, params: Any) -> str:
    return json.dumps({"jsonrpc": "2.0", "method": method, "params": params})


def result(request_id: RequestId, value: Any) -> str:
    return json.dumps({"jsonrpc": "2.0", "id": request_id, "result": value})


def error(request_id: RequestId | None, code: int, data: Any = None) -> str:
    err: dict[str, Any] = {"code": code, "message": "nope"}
    if data is not None:
        err["data"] = data
    return json.dumps({"jsonrpc": "2.0", "id": request_id, "error": err})


def as_request(text: str) -> Request:
    message = parse(text)
    assert isinstance(message, Request)
    return message


def new_params() -> dict[str, Any]:
    return {"cwd": "/work", "mcpServers": []}


def sid(session_id: str, **more: Any) -> dict[str, Any]:
    return {"sessionId": session_id, **more}


def resume(request_id: RequestId, session_id: str) -> str:
    return request(request_id, "session/resume", sid(session_id, cwd="/w"))


def prompt(request_id: RequestId, session_id: str) -> str:
    return request(request_id, "session/prompt", sid(session_id, prompt=[]))


#: a client's ``authenticate``, as it came
AUTH = (
    '{"jsonrpc":"2.0","id":"auth-1","method":"authenticate","params":{"methodId":"key","_meta":{}}}'
)

# -- reading effects ---------------------------------------------------------------------------


def one(effects: Effect | Effects) -> Effect:
    """The one effect of ``effects`` (or ``effects`` itself, when it is one)."""
    if not isinstance(effects, tuple):
        return effects
    assert len(effects) == 1, effects
    return effects[0]


def reply(effects: Effect | Effects) -> dict[str, Any]:
    """The router's own message, when ``effects`` is just that."""
    effect = one(effects)
    assert isinstance(effect, Reply), effect
    decoded: dict[str, Any] = orjson.loads(effect.text)
    return decoded


def notified(effects: Effect | Effects) -> dict[str, Any]:
    """The router's own notification, when ``effects`` is just that."""
    effect = one(effects)
    assert isinstance(effect, Notify), effect
    decoded: dict[str, Any] = orjson.loads(effect.text)
    return decoded


def delivered(effects: Effect | Effects) -> dict[str, Any]:
    """A backend's frame to the client, when ``effects`` is just that."""
    effect = one(effects)
    assert isinstance(effect, Deliver), effect
    decoded: dict[str, Any] = orjson.loads(effect.text)
    return decoded


def error_reply(effects: Effect | Effects, request_id: RequestId, code: int) -> dict[str, Any]:
    """The router's error answer to ``request_id`` with ``code`` (checked): its data."""
    effect = one(effects)
    decoded = reply(effect)
    assert decoded["id"] == request_id
    assert decoded["error"]["code"] == code, decoded
    assert isinstance(effect, Reply)
    assert (effect.answers, effect.error) == (request_id, code)  # counted by its code
    data: dict[str, Any] = decoded["error"].get("data") or {}
    return data


def dropped(effects: Effect | Effects) -> bool:
    """Whether ``effects`` is one ignored frame and nothing else."""
    return isinstance(one(effects), Dropped)


def routed(effects: Effects) -> tuple[tuple[BackendId, ...], str]:
    """An ``authenticate`` round going out: the backends it goes to, and the router id it
    carries (the client's frame as it came, under that id)."""
    assert effects, "no round went out"
    texts = set()
    backends = []
    for effect in effects:
        assert isinstance(effect, Send), effect
        texts.add(effect.text)
        backends.append(effect.backend)
    (text,) = texts
    routed_id = as_request(text).id
    assert isinstance(routed_id, str)
    assert text == AUTH.replace('"auth-1"', orjson.dumps(routed_id).decode())
    return tuple(backends), routed_id


# -- driving -----------------------------------------------------------------------------------


class Client:
    """A ClientRoutes and what its shell records: the links it holds (``opened``,
    ``closed``, ``linked``), the attachments (``changes``) and the locations learned
    (``learned``). Every call returns the other effects, in order."""

    def __init__(
        self,
        limits: Limits | None = None,
        *,
        initialized: bool = True,
        budget: Budget | None = None,  # None: no rate limits
    ) -> None:
        self.routes = ClientRoutes(limits or Limits(), budget)
        self._last: Effects = ()
        self.changes: list[Change] = []
        self.learned: list[Learned] = []
        #: the prompt turns the core cancelled as their client left
        self.cancelled: list[CancelTurn] = []
        self.opened: list[OpenLink] = []
        self.closed: list[CloseLink] = []
        self.linked: set[BackendId] = set()
        #: backends the test spoke for (a backend that speaks has a link to the shell)
        self.heard: set[BackendId] = set()
        if initialized:
            text = request("init", "initialize", {"protocolVersion": 1})
            assert self.send(text) == (Initialize(as_request(text)),)
            assert self.routes.initialize == as_request(text)
            reply(self.initialized("init", {"protocolVersion": 1}))

    def carry_out(self, effects: Effects) -> Effects:
        """Record what a shell records; the rest, in order. A frame goes only on a link
        the core opened before it (or one whose backend spoke)."""
        self._last = effects
        rest: list[Effect] = []
        for effect in effects:
            if isinstance(effect, OpenLink):
                assert effect.backend not in self.linked, f"a second link to {effect.backend}"
                self.linked.add(effect.backend)
                self.opened.append(effect)
            elif isinstance(effect, CloseLink):
                assert effect.backend in self.linked, f"closed {effect.backend}: no link"
                self.linked.discard(effect.backend)
                self.closed.append(effect)
            elif isinstance(effect, Attach | Detach):
                self.changes.append(effect)
            elif isinstance(effect, Learned):
                self.learned.append(effect)
            elif isinstance(effect, CancelTurn):
                self.cancelled.append(effect)
            else:
                if isinstance(effect, Send):
                    assert effect.backend in self.linked | self.heard, f"no link: {effect}"
                rest.append(effect)
        return tuple(rest)

    def last(self) -> Effects:
        """Every effect of the last call, in order, those recorded included."""
        return self._last

    # -- the client and its backends ---------------------------------------------------------

    def send(
        self,
        text: str,
        claimed: str | None = None,
        *,
        observed: bool = False,
        now: float = 0.0,
    ) -> Effects:
        """A frame from the client (``claimed``: the home its hinted session id named; a
        request the shell ``observed``: its forwards and answer told), come at ``now``."""
        home = BackendId(claimed) if claimed is not None else None
        return self.carry_out(self.routes.receive_client(parse(text), home, observed, now))

    def backend(self, backend: str, text: str) -> Effects:
        """A frame from ``backend``."""
        self.heard.add(BackendId(backend))
        return self.carry_out(self.routes.receive_backend(BackendId(backend), parse(text)))

    def lost(
        self, backend: str, refused: ErrorObject | None = None, reason: str | None = None
    ) -> Effects:
        """The link to ``backend`` ended."""
        self.linked.discard(BackendId(backend))
        self.heard.discard(BackendId(backend))
        return self.carry_out(self.routes.backend_lost(BackendId(backend), refused, reason))

    def client_gone(self) -> Effects:
        return self.carry_out(self.routes.client_gone(_alone))

    def abandon(self, error: JsonRpcError) -> Effects:
        """The router stops: no other connection holds any session."""
        return self.carry_out(self.routes.abandon(error, _alone))

    # -- the pool's answers ------------------------------------------------------------------

    def initialized(
        self, request_id: RequestId, capabilities: Any, only: str | None = None
    ) -> Effects:
        backend = None if only is None else BackendId(only)
        return self.carry_out(self.routes.initialized(request_id, capabilities, backend))

    def placed(self, request_id: RequestId, backend: str) -> Effects:
        return self.carry_out(self.routes.placed(request_id, BackendId(backend)))

    def located(self, request_id: RequestId, backend: str, epoch: int | None = None) -> Effects:
        return self.carry_out(self.routes.located(request_id, BackendId(backend), epoch))

    def replaced(self, request_id: RequestId, unanswered: str, backend: str) -> Effects:
        """The ``session/new`` ``request_id`` on ``unanswered`` goes to ``backend``."""
        moved = self.routes.replaced(request_id, BackendId(unanswered), BackendId(backend))
        return self.carry_out(moved)

    def stale_copies(self, session_id: str, *backends: str) -> Effects:
        stale = frozenset(BackendId(b) for b in backends)
        return self.carry_out(self.routes.stale_copies(SessionId(session_id), stale))

    def open_ahead(self, request_id: RequestId | None, backend: str) -> Effects:
        return self.carry_out(self.routes.open_ahead(request_id, BackendId(backend)))

    def answer(self, request_id: RequestId, value: Any) -> Effects:
        return self.carry_out(self.routes.answer(request_id, value))

    def fail(self, request_id: RequestId, failure: JsonRpcError | ErrorObject) -> Effects:
        return self.carry_out(self.routes.fail(request_id, failure))

    def backend_known(self, backend: str, sessions: tuple[str, ...], health: Health) -> Effects:
        known = tuple(SessionId(s) for s in sessions)
        return self.carry_out(self.routes.backend_known(BackendId(backend), known, health))

    # -- a session made -------------------------------------------------------------------------

    def new_session(self, request_id: RequestId, backend: str, session_id: str) -> None:
        """A ``session/new`` placed on ``backend``, which makes ``session_id``."""
        text = request(request_id, "session/new", new_params())
        assert self.send(text) == (Place(as_request(text)),)
        assert self.placed(request_id, backend) == (Send(BackendId(backend), text),)
        answer = result(request_id, sid(session_id))
        assert self.backend(backend, answer) == (Deliver(answer),)
        assert self.routes.attached()[SessionId(session_id)] == backend
