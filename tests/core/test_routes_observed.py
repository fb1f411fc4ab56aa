"""What the routing core tells the shell of the client requests it observes (the request
log, trace context): each forward (``Forwarded``) and the one answer (``Answered``),
right after the answer itself, for every way a request ends; nothing for the others."""

from __future__ import annotations

from router.core.effects import Answered, Deliver, Forwarded, Locate, Reply, ResumeSent, Send
from router.protocol.errors import RouterStopping
from router.protocol.ids import BackendId, SessionId
from tests.routes_driver import (
    Client,
    as_request,
    error,
    new_params,
    prompt,
    request,
    result,
    resume,
    sid,
)


def test_a_forwarded_request_is_told_forwarded_then_answered() -> None:
    client = Client()
    client.new_session(1, "a", "s1")
    text = prompt(2, "s1")
    call = as_request(text)
    assert client.send(text, observed=True) == (Forwarded(call, BackendId("a")), Send("a", text))
    answer = result(2, {"stopReason": "end_turn"})
    assert client.backend("a", answer) == (
        Deliver(answer),
        Answered(call, SessionId("s1"), BackendId("a")),
    )


def test_nothing_is_told_of_a_request_not_observed() -> None:
    client = Client()
    client.new_session(1, "a", "s1")
    text = prompt(2, "s1")
    assert client.send(text) == (Send("a", text),)
    answer = error(2, -32000)
    assert client.backend("a", answer) == (Deliver(answer),)


def test_an_error_answer_is_told_with_its_code() -> None:
    client = Client()
    client.new_session(1, "a", "s1")
    text = prompt(2, "s1")
    client.send(text, observed=True)
    answer = error(2, -32000)
    told = client.backend("a", answer)[-1]
    assert told == Answered(as_request(text), SessionId("s1"), BackendId("a"), -32000)


def test_a_new_session_is_told_with_the_id_it_made() -> None:
    client = Client()
    text = request(1, "session/new", new_params())
    client.send(text, observed=True)
    assert client.placed(1, "a") == (Forwarded(as_request(text), BackendId("a")), Send("a", text))
    answer = result(1, sid("made"))
    assert client.backend("a", answer)[-1] == Answered(
        as_request(text), SessionId("made"), BackendId("a")
    )


def test_a_resume_located_twice_is_told_forwarded_twice() -> None:
    client = Client()
    text = resume(1, "s1")
    call = as_request(text)
    assert client.send(text, observed=True) == (Locate(call, SessionId("s1")),)
    assert client.located(1, "a") == (
        ResumeSent(),
        Forwarded(call, BackendId("a")),
        Send("a", text),
    )
    relocated = client.backend("a", error(1, -32002))
    assert isinstance(relocated[-1], Locate)
    sent = client.located(1, "b")
    assert sent == (ResumeSent(retry=True), Forwarded(call, BackendId("b")), Send("b", text))
    assert client.backend("b", result(1, {}))[-1] == Answered(call, SessionId("s1"), BackendId("b"))


def test_a_request_the_router_answers_is_told_with_no_backend() -> None:
    client = Client()
    text = request(1, "session/list", {})
    client.send(text, observed=True)
    answered = client.answer(1, {"sessions": []})
    assert isinstance(answered[0], Reply)
    assert answered[1] == Answered(as_request(text), None, None)


def test_a_request_refused_at_once_is_told() -> None:
    client = Client()
    text = prompt(1, "nowhere")
    refused = client.send(text, observed=True)
    assert isinstance(refused[0], Reply)
    assert refused[1] == Answered(as_request(text), SessionId("nowhere"), None, refused[0].error)
    first = prompt(2, "s1")
    client.new_session(3, "a", "s1")
    client.send(first, observed=True)
    again = prompt(2, "s1")
    refused = client.send(again, observed=True)  # its id is in flight
    assert refused[1] == Answered(as_request(again), SessionId("s1"), None, -32600)


def test_requests_in_flight_when_the_client_goes_are_told_gone() -> None:
    client = Client()
    client.new_session(1, "a", "s1")
    text = prompt(2, "s1")
    client.send(text, observed=True)
    client.send(prompt(3, "s1"))  # not observed: nothing told
    gone = [e for e in client.client_gone() if isinstance(e, Answered)]
    assert gone == [Answered(as_request(text), SessionId("s1"), BackendId("a"), gone=True)]


def test_requests_in_flight_when_the_router_stops_are_told_refused() -> None:
    client = Client()
    client.new_session(1, "a", "s1")
    text = prompt(2, "s1")
    client.send(text, observed=True)
    held = resume(4, "s2")
    client.send(held, observed=True)  # being located
    told = [e for e in client.abandon(RouterStopping()) if isinstance(e, Answered)]
    code = RouterStopping.code
    assert told == [
        Answered(as_request(text), SessionId("s1"), BackendId("a"), code),
        Answered(as_request(held), SessionId("s2"), None, code),
    ]
