"""router.core.routes: where a session's requests go, what attaches and detaches it, and
the bounds on sessions and calls in flight (tests.routes_driver plays the shell)."""

from __future__ import annotations

from typing import Any

import pytest

from router.core.effects import (
    AskPool,
    Attach,
    Deliver,
    Detach,
    Learned,
    Locate,
    NotThere,
    Place,
    Query,
    Released,
    Reply,
    Resumed,
    ResumeSent,
    Send,
)
from router.core.routes import Limits
from router.protocol.errors import NoBackendAvailable
from tests.routes_driver import (
    Client,
    as_request,
    dropped,
    error,
    error_reply,
    new_params,
    notification,
    reply,
    request,
    result,
    sid,
)

# -- session/new and session/fork --------------------------------------------------------------


def test_session_new_is_placed_then_forwarded_verbatim_and_attached() -> None:
    client = Client()
    text = '{"jsonrpc":"2.0","id":1,"method":"session/new","params":{"cwd":"/w","mcpServers":[],"_meta":{"x":1}},"extra":[]}'
    assert client.send(text) == (Place(as_request(text)),)
    assert client.placed(1, "b") == (Send("b", text),)
    assert client.changes == []

    response = result(1, sid("s1", modes=None))
    assert client.backend("b", response) == (Deliver(response),)
    # what it made is learned and attached before the client reads the answer
    assert [type(e) for e in client.last()] == [Learned, Attach, Deliver]
    assert client.learned == [Learned("s1", "b", created=True)]
    assert client.routes.attached() == {"s1": "b"}
    assert client.changes == [Attach("s1", "b")]
    assert list(client.routes.calls) == []


def test_a_forked_session_is_attached_where_its_parent_lives() -> None:
    client = Client()
    client.new_session(1, "b", "parent")
    text = request(2, "session/fork", sid("parent", cwd="/w"))
    assert client.send(text) == (Send("b", text),)
    assert client.backend("b", result(2, sid("child"))) == (Deliver(result(2, sid("child"))),)
    assert client.routes.attached() == {"parent": "b", "child": "b"}
    prompt = request(3, "session/prompt", sid("child", prompt=[]))
    assert client.send(prompt) == (Send("b", prompt),)


def test_failed_session_new_attaches_nothing() -> None:
    client = Client()
    client.send(request(1, "session/new", new_params()))
    client.placed(1, "a")
    assert client.backend("a", error(1, -32603)) == (Deliver(error(1, -32603)),)
    assert isinstance(client.send(request(2, "session/new", new_params()))[0], Place)
    client.placed(2, "a")
    answer = result(2, {"noSessionId": True})
    assert client.backend("a", answer) == (Deliver(answer),)
    assert client.routes.attached() == {}
    assert client.changes == []
    assert client.learned == []


# -- requests for a session ----------------------------------------------------------------------


def test_prompt_goes_to_the_attached_backend_verbatim() -> None:
    client = Client()
    client.new_session(1, "b", "s1")
    text = (
        '{ "jsonrpc" : "2.0", "id": 2, "method": "session/prompt",\n'
        '  "params": {"sessionId": "s1", "prompt": [{"type": "text", "text": "h\\u00e9 \\"id\\": 9"}],'
        ' "_meta": {"trace": [1, 2]}}, "unknown": {"id": 3} }'
    )
    assert client.send(text) == (Send("b", text),)
    assert client.routes.calls[2].backend == "b"
    answer = result(2, {"stopReason": "end_turn"})
    assert client.backend("b", answer) == (Deliver(answer),)
    assert list(client.routes.calls) == []


def test_a_response_from_another_backend_settles_nothing() -> None:
    client = Client()
    client.new_session(1, "b", "s1")
    client.send(request(2, "session/prompt", sid("s1")))
    assert dropped(client.backend("a", result(2, {})))
    assert dropped(client.backend("b", result(99, {})))
    assert dropped(client.backend("b", error(None, -32700)))
    assert list(client.routes.calls) == [2]
    assert client.backend("b", result(2, {})) == (Deliver(result(2, {})),)
    assert dropped(client.backend("b", result(2, {})))  # a second answer is dropped


def test_prompt_for_an_unattached_session_is_refused() -> None:
    client = Client()
    client.new_session(1, "a", "s1")
    data = error_reply(client.send(request(2, "session/prompt", sid("elsewhere"))), 2, -32010)
    assert data == {"sessionId": "elsewhere", "retryable": False}
    assert list(client.routes.calls) == []


@pytest.mark.parametrize("params", [None, {}, {"sessionId": 5}, [1]])
def test_session_methods_need_a_session_id(params: Any) -> None:
    error_reply(Client().send(request(3, "session/prompt", params)), 3, -32602)


@pytest.mark.parametrize("method", ["session/resume", "session/status", "session/prompt"])
def test_an_overlong_session_id_is_invalid_params_before_any_probe(method: str) -> None:
    client = Client(Limits(max_session_id_chars=8))
    (fits,) = client.send(request(1, method, sid("s" * 8)))
    assert isinstance(fits, Locate | AskPool | Reply)
    if isinstance(fits, Reply):  # a prompt for a session not attached
        error_reply(fits, 1, -32010)
    assert error_reply(client.send(request(2, method, sid("s" * 9))), 2, -32602) == {}
    assert 2 not in client.routes.calls


@pytest.mark.parametrize("method", ["session/resume", "session/load"])
def test_resume_of_an_unattached_session_is_located_then_attached(method: str) -> None:
    client = Client()
    text = request(5, method, sid("s9", cwd="/w", mcpServers=[]))
    assert client.send(text) == (Locate(as_request(text), "s9"),)
    assert client.located(5, "c") == (ResumeSent(), Send("c", text))
    assert client.backend("c", result(5, {})) == (Resumed("c", "ok"), Deliver(result(5, {})))
    assert client.routes.attached() == {"s9": "c"}
    assert client.changes == [Attach("s9", "c")]
    assert client.learned == [Learned("s9", "c")]


def test_resume_of_an_attached_session_goes_straight_to_its_backend() -> None:
    client = Client()
    client.new_session(1, "a", "s1")
    text = request(2, "session/resume", sid("s1"))
    assert client.send(text) == (Send("a", text),)
    assert client.backend("a", result(2, {})) == (Resumed("a", "ok"), Deliver(result(2, {})))
    assert client.changes == [Attach("s1", "a")]  # attached once, not twice


def test_resume_not_found_relocates_until_the_attempts_run_out() -> None:
    client = Client(Limits(max_resume_attempts=3))
    text = request(5, "session/resume", sid("s9"))
    client.send(text)
    client.located(5, "a")
    relocate = client.backend("a", error(5, -32002, sid("s9")))
    assert relocate == (
        Resumed("a", "not_found"),
        NotThere("s9", "a"),
        Locate(as_request(text), "s9", ("a",)),
    )
    assert list(client.routes.calls) == [5]  # back in flight, to be located again
    assert client.routes.calls[5].backend is None
    assert client.located(5, "b") == (ResumeSent(retry=True), Send("b", text))
    again = client.backend("b", error(5, -32002, sid("s9")))
    assert again == (
        Resumed("b", "not_found"),
        NotThere("s9", "b"),
        Locate(as_request(text), "s9", ("a", "b")),
    )
    assert client.located(5, "c") == (ResumeSent(retry=True), Send("c", text))
    third = error(5, -32002, sid("s9"))
    assert client.backend("c", third) == (Resumed("c", "not_found"), Deliver(third))
    assert list(client.routes.calls) == []
    assert client.routes.attached() == {}


def test_a_retried_resume_attaches_where_it_lands() -> None:
    client = Client()
    client.send(request(5, "session/resume", sid("s9")))
    client.located(5, "a")
    client.backend("a", error(5, -32002, sid("s9")))
    client.located(5, "b")
    assert client.backend("b", result(5, {})) == (Resumed("b", "ok"), Deliver(result(5, {})))
    assert client.routes.attached() == {"s9": "b"}


def test_resume_other_errors_are_delivered_without_relocating() -> None:
    client = Client()
    client.send(request(5, "session/load", sid("s9")))
    client.located(5, "a")
    failed = error(5, -32603)
    assert client.backend("a", failed) == (Resumed("a", "error"), Deliver(failed))
    assert client.routes.attached() == {}


def test_resume_attaches_a_session_that_moved_and_detaches_it_from_the_old_backend() -> None:
    client = Client()
    client.new_session(1, "a", "s1")
    text = request(2, "session/resume", sid("s1"))
    client.send(text)
    relocate = client.backend("a", error(2, -32002))
    assert relocate[-1] == Locate(as_request(text), "s1", ("a",))
    client.located(2, "b")
    client.backend("b", result(2, {}))
    assert client.routes.attached() == {"s1": "b"}
    assert client.changes == [Attach("s1", "a"), Detach("s1", "a"), Attach("s1", "b")]


# -- closing a session -------------------------------------------------------------------------


def test_close_of_an_unattached_session_is_located_but_not_attached() -> None:
    client = Client()
    text = request(6, "session/close", sid("s7"))
    assert client.send(text) == (Locate(as_request(text), "s7"),)
    assert client.located(6, "a") == (Send("a", text),)
    assert client.backend("a", result(6, {})) == (Released("s7"), Deliver(result(6, {})))
    assert client.routes.attached() == {}
    assert client.changes == []


def test_close_of_an_attached_session_detaches_it_on_success() -> None:
    client = Client()
    client.new_session(1, "a", "s1")
    client.send(request(2, "session/close", sid("s1")))
    assert client.backend("a", error(2, -32603)) == (Deliver(error(2, -32603)),)
    assert client.routes.attached() == {"s1": "a"}  # failed: still attached
    text = request(3, "session/close", sid("s1"))
    assert client.send(text) == (Send("a", text),)
    assert client.backend("a", result(3, {})) == (Released("s1"), Deliver(result(3, {})))
    assert client.routes.attached() == {}
    assert client.changes == [Attach("s1", "a"), Detach("s1", "a")]


def test_a_close_answered_not_found_detaches_the_session() -> None:
    client = Client()
    client.new_session(1, "a", "s1")
    client.send(request(2, "session/close", sid("s1")))
    gone = error(2, -32002, {"sessionId": "s1"})
    assert client.backend("a", gone) == (Released("s1"), Deliver(gone))
    assert client.routes.attached() == {}
    error_reply(client.send(request(3, "session/prompt", sid("s1"))), 3, -32010)


def test_a_close_that_fails_otherwise_keeps_the_session_attached() -> None:
    client = Client()
    client.new_session(1, "a", "s1")
    client.send(request(2, "session/close", sid("s1")))
    assert client.backend("a", error(2, -32603)) == (Deliver(error(2, -32603)),)  # not released
    assert client.routes.attached() == {"s1": "a"}


def test_a_backend_saying_not_attached_detaches_the_session() -> None:
    """The reference agent answers -32010 when another instance took the session: the
    next resume must be located, not sent back to it."""
    client = Client()
    client.new_session(1, "a", "s1")
    client.send(request(2, "session/prompt", sid("s1", prompt=[])))
    moved = error(2, -32010, sid("s1"))
    assert client.backend("a", moved) == (Deliver(moved),)
    assert client.routes.attached() == {}
    assert client.changes == [Attach("s1", "a"), Detach("s1", "a")]
    assert isinstance(client.send(request(3, "session/resume", sid("s1")))[0], Locate)


# -- what the router answers itself, and requests with no session --------------------------------


def test_status_and_list_are_handled_by_the_router() -> None:
    client = Client()
    status = request(1, "session/status", sid("s1"))
    assert client.send(status) == (AskPool(Query.STATUS, as_request(status), "s1"),)
    listing = request(2, "session/list", {})
    assert client.send(listing) == (AskPool(Query.LIST, as_request(listing)),)
    assert reply(client.answer(1, {"status": "active"}))["result"] == {"status": "active"}
    error_reply(client.fail(2, NoBackendAvailable()), 2, -32011)
    assert list(client.routes.calls) == []


def test_methods_without_a_session_go_to_the_last_backend_used() -> None:
    client = Client()
    error_reply(client.send(request(1, "_vendor/thing", {})), 1, -32601)
    client.new_session(2, "b", "s1")
    text = request(3, "_vendor/thing", {"x": 1})
    assert client.send(text) == (Send("b", text),)
    note = notification("_vendor/ping", {})
    assert client.send(note) == (Send("b", note),)


def test_notifications_with_no_backend_are_dropped() -> None:
    assert dropped(Client().send(notification("_vendor/ping", {})))


# -- limits ------------------------------------------------------------------------------------


def test_in_flight_limit() -> None:
    client = Client(Limits(max_in_flight=2))
    client.new_session(1, "a", "s1")
    assert client.send(request(2, "session/prompt", sid("s1"))) == (
        Send("a", request(2, "session/prompt", sid("s1"))),
    )
    assert isinstance(client.send(request(3, "session/status", sid("s1")))[0], AskPool)
    data = error_reply(client.send(request(4, "session/prompt", sid("s1"))), 4, -32014)
    assert data["retryable"] is True
    assert sorted(client.routes.calls) == [2, 3]


def test_session_limit() -> None:
    client = Client(Limits(max_sessions=1))
    client.new_session(1, "a", "s1")
    error_reply(client.send(request(2, "session/new", new_params())), 2, -32015)
    data = error_reply(client.send(request(3, "session/resume", sid("s2"))), 3, -32015)
    assert data["sessionId"] == "s2"
    text = request(4, "session/resume", sid("s1"))
    assert client.send(text) == (Send("a", text),)
    assert list(client.routes.calls) == [4]


def test_session_new_in_flight_counts_against_the_session_limit() -> None:
    # on the old main both were forwarded, and the second session ran unrouted
    client = Client(Limits(max_sessions=1))
    assert isinstance(client.send(request(1, "session/new", new_params()))[0], Place)
    client.placed(1, "a")
    error_reply(client.send(request(2, "session/new", new_params())), 2, -32015)
    error_reply(client.send(request(3, "session/resume", sid("s2"))), 3, -32015)
    assert client.backend("a", result(1, sid("s1"))) == (Deliver(result(1, sid("s1"))),)
    assert client.routes.attached() == {"s1": "a"}
    assert client.changes == [Attach("s1", "a")]


def test_a_failed_session_new_frees_its_room() -> None:
    client = Client(Limits(max_sessions=1))
    assert isinstance(client.send(request(1, "session/new", new_params()))[0], Place)
    error_reply(client.fail(1, NoBackendAvailable()), 1, -32011)
    assert isinstance(client.send(request(2, "session/new", new_params()))[0], Place)


def test_a_resume_past_the_session_limit_is_answered_but_not_attached() -> None:
    """A child a backend announces takes the room while a resume is in flight."""
    client = Client(Limits(max_sessions=2))
    client.new_session(1, "a", "p")
    client.send(request(2, "session/resume", sid("s1")))
    update = {"sessionUpdate": "subagent_update", "sessionId": "child"}
    client.backend("a", notification("session/update", {"sessionId": "p", "update": update}))
    assert client.routes.attached() == {"p": "a", "child": "a"}
    client.located(2, "b")
    answer = result(2, {})
    assert client.backend("b", answer) == (Resumed("b", "ok"), Deliver(answer))
    assert client.routes.attached() == {"p": "a", "child": "a"}  # b holds s1: not routed
    error_reply(client.send(request(3, "session/prompt", sid("s1"))), 3, -32010)
