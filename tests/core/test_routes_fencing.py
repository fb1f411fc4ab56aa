"""router.core.routes and the fleet's agreement (issue 32): the epoch a located resume
carries, a session detached where its copy was found stale, and a ``session/new`` placed
again when its backend left it unanswered (tests.routes_driver plays the shell)."""

from __future__ import annotations

import json

from router.core.effects import (
    Abandoned,
    Deliver,
    Detach,
    Dropped,
    Locate,
    OpenLink,
    Place,
    Send,
)
from router.core.health import Health
from router.core.routes import Limits
from router.protocol.acp import EPOCH_META_KEY
from router.protocol.ids import BackendId, SessionId
from tests.routes_driver import (
    Client,
    as_request,
    error_reply,
    new_params,
    prompt,
    reply,
    request,
    result,
    resume,
    sid,
)

A = BackendId("a")


def _sent(effects: object) -> dict[str, object]:
    assert isinstance(effects, tuple)
    (text,) = [e.text for e in effects if isinstance(e, Send)]
    parsed: dict[str, object] = json.loads(text)
    return parsed


def test_a_located_resume_carries_its_epoch_in_meta_and_nothing_else_changes() -> None:
    client = Client()
    text = request(1, "session/resume", sid("s1", cwd="/w", _meta={"traceparent": "x"}))
    assert client.send(text) == (Locate(as_request(text), SessionId("s1")),)
    sent = _sent(client.located(1, "a", epoch=42))
    assert sent["params"] == {
        "sessionId": "s1",
        "cwd": "/w",
        "_meta": {"traceparent": "x", EPOCH_META_KEY: 42},
    }
    # a client's own epoch is the router's to set
    forged = request(2, "session/load", sid("s2", cwd="/w", _meta={EPOCH_META_KEY: 10**12}))
    client.send(forged)
    assert _sent(client.located(2, "a", epoch=7))["params"] == {
        "sessionId": "s2",
        "cwd": "/w",
        "_meta": {EPOCH_META_KEY: 7},
    }


def test_a_located_close_carries_no_epoch() -> None:
    client = Client()
    text = request(1, "session/close", sid("s1"))
    client.send(text)
    assert _sent(client.located(1, "a", epoch=42)) == json.loads(text)


def test_a_failover_resume_carries_its_epoch_too() -> None:
    client = Client(Limits(failover=True))
    client.new_session(1, "a", "s1")
    client.lost("a")
    (locate,) = client.backend_known("a", ("s1",), Health.GONE)[1:]
    assert isinstance(locate, Locate)
    assert locate.internal
    sent = _sent(client.located(locate.request.id, "b", epoch=9))
    assert sent["params"] == {"sessionId": "s1", **new_params(), "_meta": {EPOCH_META_KEY: 9}}


def test_a_session_whose_copy_here_is_stale_is_detached_and_its_prompt_told_to_resume() -> None:
    client = Client()
    client.new_session(1, "a", "s1")
    assert client.stale_copies("s1", "b") == ()  # not the copy it is attached to
    assert client.routes.attached() == {"s1": "a"}
    assert client.stale_copies("s1", "a") == ()
    assert client.changes[-1] == Detach(SessionId("s1"), A)
    assert error_reply(client.send(prompt(2, "s1")), 2, -32010)["sessionId"] == "s1"
    # resumed again: located afresh (where the home is)
    assert client.send(resume(3, "s1")) == (Locate(as_request(resume(3, "s1")), SessionId("s1")),)


def _placed_on_a(client: Client) -> str:
    text = request(1, "session/new", new_params())
    assert client.send(text) == (Place(as_request(text)),)
    effects = client.placed(1, "a")
    assert next(e for e in client.last() if isinstance(e, OpenLink)).backend == "a"
    assert effects == (Send(A, text),)
    return text


def test_a_new_session_its_backend_left_unanswered_goes_elsewhere_and_the_late_copy_is_closed() -> (
    None
):
    client = Client()
    text = _placed_on_a(client)
    assert client.routes.waits_on(1, A)
    assert client.replaced(1, "a", "b") == (Send(BackendId("b"), text),)
    assert not client.routes.waits_on(1, A)
    answer = result(1, sid("s-b"))
    (delivered,) = client.backend("b", answer)
    assert isinstance(delivered, Deliver)
    assert json.loads(delivered.text) == json.loads(answer)
    assert client.routes.attached() == {"s-b": "b"}
    # the frozen backend wakes and answers: the session it made is nobody's
    assert client.backend("a", result(1, sid("s-a"))) == (Abandoned(A, SessionId("s-a")),)
    assert client.routes.attached() == {"s-b": "b"}
    # nothing more is expected of it
    assert all(isinstance(e, Dropped) for e in client.backend("a", result(1, sid("s-a"))))


def test_while_the_late_answer_may_come_its_id_is_in_flight() -> None:
    client = Client()
    _placed_on_a(client)
    client.replaced(1, "a", "b")
    client.backend("b", result(1, sid("s-b")))
    again = request(1, "session/new", new_params())
    refused = client.send(again)
    error_reply(refused, 1, -32600)
    assert "already in flight" in reply(refused)["error"]["message"]
    # its link lost: no answer can come on it, and the id is free again
    client.lost("a")
    assert client.send(again) == (Place(as_request(again)),)


def test_a_late_refusal_makes_nothing_to_close() -> None:
    client = Client()
    _placed_on_a(client)
    client.replaced(1, "a", "b")
    effects = client.backend(
        "a", json.dumps({"jsonrpc": "2.0", "id": 1, "error": {"code": -1, "message": "x"}})
    )
    assert all(isinstance(e, Dropped) for e in effects)
    assert not client.routes.unanswered_on


def test_only_an_unanswered_new_session_there_is_placed_again() -> None:
    client = Client()
    client.new_session(1, "a", "s1")
    client.send(prompt(2, "s1"))
    assert client.replaced(2, "a", "b") == ()  # a prompt turn may run long
    _placed = request(3, "session/new", new_params())
    client.send(_placed)
    client.placed(3, "a")
    assert client.replaced(3, "c", "b") == ()  # not where it went
    assert client.replaced(99, "a", "b") == ()  # answered already
