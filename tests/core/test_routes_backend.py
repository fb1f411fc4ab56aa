"""router.core.routes: a backend's link ends, the client goes, or the router stops
(router.core.backend_side; tests.routes_driver plays the shell)."""

from __future__ import annotations

from router.core.effects import (
    Attach,
    CloseLink,
    Deliver,
    Detach,
    Late,
    Locate,
    Resumed,
    Send,
)
from router.core.health import Health
from router.core.routes import Limits
from router.protocol.errors import RouterStopping
from tests.routes_driver import (
    Client,
    delivered,
    dropped,
    error_reply,
    notified,
    prompt,
    reply,
    request,
    result,
    resume,
    sid,
)

#: a lost link fails its calls at once (no session waits for a failover)
NO_FAILOVER = Limits(failover=False)


def test_backend_lost_answers_its_calls_once_and_detaches_its_sessions() -> None:
    client = Client(NO_FAILOVER)
    client.new_session(1, "a", "s1")
    client.new_session(2, "a", "s2")
    client.new_session(3, "b", "s3")
    client.send(request(10, "session/prompt", sid("s1")))
    client.send(request(0, "session/prompt", sid("s2")))
    client.send(request("x", "session/prompt", sid("s3")))
    client.send(request(11, "session/resume", sid("s4")))  # still being located
    asked = delivered(client.backend("a", request(1, "fs/read_text_file", {})))
    client.changes.clear()

    withdrawn, *answers = client.lost("a")
    assert notified(withdrawn) == {
        "jsonrpc": "2.0",
        "method": "$/cancel_request",
        "params": {"requestId": asked["id"]},
    }
    assert sorted((reply(r)["id"] for r in answers), key=repr) == [0, 10]
    for answer in answers:
        assert reply(answer)["error"]["code"] == -32013
        assert reply(answer)["error"]["data"] == {"backend": "a", "retryable": True}
    assert client.changes == [Detach("s1", "a"), Detach("s2", "a")]
    assert client.routes.attached() == {"s3": "b"}
    assert sorted(client.routes.calls, key=repr) == ["x", 11]
    assert client.lost("a") == ()  # nothing twice
    assert client.last() == ()
    assert dropped(client.backend("a", result(10, {})))
    assert dropped(client.send(result(asked["id"], {})))  # the agent request died with a
    assert client.backend("b", result("x", {})) == (Deliver(result("x", {})),)
    error_reply(client.send(request(12, "session/prompt", sid("s1"))), 12, -32010)


def test_backend_lost_withdraws_its_agent_requests_from_the_client() -> None:
    client = Client(NO_FAILOVER)
    client.new_session(1, "a", "s1")
    client.new_session(2, "b", "s2")
    asked = [
        delivered(client.backend(b, request(7, "session/request_permission", {}))) for b in "aab"
    ]
    lost = client.lost("a", reason="closed by the backend (1009)")
    assert [notified(cancel) for cancel in lost] == [
        {"jsonrpc": "2.0", "method": "$/cancel_request", "params": {"requestId": asked[0]["id"]}},
        {"jsonrpc": "2.0", "method": "$/cancel_request", "params": {"requestId": asked[1]["id"]}},
    ]
    assert client.lost("a") == ()  # nothing twice
    # the client's late answer to a withdrawn request is dropped; b's still goes through
    assert dropped(client.send(result(asked[0]["id"], {})))
    assert client.send(result(asked[2]["id"], {})) == (Send("b", result(7, {})),)


def test_backend_lost_says_why_in_the_error_data() -> None:
    client = Client(NO_FAILOVER)
    client.new_session(1, "a", "s1")
    client.send(request(2, "session/prompt", sid("s1")))
    data = error_reply(client.lost("a", reason="send failed"), 2, -32013)
    assert data == {"backend": "a", "reason": "send failed", "retryable": True}


def test_backend_lost_forgets_it_as_the_last_backend() -> None:
    client = Client()
    client.new_session(1, "a", "s1")
    client.lost("a")
    error_reply(client.send(request(2, "_vendor/x", {})), 2, -32601)


def test_a_lost_link_reports_the_calls_it_failed() -> None:
    """Each resume it failed is counted as such (``link_lost``), then answered."""
    client = Client()
    client.send(request(1, "session/resume", sid("s1")))
    client.located(1, "a")
    client.send(request(2, "_x/y"))
    resumed, first, second = client.lost("a")
    assert resumed == Resumed("a", "link_lost")
    error_reply(first, 1, -32013)
    error_reply(second, 2, -32013)


def test_client_gone_detaches_everything() -> None:
    client = Client()
    client.new_session(1, "a", "s1")
    client.new_session(2, "b", "s2")
    assert client.client_gone() == ()
    assert client.routes.attached() == {}
    assert client.changes == [
        Attach("s1", "a"),
        Attach("s2", "b"),
        Detach("s1", "a"),
        Detach("s2", "b"),
    ]


# -- the router stops ----------------------------------------------------------------------------


def test_abandon_answers_every_call_once_and_refuses_what_comes_after() -> None:
    client = Client(Limits(failover=True))
    client.new_session(1, "a", "s1")
    client.send(request(2, "session/prompt", sid("s1")))  # on a
    client.send(resume(3, "s2"))  # being located
    client.open_ahead(3, "b")
    client.send(prompt(4, "s2"))  # held behind it
    asked = delivered(client.backend("a", request(7, "fs/read_text_file", {})))
    effects = client.abandon(RouterStopping())
    # the prompt running on "a" is cancelled there first (its client is about to go)
    assert [(c.session_id, c.backend) for c in client.cancelled] == [("s1", "a")]
    withdrawn = effects[-1]
    assert sorted(reply(r)["id"] for r in effects[:-1]) == [2, 3, 4]
    for answer in effects[:-1]:
        assert reply(answer)["error"]["code"] == RouterStopping.code
    assert notified(withdrawn)["params"] == {"requestId": asked["id"]}
    assert client.closed == [CloseLink("b", "opened ahead, not needed")]
    assert list(client.routes.calls) == []
    # the shell's late outcomes find nothing to answer: each is late once (counted by
    # what it awaited), then just dropped; new requests are refused
    assert client.located(3, "b") == (Late("locate"),)
    assert dropped(client.answer(3, {}))
    assert client.backend("a", result(2, {})) == (Late("backend"),)
    assert dropped(client.backend("a", result(2, {})))
    assert dropped(client.fail(4, RouterStopping()))  # held: nothing was asked for it
    assert client.routes.abandoned == {}
    error_reply(client.send(prompt(5, "s1")), 5, RouterStopping.code)


def test_abandon_ends_a_failover_quietly() -> None:
    client = Client(Limits(failover=True))
    client.new_session(1, "a", "s1")
    client.lost("a")
    client.send(prompt(2, "s1"))  # waits for the failover
    (locate,) = client.backend_known("a", ("s1",), Health.UP)
    assert isinstance(locate, Locate)
    (answer,) = client.abandon(RouterStopping())
    error_reply(answer, 2, RouterStopping.code)  # the client's; the router's own is not
    assert list(client.routes.calls) == []
    assert client.placed(locate.request.id, "b") == (Late("locate"),)
