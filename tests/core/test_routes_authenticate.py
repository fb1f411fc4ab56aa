"""router.core.routes: a client's ``authenticate``, forwarded truthfully to every backend
the connection has a link to (router.core.authentication; tests.routes_driver plays the
shell)."""

from __future__ import annotations

import orjson

from router.core.calls import Limits
from router.core.effects import Deliver, OpenLink, Place
from router.protocol.errors import ErrorObject
from router.protocol.jsonrpc import Request
from tests.routes_driver import (
    AUTH,
    Client,
    as_request,
    dropped,
    error,
    error_reply,
    reply,
    request,
    result,
    routed,
    sid,
)

#: a lost link fails its calls at once (no session waits for a failover)
NO_FAILOVER = Limits(failover=False)


def kept(client: Client) -> Request | None:
    """The authenticate the connection replays on links it opens later."""
    return client.routes.authenticate


def test_authenticate_with_no_link_goes_where_the_pool_places_and_is_kept_once_accepted() -> None:
    client = Client()
    assert client.send(AUTH) == (Place(as_request(AUTH)),)
    backends, routed_id = routed(client.placed("auth-1", "a"))
    assert backends == ("a",)
    # the link opens first, with no authenticate of its own: the round's frame is its first
    assert client.opened == [OpenLink("a", client.routes.initialize)]
    assert kept(client) is None  # not before a backend accepted it
    answer = '{"jsonrpc":"2.0","id":%s,"result":{"_meta":{"k":1}}}'
    answered = client.backend("a", answer % orjson.dumps(routed_id).decode())
    assert answered == (Deliver(answer % '"auth-1"'),)  # the backend's answer, the client's id
    assert kept(client) == as_request(AUTH)
    assert list(client.routes.calls) == []


def test_authenticate_goes_to_every_linked_backend_and_one_refusal_wins() -> None:
    client = Client()
    client.new_session(1, "a", "s1")
    client.new_session(2, "b", "s2")
    backends, routed_id = routed(client.send(AUTH))
    assert backends == ("a", "b")
    assert dropped(client.backend("a", result(routed_id, {})))  # b still to answer
    (refused,) = client.backend("b", error(routed_id, -32000, {"why": "bad key"}))
    assert isinstance(refused, Deliver)
    assert orjson.loads(refused.text) == orjson.loads(error("auth-1", -32000, {"why": "bad key"}))
    assert kept(client) is None  # the backends disagreed: nothing is replayed
    assert list(client.routes.calls) == []
    # the next round has another id: a late answer to this one settles nothing
    _, next_id = routed(client.send(AUTH))
    assert next_id != routed_id
    assert dropped(client.backend("a", result(routed_id, {})))


def test_a_refusal_ends_the_round_at_once_and_late_acceptances_are_dropped() -> None:
    client = Client()
    client.new_session(1, "a", "s1")
    client.new_session(2, "b", "s2")
    _, routed_id = routed(client.send(AUTH))
    assert isinstance(client.backend("b", error(routed_id, -32000))[0], Deliver)
    assert dropped(client.backend("a", result(routed_id, {})))
    assert kept(client) is None


def test_one_authenticate_at_a_time() -> None:
    client = Client()
    client.new_session(1, "a", "s1")
    routed(client.send(AUTH))
    second = AUTH.replace("auth-1", "auth-2")
    error_reply(client.send(second), "auth-2", -32600)


def test_authenticate_whose_backend_is_lost_is_retryable() -> None:
    client = Client(NO_FAILOVER)
    client.new_session(1, "a", "s1")
    routed(client.send(AUTH))
    (lost,) = client.lost("a")
    assert error_reply(lost, "auth-1", -32013)["retryable"] is True


def test_a_refused_replay_answers_the_links_requests_with_the_backends_error() -> None:
    client = Client(NO_FAILOVER)
    client.new_session(1, "a", "s1")
    client.send(request(2, "session/prompt", sid("s1", prompt=[])))
    refusal = ErrorObject(-32000, "Authentication required", {"methodIds": ["key"]})
    (answer,) = client.lost("a", refusal)
    assert reply(answer)["error"] == {
        "code": -32000,
        "message": "Authentication required",
        "data": {"methodIds": ["key"]},
    }
    error_reply(answer, 2, -32000)  # an error the router answered in the backend's name
