"""router.core.routes: per-session order. Frames for a session wait behind its resume, load
or close, and come back routed, in arrival order, inside the effects of the call that
settles it (router.core.phases; tests.routes_driver plays the shell)."""

from __future__ import annotations

from router.core.effects import (
    AskPool,
    Attach,
    Deliver,
    Dropped,
    Learned,
    Locate,
    NotThere,
    Query,
    Released,
    Resumed,
    ResumeSent,
    Send,
)
from router.core.routes import Limits
from router.protocol.errors import LocateInconclusive
from tests.routes_driver import (
    Client,
    as_request,
    dropped,
    error,
    error_reply,
    notification,
    prompt,
    request,
    result,
    resume,
    sid,
)


def test_a_pipelined_prompt_waits_for_the_resume_then_goes_where_it_attached() -> None:
    client = Client()
    assert client.send(resume(1, "s1")) == (Locate(as_request(resume(1, "s1")), "s1"),)
    assert client.send(prompt(2, "s1")) == ()  # it waits
    assert client.routes.calls[2].held
    # not while the resume is in flight
    assert client.located(1, "b") == (ResumeSent(), Send("b", resume(1, "s1")))
    assert client.backend("b", result(1, {})) == (
        Resumed("b", "ok"),
        Deliver(result(1, {})),
        Send("b", prompt(2, "s1")),
    )
    # routed once the session is attached, after its answer
    assert [type(e) for e in client.last()] == [Resumed, Learned, Attach, Deliver, Send]
    assert client.routes.calls[2].backend == "b"
    assert not client.routes.calls[2].held


def test_held_frames_get_what_the_failed_resume_leaves_them() -> None:
    client = Client()
    client.send(resume(1, "s1"))
    assert client.send(prompt(2, "s1")) == ()
    assert client.send(notification("session/cancel", sid("s1"))) == ()
    answer, first, second = client.fail(1, LocateInconclusive())
    error_reply(answer, 1, LocateInconclusive.code)
    data = error_reply(first, 2, -32010)  # truthful: the session is not attached here
    assert data["sessionId"] == "s1"
    assert isinstance(second, Dropped)
    assert list(client.routes.calls) == []


def test_other_sessions_are_not_held() -> None:
    client = Client()
    client.new_session(1, "a", "s2")
    client.send(resume(2, "s1"))
    assert client.send(prompt(3, "s2")) == (Send("a", prompt(3, "s2")),)
    cancel = notification("session/cancel", sid("s2"))
    assert client.send(cancel) == (Send("a", cancel),)
    status = request(4, "session/status", sid("s3"))
    assert client.send(status) == (AskPool(Query.STATUS, as_request(status), "s3"),)


def test_a_resume_of_an_attached_session_holds_it_too() -> None:
    """Its answer may move the session (a -32002 relocates): later frames wait for it."""
    client = Client()
    client.new_session(1, "a", "s1")
    assert client.send(resume(2, "s1")) == (Send("a", resume(2, "s1")),)
    assert client.send(prompt(3, "s1")) == ()
    # relocating: still in flight, and the prompt still waits
    assert client.backend("a", error(2, -32002)) == (
        Resumed("a", "not_found"),
        NotThere("s1", "a"),
        Locate(as_request(resume(2, "s1")), "s1", ("a",)),
    )
    client.located(2, "b")
    assert client.backend("b", result(2, {})) == (
        Resumed("b", "ok"),
        Deliver(result(2, {})),
        Send("b", prompt(3, "s1")),
    )


def test_a_released_resume_holds_the_frames_behind_it() -> None:
    client = Client()
    client.send(resume(1, "s1"))
    client.send(prompt(2, "s1"))
    assert client.send(resume(3, "s1")) == ()
    client.send(prompt(4, "s1"))
    client.located(1, "b")
    assert client.backend("b", result(1, {})) == (
        Resumed("b", "ok"),
        Deliver(result(1, {})),
        Send("b", prompt(2, "s1")),
        Send("b", resume(3, "s1")),  # attached now: straight there, and holding
    )
    assert client.routes.calls[4].held
    assert client.send(prompt(5, "s1")) == ()  # behind prompt 4
    assert client.backend("b", result(3, {})) == (
        Resumed("b", "ok"),
        Deliver(result(3, {})),
        Send("b", prompt(4, "s1")),
        Send("b", prompt(5, "s1")),
    )
    assert client.send(prompt(6, "s1")) == (Send("b", prompt(6, "s1")),)


def test_frames_that_waited_go_before_a_frame_that_arrives_after_them() -> None:
    """They go out within the call that settles their holder, so a frame that arrives
    next cannot pass them."""
    client = Client()
    client.send(resume(1, "s1"))
    client.send(prompt(2, "s1"))
    client.send(prompt(3, "s1"))
    client.located(1, "b")
    assert client.backend("b", result(1, {}))[-2:] == (
        Send("b", prompt(2, "s1")),
        Send("b", prompt(3, "s1")),
    )
    assert client.send(prompt(4, "s1")) == (Send("b", prompt(4, "s1")),)


def test_a_close_of_a_detached_session_holds_it() -> None:
    client = Client()
    close = request(1, "session/close", sid("s1"))
    assert client.send(close) == (Locate(as_request(close), "s1"),)
    assert client.send(resume(2, "s1")) == ()
    client.located(1, "b")
    assert client.backend("b", result(1, {})) == (
        Released("s1"),
        Deliver(result(1, {})),
        Locate(as_request(resume(2, "s1")), "s1"),
    )


def test_a_cancel_request_for_a_held_request_waits_behind_it() -> None:
    client = Client()
    client.send(resume(1, "s1"))
    client.send(prompt(2, "s1"))
    cancel = notification("$/cancel_request", {"requestId": 2})
    assert client.send(cancel) == ()
    client.located(1, "b")
    assert client.backend("b", result(1, {}))[-2:] == (
        Send("b", prompt(2, "s1")),
        Send("b", cancel),
    )


def test_held_frames_count_against_the_in_flight_limit() -> None:
    client = Client(Limits(max_in_flight=3))
    client.send(resume(1, "s1"))
    assert client.send(prompt(2, "s1")) == ()
    assert client.send(notification("session/cancel", sid("s1"))) == ()
    error_reply(client.send(prompt(3, "s1")), 3, -32014)
    assert dropped(client.send(notification("session/cancel", sid("s1"))))
    assert sorted(client.routes.calls) == [1, 2]


def test_a_claimed_home_goes_with_its_resumes_locates_held_or_located_again() -> None:
    """The home a client's hinted id named is this call's guess: its locate, the one after
    it waited behind another resume, and the one after a -32002 all carry it."""
    client = Client()
    assert client.send(resume(1, "s1"), claimed="c") == (
        Locate(as_request(resume(1, "s1")), "s1", claimed="c"),
    )
    assert client.send(resume(2, "s1"), claimed="c") == ()  # held behind the first
    client.located(1, "b")
    again = client.backend("b", error(1, -32002, sid("s1")))
    assert again[-1] == Locate(as_request(resume(1, "s1")), "s1", ("b",), claimed="c")
    client.located(1, "c")
    assert client.backend("c", error(1, -32603))[-1] == Locate(
        as_request(resume(2, "s1")), "s1", claimed="c"
    )
    # a request that names no home carries no claim
    assert client.send(resume(3, "s2")) == (Locate(as_request(resume(3, "s2")), "s2"),)
