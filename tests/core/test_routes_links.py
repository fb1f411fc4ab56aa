"""router.core.routes: the connection's links to backends, opened and closed by the core
as effects in the same tuple as the frames that need them (router.core.links;
tests.routes_driver plays the shell)."""

from __future__ import annotations

import orjson

from router.core.effects import CloseLink, Deliver, OpenLink, ResumeSent, Send
from router.protocol.errors import NoBackendAvailable
from tests.routes_driver import (
    AUTH,
    Client,
    as_request,
    dropped,
    error_reply,
    new_params,
    request,
    result,
    resume,
    routed,
    sid,
)

NOT_NEEDED = "opened ahead, not needed"


def test_the_first_frame_routed_to_a_backend_opens_its_link_with_the_handshake() -> None:
    client = Client()
    assert client.opened == []
    client.send(request(1, "session/new", new_params()))
    assert client.placed(1, "a") == (Send("a", request(1, "session/new", new_params())),)
    opened, _ = client.last()  # before the frame that needs it
    assert isinstance(opened, OpenLink)
    assert (opened.backend, opened.initialize.method, opened.authenticate, opened.first) == (
        "a",
        "initialize",
        None,
        (),
    )
    client.send(request(2, "session/new", new_params()))
    client.placed(2, "a")
    assert client.last() == (Send("a", request(2, "session/new", new_params())),)  # one link


def test_a_link_opened_ahead_opens_at_once_and_closes_when_the_call_goes_elsewhere() -> None:
    """The link a resume will most likely need opens while its locate runs (the
    OpenLink comes back from open_ahead itself, before the locate's outcome); located
    elsewhere, with nothing routed on it, it is closed in the same tuple."""
    client = Client()
    text = request(1, "session/resume", sid("s1"))
    client.send(text)
    assert client.open_ahead(1, "a") == ()
    assert client.last() == (OpenLink("a", client.routes.initialize),)
    assert set(client.linked) == {"a"}
    assert client.located(1, "b") == (ResumeSent(), Send("b", text))
    assert client.last() == (
        ResumeSent(),
        OpenLink("b", client.routes.initialize),
        Send("b", text),
        CloseLink("a", NOT_NEEDED),
    )
    assert set(client.linked) == {"b"}


def test_a_link_opened_ahead_is_opened_once() -> None:
    client = Client()
    client.send(request(1, "session/resume", sid("s1")))
    client.open_ahead(1, "a")
    client.open_ahead(1, "a")
    assert client.last() == ()  # open already: nothing to do
    client.send(request(2, "session/resume", sid("s2")))
    client.open_ahead(2, "a")
    assert client.last() == ()


def test_a_link_opened_ahead_stays_when_the_call_goes_there_or_another_frame_uses_it() -> None:
    client = Client()
    client.send(request(1, "session/resume", sid("s1")))
    client.open_ahead(1, "a")
    client.located(1, "a")
    assert client.last() == (ResumeSent(), Send("a", request(1, "session/resume", sid("s1"))))
    # another call's link opened ahead, unused when its locate fails: closed with it
    client.send(request(2, "session/resume", sid("s2")))
    client.open_ahead(2, "b")
    assert client.send(request(3, "_x/y")) == (Send("a", request(3, "_x/y")),)  # last used
    client.backend("a", result(1, {}))
    client.send(request(4, "session/prompt", sid("s1")))
    failed = client.fail(2, NoBackendAvailable())
    error_reply(failed, 2, -32011)
    assert client.last()[0] == CloseLink("b", NOT_NEEDED)
    assert client.closed == [CloseLink("b", NOT_NEEDED)]
    assert set(client.linked) == {"a"}


def test_a_link_opened_ahead_and_used_by_another_frame_stays() -> None:
    client = Client()
    client.new_session(1, "a", "s0")
    client.send(request(2, "session/resume", sid("s1")))
    client.open_ahead(2, "b")
    client.new_session(3, "b", "s3")  # placed there meanwhile: the link carries it
    client.located(2, "c")
    assert not any(isinstance(e, CloseLink) for e in client.last())
    assert set(client.linked) == {"a", "b", "c"}


def test_a_failed_locate_closes_its_unused_link_ahead() -> None:
    client = Client()
    client.send(request(1, "session/resume", sid("s1")))
    client.open_ahead(1, "a")
    error_reply(client.fail(1, NoBackendAvailable()), 1, -32011)
    assert client.closed == [CloseLink("a", NOT_NEEDED)]
    assert client.last()[0] == CloseLink("a", NOT_NEEDED)  # closed before the answer


def test_a_link_that_opens_during_an_authenticate_round_joins_it() -> None:
    # on the old main, a link opened ahead of a resume during a round skipped it, and the
    # resume reached an agent that requires auth unauthenticated
    client = Client()
    client.new_session(1, "a", "s1")
    backends, routed_id = routed(client.send(AUTH))
    assert backends == ("a",)
    client.send(request(2, "session/resume", sid("s9")))
    client.open_ahead(2, "b")
    (opened,) = client.last()
    assert isinstance(opened, OpenLink)
    assert opened.backend == "b"
    assert opened.authenticate is None  # not accepted yet: it is the round's
    (first,) = opened.first
    assert orjson.loads(first) == {**orjson.loads(AUTH), "id": routed_id}
    # the round waits for every link that opens during it, and a joined link is not
    # closed as unused when the call it was opened ahead for goes elsewhere
    assert dropped(client.backend("a", result(routed_id, {})))
    client.located(2, "c")
    links = [(type(e), e.backend) for e in client.last() if isinstance(e, OpenLink | CloseLink)]
    assert links == [(OpenLink, "c")]
    assert dropped(client.backend("c", result(routed_id, {})))
    answered = client.backend("b", result(routed_id, {}))
    assert answered == (Deliver(result("auth-1", {})),)
    assert client.routes.authenticate == as_request(AUTH)
    # a link opened after the round replays the accepted authenticate in its handshake
    client.send(resume(3, "s8"))
    client.located(3, "d")
    (later,) = [e for e in client.last() if isinstance(e, OpenLink)]
    assert (later.authenticate, later.first) == (as_request(AUTH), ())
