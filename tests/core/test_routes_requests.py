"""router.core.routes: the handshake, request ids both ways, cancellation, and what a
backend sends that is not an answer (tests.routes_driver plays the shell)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from router.core.effects import Deliver, Initialize, OpenLink, Place, Send
from router.core.routes import Limits
from router.protocol.errors import RouterStopping
from router.protocol.ids import BackendId
from router.protocol.jsonrpc import Request, RequestId
from router.protocol.reading import parse
from tests.routes_driver import (
    Client,
    as_request,
    delivered,
    dropped,
    error,
    error_reply,
    new_params,
    notification,
    prompt,
    reply,
    request,
    result,
    resume,
    sid,
)

# -- initialize --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "method", ["session/new", "session/prompt", "session/list", "authenticate", "_x/y"]
)
def test_requests_before_initialize_are_invalid(method: str) -> None:
    client = Client(initialized=False)
    error_reply(client.send(request(4, method, sid("s1"))), 4, -32600)
    assert list(client.routes.calls) == []


def test_initialize_is_handled_by_the_router() -> None:
    client = Client(initialized=False)
    text = request(0, "initialize", {"protocolVersion": 1, "clientCapabilities": {}})
    assert client.send(text) == (Initialize(as_request(text)),)
    assert list(client.routes.calls) == [0]
    answered = client.initialized(0, {"protocolVersion": 1})
    assert reply(answered) == {"jsonrpc": "2.0", "id": 0, "result": {"protocolVersion": 1}}
    assert client.opened == []  # a pool of many: no link until something is routed
    assert list(client.routes.calls) == []


def test_in_a_pool_of_one_initialize_opens_the_link_and_it_stays() -> None:
    client = Client(initialized=False)
    text = request(0, "initialize", {"protocolVersion": 1})
    client.send(text)
    reply(client.initialized(0, {"protocolVersion": 1}, only="a"))
    # opened before the client reads the answer, so its first request finds it open
    assert client.last()[0] == OpenLink("a", as_request(text))
    new = request(1, "session/new", new_params())
    assert client.send(new) == (Place(as_request(new)),)
    assert client.placed(1, "a") == (Send("a", new),)
    assert client.last() == (Send("a", new),)  # no second link, and none closed
    assert client.closed == []


# -- ids ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("request_id", [0, "0", "a", -1])
def test_duplicate_in_flight_ids_are_refused(request_id: RequestId) -> None:
    client = Client()
    client.new_session(100, "a", "s1")
    first = request(request_id, "session/prompt", sid("s1"))
    assert client.send(first) == (Send("a", first),)
    again = client.send(request(request_id, "session/prompt", sid("s1")))
    error_reply(again, request_id, -32600)
    assert client.routes.calls[request_id].request.text == first
    assert client.backend("a", result(request_id, {})) == (Deliver(result(request_id, {})),)
    # settled: the id may be used again
    assert client.send(first) == (Send("a", first),)


def test_int_and_string_ids_are_different_ids() -> None:
    client = Client()
    client.new_session(100, "a", "s1")
    assert isinstance(client.send(request(1, "session/prompt", sid("s1")))[0], Send)
    assert isinstance(client.send(request("1", "session/prompt", sid("s1")))[0], Send)
    assert client.backend("a", result("1", {})) == (Deliver(result("1", {})),)
    assert list(client.routes.calls) == [1]


@pytest.mark.parametrize(
    "request_id", ["acp-router:authenticate:1", "acp-router:initialize", "acp-router:"]
)
def test_the_routers_own_request_ids_are_refused(request_id: str) -> None:
    client = Client()
    client.new_session(1, "a", "s1")
    data = error_reply(
        client.send(request(request_id, "session/prompt", sid("s1"))), request_id, -32600
    )
    assert data == {}
    assert list(client.routes.calls) == []
    # an id that merely contains it is the client's own
    assert isinstance(client.send(request("x-acp-router:1", "session/prompt", sid("s1")))[0], Send)


@pytest.mark.parametrize("named", ["acp-router:failover:1", "acp-router:authenticate:1"])
def test_a_cancel_naming_one_of_the_routers_own_ids_is_refused(named: str) -> None:
    """A client may not cancel what the router asked (a failover's resume, say)."""
    client = Client()
    client.new_session(1, "a", "s1")
    cancel = notification("$/cancel_request", {"requestId": named})
    assert error_reply(client.send(cancel), None, -32600) == {}  # and nothing sent on


def test_agent_requests_get_router_ids_and_replies_go_back_with_the_original_id() -> None:
    client = Client()
    texts = {
        backend: (
            '{"jsonrpc": "2.0", "id": 1, "method": "session/request_permission",'
            f' "params": {{"sessionId": "s-{backend}", "options": [], "_meta": {{"id": 1}}}}}}'
        )
        for backend in ("a", "b")
    }
    router_ids: dict[str, int] = {}
    for backend, text in texts.items():
        (effect,) = client.backend(backend, text)
        assert isinstance(effect, Deliver)
        assert client.last() == (effect,)  # nothing learned, nothing attached
        forwarded = parse(effect.text)
        assert isinstance(forwarded, Request)
        assert isinstance(forwarded.id, int)
        assert effect.text == text.replace('"id": 1,', f'"id": {forwarded.id},', 1)
        router_ids[backend] = forwarded.id
    assert router_ids["a"] != router_ids["b"]

    for backend in ("b", "a"):
        answer = (
            f'{{"jsonrpc":"2.0", "result":{{"outcome":{{"outcome":"selected","optionId":"id"}}}},'
            f'"id":{router_ids[backend]}, "_meta":{{"id":"x"}}}}'
        )
        sent = client.send(answer)
        assert sent == (Send(backend, answer.replace(f'"id":{router_ids[backend]},', '"id":1,')),)
    # each reply is used once
    assert dropped(client.send(result(router_ids["a"], {})))


def test_agent_request_string_ids_come_back_as_strings() -> None:
    client = Client()
    router_id = delivered(client.backend("a", request("perm-0", "fs/read_text_file", {})))["id"]
    (sent,) = client.send(error(router_id, -32800))
    assert isinstance(sent, Send)
    assert sent.backend == "a"
    assert orjson.loads(sent.text)["id"] == "perm-0"


def test_client_replies_to_no_agent_request_are_dropped() -> None:
    client = Client()
    assert dropped(client.send(result(0, {})))
    assert dropped(client.send(result("0", {})))
    assert dropped(client.send(error(None, -32700)))


def test_agent_requests_beyond_the_limit_are_refused_to_the_backend() -> None:
    client = Client(Limits(max_agent_requests=1))
    delivered(client.backend("a", request(1, "fs/read_text_file", {})))
    (refused,) = client.backend("b", request(7, "fs/read_text_file", {}))
    assert isinstance(refused, Send)
    assert refused.backend == "b"
    assert orjson.loads(refused.text)["id"] == 7
    assert orjson.loads(refused.text)["error"]["code"] == -32014


# -- cancellation ------------------------------------------------------------------------------


def test_client_cancel_request_goes_to_the_backend_holding_the_request() -> None:
    client = Client()
    client.new_session(1, "a", "s1")
    client.send(request("p", "session/prompt", sid("s1")))
    cancel = notification("$/cancel_request", {"requestId": "p"})
    assert client.send(cancel) == (Send("a", cancel),)


@pytest.mark.parametrize("named", ["nope", "1", None, [1], {"id": 1}, True, 1.0])
def test_client_cancel_request_for_nothing_forwarded_is_dropped(named: Any) -> None:
    client = Client()
    client.new_session(5, "a", "s1")
    client.send(request(1, "session/prompt", sid("s1")))  # in flight on a, with id 1
    client.send(request(2, "session/status", sid("s1")))  # handled by the router
    for requested in (named, 2):
        assert dropped(client.send(notification("$/cancel_request", {"requestId": requested})))
    assert dropped(client.send(notification("$/cancel_request", None)))


def test_backend_cancel_request_is_rewritten_to_the_router_id() -> None:
    client = Client()
    client.backend("a", request(1, "session/request_permission", {}))
    client.backend("b", request(1, "session/request_permission", {}))
    cancel = notification("$/cancel_request", {"requestId": 1, "_meta": {"why": "x"}})
    assert delivered(client.backend("b", cancel)) == {
        "jsonrpc": "2.0",
        "method": "$/cancel_request",
        "params": {"requestId": 1, "_meta": {"why": "x"}},
    }
    for named in (8, "1", True, 1.0, [1]):
        stray = notification("$/cancel_request", {"requestId": named})
        assert dropped(client.backend("b", stray)), named


def test_backend_cancel_request_keeps_members_the_router_does_not_know() -> None:
    client = Client()
    client.backend("b", request(5, "session/request_permission", {}))
    text = '{"jsonrpc":"2.0","method":"$/cancel_request","params":{"requestId":5},"x-trace":[1]}'
    assert delivered(client.backend("b", text)) == {
        "jsonrpc": "2.0",
        "method": "$/cancel_request",
        "params": {"requestId": 0},
        "x-trace": [1],
    }


def test_session_cancel_routes_by_session_id() -> None:
    client = Client()
    client.new_session(1, "b", "s1")
    cancel = notification("session/cancel", sid("s1"))
    assert client.send(cancel) == (Send("b", cancel),)
    assert dropped(client.send(notification("session/cancel", sid("s2"))))
    assert dropped(client.send(notification("session/cancel", {})))


# -- what a backend sends besides answers --------------------------------------------------------


def test_backend_notifications_are_delivered_as_they_came() -> None:
    text = (
        '{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"x","update":{}},"z":1}'
    )
    client = Client()
    assert client.backend("a", text) == (Deliver(text),)
    assert client.last() == (Deliver(text),)
    assert client.routes.relays(parse(text))  # so the shell delivers it without asking


def test_a_child_announcement_a_cancel_and_answers_are_not_relayed_as_they_came() -> None:
    routes = Client().routes
    child = {"sessionUpdate": "subagent_update", "sessionId": "c"}
    assert not routes.relays(
        parse(notification("session/update", {"sessionId": "p", "update": child}))
    )
    assert not routes.relays(parse(notification("$/cancel_request", {"requestId": 1})))
    assert not routes.relays(parse(result(1, {})))
    assert not routes.relays(parse(request(1, "fs/x", {})))
    chunk = {"sessionUpdate": "agent_message_chunk"}
    assert routes.relays(parse(notification("session/update", {"sessionId": "p", "update": chunk})))


@pytest.mark.parametrize(
    "spelled",
    [
        '"subagent_update"',
        '"subagent\\u005fupdate"',  # an escape spells the same name
        '"\\u0073ubagent_update"',
    ],
)
def test_a_child_announcement_is_read_however_its_name_is_spelled(spelled: str) -> None:
    client = Client()
    client.new_session(1, "b", "p")
    text = (
        '{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"p",'
        f'"update":{{"sessionUpdate":{spelled},"sessionId":"c"}}}}}}'
    )
    assert not client.routes.relays(parse(text))
    client.backend("b", text)
    assert client.routes.attached() == {"p": "b", "c": "b"}


def test_an_update_that_only_mentions_the_name_is_relayed_as_it_came() -> None:
    client = Client()
    client.new_session(1, "b", "p")
    chunk = {"sessionUpdate": "agent_message_chunk", "content": "a subagent_update, said"}
    text = notification("session/update", {"sessionId": "p", "update": chunk})
    assert client.routes.relays(parse(text))
    assert client.backend("b", text) == (Deliver(text),)
    assert client.routes.attached() == {"p": "b"}


def test_a_child_announced_while_its_parent_is_resumed_there_is_attached_there() -> None:
    """The parent's resume went to ``b`` and its answer is not in: ``b`` is where the
    parent lives for its children; ``a`` is not."""
    client = Client()
    client.send(resume(5, "p"))
    client.located(5, "b")
    child = {"sessionUpdate": "subagent_update", "sessionId": "c"}
    text = notification("session/update", {"sessionId": "p", "update": child})
    client.backend("a", text)
    assert "c" not in client.routes.attached()
    client.backend("b", text)
    assert client.routes.attached() == {"c": "b"}


def test_a_child_announced_by_its_parents_backend_is_attached_there() -> None:
    client = Client()
    client.new_session(1, "b", "p")
    child = {"sessionUpdate": "subagent_update", "sessionId": "c"}
    text = notification("session/update", {"sessionId": "p", "update": child})
    assert client.backend("a", text) == (Deliver(text),)  # not the parent's backend
    assert client.routes.attached() == {"p": "b"}
    assert client.backend("b", text) == (Deliver(text),)
    assert client.routes.attached() == {"p": "b", "c": "b"}
    cancel = notification("session/cancel", sid("c"))
    assert client.send(cancel) == (Send(BackendId("b"), cancel),)


def test_a_request_after_the_connection_stops_or_its_client_went_is_refused() -> None:
    """Nothing is routed once the connection is closed: a request that comes after the
    router began to close it, or after its client went, opens no link and goes nowhere."""
    for end in ("abandon", "client_gone"):
        client = Client()
        client.new_session(1, "a", "s1")
        if end == "abandon":
            client.abandon(RouterStopping())
        else:
            client.client_gone()
        error_reply(client.send(prompt(2, "s1")), 2, RouterStopping.code)
