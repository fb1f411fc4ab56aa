"""router.core: the prompt turns a client connection leaves running are cancelled.

When a client connection goes (``client_gone``) or is closed by the router
(``abandon``), each ``session/prompt`` it forwarded and got no answer to becomes a
:class:`~router.core.effects.CancelTurn` for its session and backend, unless another
client connection of this router has that session attached there: the replica's
:class:`~router.core.directory.Directory`, which these tests keep as the shell does
(every Attach and Detach recorded), says so. ``router.cancel_abandoned_turns`` off:
nothing is cancelled.
"""

from __future__ import annotations

import json
from typing import Any

import orjson

from router.core.directory import Bounds, Directory
from router.core.effects import (
    Attach,
    CancelTurn,
    Detach,
    Effects,
    Place,
    Reply,
    Send,
)
from router.core.routes import ClientRoutes, Limits
from router.protocol.errors import RouterStopping
from router.protocol.ids import BackendId, SessionId
from router.protocol.jsonrpc import RequestId
from router.protocol.reading import parse


def frame(request_id: RequestId, method: str, params: dict[str, Any]) -> str:
    return json.dumps({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params})


def prompt(request_id: RequestId, session_id: str) -> str:
    params = {"sessionId": session_id, "prompt": [{"type": "text", "text": "hi"}]}
    return frame(request_id, "session/prompt", params)


class Replica:
    """One router replica's directory, shared by its client connections."""

    def __init__(self) -> None:
        self.directory = Directory(Bounds(), clock=lambda: 0.0, salt="test")

    def connect(self, limits: Limits | None = None) -> Connection:
        return Connection(self, limits)


class Connection:
    """A client connection's core, with the attachments it reports recorded in the
    replica's directory, as the shell records them."""

    def __init__(self, replica: Replica, limits: Limits | None) -> None:
        self.replica = replica
        self.routes = ClientRoutes(limits or Limits())
        self.carry(self.routes.receive_client(parse(frame("init", "initialize", {}))))
        self.carry(self.routes.initialized("init", {"protocolVersion": 1}))

    def carry(self, effects: Effects) -> Effects:
        self.replica.directory.record(e for e in effects if isinstance(e, Attach | Detach))
        return effects

    def client(self, text: str) -> Effects:
        return self.carry(self.routes.receive_client(parse(text)))

    def backend(self, backend: str, reply: dict[str, Any]) -> Effects:
        text = json.dumps({"jsonrpc": "2.0", **reply})
        return self.carry(self.routes.receive_backend(BackendId(backend), parse(text)))

    def new_session(self, request_id: RequestId, backend: str, session_id: str) -> None:
        (place,) = self.client(frame(request_id, "session/new", {"cwd": "/w", "mcpServers": []}))
        assert isinstance(place, Place)
        self.carry(self.routes.placed(request_id, BackendId(backend)))
        self.backend(backend, {"id": request_id, "result": {"sessionId": session_id}})
        assert self.routes.attached()[SessionId(session_id)] == backend

    def resume(self, request_id: RequestId, backend: str, session_id: str) -> None:
        """Resume ``session_id`` here: located on ``backend``, which answers it."""
        params = {"sessionId": session_id, "cwd": "/w", "mcpServers": []}
        self.client(frame(request_id, "session/resume", params))
        self.carry(self.routes.located(request_id, BackendId(backend)))
        self.backend(backend, {"id": request_id, "result": {}})
        assert self.routes.attached()[SessionId(session_id)] == backend

    def prompt(self, request_id: RequestId, session_id: str) -> None:
        sent = self.client(prompt(request_id, session_id))
        assert any(isinstance(e, Send) for e in sent), sent

    def gone(self) -> Effects:
        return self.carry(self.routes.client_gone(self.replica.directory.attached_count))

    def abandoned(self) -> Effects:
        attached_count = self.replica.directory.attached_count
        return self.carry(self.routes.abandon(RouterStopping(), attached_count))


def turn_running(replica: Replica, limits: Limits | None = None) -> Connection:
    """A connection with session ``s1`` on backend ``a`` and a prompt of it in flight."""
    connection = replica.connect(limits)
    connection.new_session(1, "a", "s1")
    connection.prompt(2, "s1")
    return connection


def cancels(effects: Effects) -> list[tuple[str, str, str]]:
    """(session, backend, why) of each CancelTurn, checking the frame each carries."""
    found: list[tuple[str, str, str]] = []
    for effect in effects:
        if isinstance(effect, CancelTurn):
            assert orjson.loads(effect.text) == {
                "jsonrpc": "2.0",
                "method": "session/cancel",
                "params": {"sessionId": effect.session_id},
            }
            found.append((effect.session_id, effect.backend, effect.why))
    return found


def test_a_prompt_in_flight_is_cancelled_when_its_client_goes() -> None:
    connection = turn_running(Replica())
    gone = connection.gone()
    assert cancels(gone) == [("s1", "a", "client_gone")]
    # the cancel goes out before the session is detached (the link is still there)
    assert isinstance(gone[0], CancelTurn)
    assert Detach(SessionId("s1"), BackendId("a")) in gone


def test_a_connection_closed_by_the_router_after_its_client_went_cancels_nothing_twice() -> None:
    """A stop or a revoked token reaches a connection whose client has just gone (its end
    still under way): the turn was cancelled once, and the close adds nothing."""
    connection = turn_running(Replica())
    assert cancels(connection.gone()) == [("s1", "a", "client_gone")]
    assert connection.abandoned() == ()
    # the other order: closed by the router, then its client goes: one cancel in all
    connection = turn_running(Replica())
    assert cancels(connection.abandoned()) == [("s1", "a", "stopping")]
    assert cancels(connection.gone()) == []


def test_prompts_in_flight_on_several_backends_are_each_cancelled_once() -> None:
    connection = Replica().connect()
    connection.new_session(1, "a", "s1")
    connection.new_session(2, "b", "s2")
    connection.new_session(3, "a", "s3")  # idle: no turn to cancel
    connection.prompt(4, "s1")
    connection.prompt(5, "s2")
    connection.prompt(6, "s1")  # a second prompt of the same turn's session: one cancel
    assert sorted(cancels(connection.gone())) == [
        ("s1", "a", "client_gone"),
        ("s2", "b", "client_gone"),
    ]


def test_no_cancel_for_a_prompt_already_answered() -> None:
    connection = turn_running(Replica())
    connection.backend("a", {"id": 2, "result": {"stopReason": "end_turn"}})
    assert cancels(connection.gone()) == []


def test_no_cancel_for_a_prompt_held_behind_a_resume() -> None:
    connection = Replica().connect()
    params = {"sessionId": "s1", "cwd": "/w", "mcpServers": []}
    connection.client(frame(1, "session/resume", params))
    assert connection.client(prompt(2, "s1")) == ()  # waits: it never reached a backend
    assert cancels(connection.gone()) == []


def test_no_cancel_on_a_link_that_was_lost() -> None:
    connection = turn_running(Replica())
    connection.carry(connection.routes.backend_lost(BackendId("a")))  # answered -32013
    assert cancels(connection.gone()) == []


def test_no_cancel_for_a_session_another_connection_holds_on_that_backend() -> None:
    replica = Replica()
    first = turn_running(replica)
    replica.connect().resume(1, "a", "s1")
    assert cancels(first.gone()) == []
    assert replica.directory.attached_count(SessionId("s1"), BackendId("a")) == 1  # the second's


def test_a_session_held_elsewhere_on_another_backend_is_still_cancelled() -> None:
    replica = Replica()
    first = turn_running(replica)
    replica.connect().resume(1, "b", "s1")  # another copy: not the backend the turn runs on
    assert cancels(first.gone()) == [("s1", "a", "client_gone")]


def test_the_last_connection_to_go_cancels_the_turn_it_sent() -> None:
    replica = Replica()
    first, second = replica.connect(), replica.connect()
    first.new_session(1, "a", "s1")
    second.resume(1, "a", "s1")
    second.prompt(2, "s1")
    assert cancels(first.gone()) == []  # it had no turn running
    assert cancels(second.gone()) == [("s1", "a", "client_gone")]


def test_the_router_stopping_cancels_before_it_refuses() -> None:
    connection = turn_running(Replica())
    abandoned = connection.abandoned()
    assert cancels(abandoned) == [("s1", "a", "stopping")]
    refusal = abandoned[1]
    assert isinstance(refusal, Reply)
    assert (refusal.answers, refusal.error) == (2, -32013)
    assert cancels(connection.gone()) == []  # cancelled once, not again when it closes


def test_a_stopping_router_cancels_a_turn_another_connection_holds_too() -> None:
    """Every connection closes: the other holder does not keep the turn running (before,
    it did, and no connection cancelled it)."""
    replica = Replica()
    first = turn_running(replica)
    second = replica.connect()
    second.resume(1, "a", "s1")
    assert cancels(first.abandoned()) == [("s1", "a", "stopping")]
    assert cancels(second.abandoned()) == []  # it had no turn running


def test_a_connection_closed_alone_leaves_a_turn_another_connection_holds() -> None:
    replica = Replica()
    first = turn_running(replica)
    replica.connect().resume(1, "a", "s1")
    attached_count = replica.directory.attached_count
    revoked = first.carry(first.routes.abandon(RouterStopping(), attached_count, "client_gone"))
    assert cancels(revoked) == []


def test_a_connection_the_router_closes_says_so() -> None:
    connection = turn_running(Replica())
    attached_count = connection.replica.directory.attached_count
    revoked = connection.routes.abandon(RouterStopping(), attached_count, "client_gone")
    assert cancels(revoked) == [("s1", "a", "client_gone")]


def test_nothing_is_cancelled_with_the_setting_off() -> None:
    off = Limits(cancel_abandoned_turns=False)
    gone, stopped = turn_running(Replica(), off), turn_running(Replica(), off)
    assert cancels(gone.gone()) == []
    assert cancels(stopped.abandoned()) == []
