"""router.core.routes: one client connection's routing state, driven with parsed frames.

The shell (router.server.client) is played here by hand: a ``Handle`` is answered with
``answer``/``fail`` or sent on with ``forward`` (a ``Relocate`` is already back in
flight), and the attachments the core reports are tallied, as the shell does.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict, deque
from collections.abc import Iterable
from typing import Any

import orjson
import pytest
from hypothesis import given, settings, strategies as st
from router.core.actions import (
    Absorbed,
    Action,
    Attach,
    Broadcast,
    Change,
    CloseLink,
    Deliver,
    Detach,
    Drop,
    Duty,
    Handle,
    Held,
    OpenLink,
    Relocate,
    Reply,
    Send,
)

from router.core.routes import ClientRoutes, Limits
from router.protocol import acp
from router.protocol.errors import LocateInconclusive, NoBackendAvailable
from router.protocol.ids import BackendId, SessionId
from router.protocol.jsonrpc import ErrorObject, Request, RequestId
from router.protocol.reading import parse

# -- frames ----------------------------------------------------------------------------------------


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


# -- driving ---------------------------------------------------------------------------------------


class Client:
    """A ClientRoutes with the attachments it reports recorded."""

    def __init__(self, limits: Limits | None = None, *, initialized: bool = True) -> None:
        self.attach_log: list[tuple[str, int]] = []
        self.routes = ClientRoutes(limits or Limits())
        if initialized:
            action = self.send(request("init", "initialize", {"protocolVersion": 1}))
            assert isinstance(action, Handle)
            assert self.routes.initialize == action.request
            self.routes.answer("init", {"protocolVersion": 1})

    def record(self, changes: Iterable[Change]) -> None:
        self.attach_log += [(c.backend, 1 if isinstance(c, Attach) else -1) for c in changes]

    def send(self, text: str) -> Action:
        return self.routes.receive_client(parse(text))

    def backend(self, backend: str, text: str) -> Action:
        action = self.routes.receive_backend(BackendId(backend), parse(text))
        if isinstance(action, Deliver) and action.settled is not None:
            self.record(action.settled.changes)
        return action

    def lost(self, backend: str) -> tuple[Reply, ...]:
        lost = self.routes.backend_lost(BackendId(backend))
        self.record(lost.detached)
        return lost.replies

    def close(self) -> None:
        self.record(self.routes.close())

    def new_session(self, request_id: RequestId, backend: str, session_id: str) -> None:
        action = self.send(request(request_id, "session/new", new_params()))
        assert isinstance(action, Handle)
        assert action.duty is Duty.PLACE
        self.routes.forward(request_id, backend)
        delivered = self.backend(backend, result(request_id, sid(session_id)))
        assert isinstance(delivered, Deliver)
        assert self.routes.attached()[session_id] == backend


def reply(action: Action) -> dict[str, Any]:
    assert isinstance(action, Reply), action
    decoded: dict[str, Any] = orjson.loads(action.text)
    return decoded


def delivered(action: Action) -> dict[str, Any]:
    assert isinstance(action, Deliver), action
    decoded: dict[str, Any] = orjson.loads(action.text)
    return decoded


def error_reply(action: Action, request_id: RequestId, code: int) -> dict[str, Any]:
    decoded = reply(action)
    assert decoded["id"] == request_id
    assert decoded["error"]["code"] == code, decoded
    data: dict[str, Any] = decoded["error"].get("data") or {}
    return data


# -- initialize --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "method", ["session/new", "session/prompt", "session/list", "authenticate", "_x/y"]
)
def test_requests_before_initialize_are_invalid(method: str) -> None:
    client = Client(initialized=False)
    action = client.send(request(4, method, sid("s1")))
    error_reply(action, 4, -32600)
    assert client.routes.unanswered() == []


def test_initialize_is_handled_by_the_router() -> None:
    client = Client(initialized=False)
    text = request(0, "initialize", {"protocolVersion": 1, "clientCapabilities": {}})
    action = client.send(text)
    assert isinstance(action, Handle)
    assert action.duty is Duty.INITIALIZE
    assert action.request.text == text
    assert client.routes.unanswered() == [0]
    answered = client.routes.answer(0, {"protocolVersion": 1})
    assert reply(answered) == {"jsonrpc": "2.0", "id": 0, "result": {"protocolVersion": 1}}
    assert client.routes.unanswered() == []


# -- authenticate ----------------------------------------------------------------------------


AUTH = (
    '{"jsonrpc":"2.0","id":"auth-1","method":"authenticate","params":{"methodId":"key","_meta":{}}}'
)


def routed(action: Action) -> tuple[tuple[BackendId, ...], str]:
    """The backends a broadcast goes to, and the router id it carries."""
    assert isinstance(action, Broadcast), action
    routed_id = as_request(action.text).id
    assert isinstance(routed_id, str)
    assert action.text == AUTH.replace('"auth-1"', orjson.dumps(routed_id).decode())
    return action.backends, routed_id


def kept(client: Client) -> Request | None:
    """The authenticate the connection replays on links it opens later."""
    return client.routes.authenticate


def test_authenticate_with_no_link_goes_where_the_shell_picks_and_is_kept_once_accepted() -> None:
    client = Client()
    action = client.send(AUTH)
    assert action == Handle(Duty.AUTHENTICATE, as_request(AUTH))
    backends, routed_id = routed(client.routes.authenticate_on("auth-1", BackendId("a")))
    assert backends == ("a",)
    assert kept(client) is None  # not before a backend accepted it
    answer = '{"jsonrpc":"2.0","id":%s,"result":{"_meta":{"k":1}}}'
    delivered = client.backend("a", answer % orjson.dumps(routed_id).decode())
    assert isinstance(delivered, Deliver)
    assert delivered.text == answer % '"auth-1"'  # the backend's answer, under the client's id
    assert kept(client) == as_request(AUTH)
    assert client.routes.unanswered() == []


def test_authenticate_goes_to_every_linked_backend_and_one_refusal_wins() -> None:
    client = Client()
    client.new_session(1, "a", "s1")
    client.new_session(2, "b", "s2")
    backends, routed_id = routed(client.send(AUTH))
    assert backends == ("a", "b")
    assert isinstance(client.backend("a", result(routed_id, {})), Drop)  # b still to answer
    refused = client.backend("b", error(routed_id, -32000, {"why": "bad key"}))
    assert isinstance(refused, Deliver)
    assert orjson.loads(refused.text) == orjson.loads(error("auth-1", -32000, {"why": "bad key"}))
    assert kept(client) is None  # the backends disagreed: nothing is replayed
    assert client.routes.unanswered() == []
    # the next round has another id: a late answer to this one settles nothing
    _, next_id = routed(client.send(AUTH))
    assert next_id != routed_id
    assert isinstance(client.backend("a", result(routed_id, {})), Drop)


def test_a_refusal_ends_the_round_at_once_and_late_acceptances_are_dropped() -> None:
    client = Client()
    client.new_session(1, "a", "s1")
    client.new_session(2, "b", "s2")
    _, routed_id = routed(client.send(AUTH))
    assert isinstance(client.backend("b", error(routed_id, -32000)), Deliver)
    assert isinstance(client.backend("a", result(routed_id, {})), Drop)
    assert kept(client) is None


def test_one_authenticate_at_a_time() -> None:
    client = Client()
    client.new_session(1, "a", "s1")
    routed(client.send(AUTH))
    second = AUTH.replace("auth-1", "auth-2")
    error_reply(client.send(second), "auth-2", -32600)


def test_authenticate_whose_backend_is_lost_is_retryable() -> None:
    client = Client()
    client.new_session(1, "a", "s1")
    routed(client.send(AUTH))
    (lost,) = client.lost("a")
    assert error_reply(lost, "auth-1", -32013)["retryable"] is True
    assert lost.error == -32013


def test_a_refused_replay_answers_the_links_requests_with_the_backends_error() -> None:
    client = Client()
    client.new_session(1, "a", "s1")
    client.send(request(2, "session/prompt", sid("s1", prompt=[])))
    refusal = ErrorObject(-32000, "Authentication required", {"methodIds": ["key"]})
    (answer,) = client.routes.backend_lost(BackendId("a"), refusal).replies
    assert reply(answer)["error"] == {
        "code": -32000,
        "message": "Authentication required",
        "data": {"methodIds": ["key"]},
    }
    assert answer.error == -32000  # an error the router answered in the backend's name


# -- sessions ----------------------------------------------------------------------------------


def test_session_new_is_placed_then_forwarded_verbatim_and_attached() -> None:
    client = Client()
    text = '{"jsonrpc":"2.0","id":1,"method":"session/new","params":{"cwd":"/w","mcpServers":[],"_meta":{"x":1}},"extra":[]}'
    action = client.send(text)
    assert action == Handle(Duty.PLACE, as_request(text))
    assert client.routes.forward(1, "b") == Send("b", text)
    assert client.attach_log == []

    response = result(1, sid("s1", modes=None))
    delivered = client.backend("b", response)
    assert isinstance(delivered, Deliver)
    assert delivered.text == response
    assert delivered.settled is not None
    assert delivered.settled.call.request.id == 1
    assert delivered.settled.learned == "s1"
    assert client.routes.attached() == {"s1": "b"}
    assert client.attach_log == [("b", 1)]
    assert client.routes.unanswered() == []


def test_a_forked_session_is_attached_where_its_parent_lives() -> None:
    client = Client()
    client.new_session(1, "b", "parent")
    text = request(2, "session/fork", sid("parent", cwd="/w"))
    assert client.send(text) == Send("b", text)
    assert isinstance(client.backend("b", result(2, sid("child"))), Deliver)
    assert client.routes.attached() == {"parent": "b", "child": "b"}
    prompt = request(3, "session/prompt", sid("child", prompt=[]))
    assert client.send(prompt) == Send("b", prompt)


def test_failed_session_new_attaches_nothing() -> None:
    client = Client()
    client.send(request(1, "session/new", new_params()))
    client.routes.forward(1, "a")
    assert isinstance(client.backend("a", error(1, -32603)), Deliver)
    assert isinstance(client.send(request(2, "session/new", new_params())), Handle)
    client.routes.forward(2, "a")
    assert isinstance(client.backend("a", result(2, {"noSessionId": True})), Deliver)
    assert client.routes.attached() == {}
    assert client.attach_log == []


def test_prompt_goes_to_the_attached_backend_verbatim() -> None:
    client = Client()
    client.new_session(1, "b", "s1")
    text = (
        '{ "jsonrpc" : "2.0", "id": 2, "method": "session/prompt",\n'
        '  "params": {"sessionId": "s1", "prompt": [{"type": "text", "text": "h\\u00e9 \\"id\\": 9"}],'
        ' "_meta": {"trace": [1, 2]}}, "unknown": {"id": 3} }'
    )
    assert client.send(text) == Send("b", text)
    assert client.routes.calls[2].backend == "b"
    delivered = client.backend("b", result(2, {"stopReason": "end_turn"}))
    assert isinstance(delivered, Deliver)
    assert client.routes.unanswered() == []


def test_a_response_from_another_backend_settles_nothing() -> None:
    client = Client()
    client.new_session(1, "b", "s1")
    client.send(request(2, "session/prompt", sid("s1")))
    assert isinstance(client.backend("a", result(2, {})), Drop)
    assert isinstance(client.backend("b", result(99, {})), Drop)
    assert isinstance(client.backend("b", error(None, -32700)), Drop)
    assert client.routes.unanswered() == [2]
    assert isinstance(client.backend("b", result(2, {})), Deliver)
    assert isinstance(client.backend("b", result(2, {})), Drop)  # a second answer is dropped


def test_prompt_for_an_unattached_session_is_refused() -> None:
    client = Client()
    client.new_session(1, "a", "s1")
    data = error_reply(client.send(request(2, "session/prompt", sid("elsewhere"))), 2, -32010)
    assert data == {"sessionId": "elsewhere", "retryable": False}
    assert client.routes.unanswered() == []


@pytest.mark.parametrize("params", [None, {}, {"sessionId": 5}, [1]])
def test_session_methods_need_a_session_id(params: Any) -> None:
    action = Client().send(request(3, "session/prompt", params))
    error_reply(action, 3, -32602)


@pytest.mark.parametrize("method", ["session/resume", "session/status", "session/prompt"])
def test_an_overlong_session_id_is_invalid_params_before_any_probe(method: str) -> None:
    client = Client(Limits(max_session_id_chars=8))
    assert isinstance(client.send(request(1, method, sid("s" * 8))), Handle | Reply)
    assert error_reply(client.send(request(2, method, sid("s" * 9))), 2, -32602) == {}
    assert 2 not in client.routes.calls


@pytest.mark.parametrize("method", ["session/resume", "session/load"])
def test_resume_of_an_unattached_session_is_located_then_attached(method: str) -> None:
    client = Client()
    text = request(5, method, sid("s9", cwd="/w", mcpServers=[]))
    action = client.send(text)
    assert action == Handle(Duty.LOCATE, as_request(text), "s9")
    assert client.routes.forward(5, "c") == Send("c", text)
    assert isinstance(client.backend("c", result(5, {})), Deliver)
    assert client.routes.attached() == {"s9": "c"}
    assert client.attach_log == [("c", 1)]


def test_resume_of_an_attached_session_goes_straight_to_its_backend() -> None:
    client = Client()
    client.new_session(1, "a", "s1")
    text = request(2, "session/resume", sid("s1"))
    assert client.send(text) == Send("a", text)
    assert isinstance(client.backend("a", result(2, {})), Deliver)
    assert client.attach_log == [("a", 1)]  # attached once, not twice


def test_resume_not_found_relocates_until_the_attempts_run_out() -> None:
    client = Client(Limits(max_resume_attempts=3))
    text = request(5, "session/resume", sid("s9"))
    client.send(text)
    client.routes.forward(5, "a")
    relocate = client.backend("a", error(5, -32002, sid("s9")))
    assert relocate == Relocate(as_request(text), "s9", "a", ("a",))
    assert client.routes.unanswered() == [5]  # back in flight, to be located again
    assert client.routes.calls[5].backend is None
    assert client.routes.forward(5, "b") == Send("b", text)
    again = client.backend("b", error(5, -32002, sid("s9")))
    assert again == Relocate(as_request(text), "s9", "b", ("a", "b"))
    assert client.routes.forward(5, "c") == Send("c", text)
    third = error(5, -32002, sid("s9"))
    delivered = client.backend("c", third)
    assert isinstance(delivered, Deliver)
    assert delivered.text == third
    assert client.routes.unanswered() == []
    assert client.routes.attached() == {}


def test_a_retried_resume_attaches_where_it_lands() -> None:
    client = Client()
    client.send(request(5, "session/resume", sid("s9")))
    client.routes.forward(5, "a")
    client.backend("a", error(5, -32002, sid("s9")))
    client.routes.forward(5, "b")
    delivered = client.backend("b", result(5, {}))
    assert isinstance(delivered, Deliver)
    assert client.routes.attached() == {"s9": "b"}


def test_resume_other_errors_are_delivered_without_relocating() -> None:
    client = Client()
    client.send(request(5, "session/load", sid("s9")))
    client.routes.forward(5, "a")
    assert isinstance(client.backend("a", error(5, -32603)), Deliver)
    assert client.routes.attached() == {}


def test_resume_attaches_a_session_that_moved_and_detaches_it_from_the_old_backend() -> None:
    client = Client()
    client.new_session(1, "a", "s1")
    client.send(request(2, "session/resume", sid("s1")))
    relocate = client.backend("a", error(2, -32002))
    assert isinstance(relocate, Relocate)
    client.routes.forward(2, "b")
    client.backend("b", result(2, {}))
    assert client.routes.attached() == {"s1": "b"}
    assert client.attach_log == [("a", 1), ("a", -1), ("b", 1)]


def test_close_of_an_unattached_session_is_located_but_not_attached() -> None:
    client = Client()
    text = request(6, "session/close", sid("s7"))
    action = client.send(text)
    assert action == Handle(Duty.LOCATE_DETACHED, as_request(text), "s7")
    assert client.routes.forward(6, "a") == Send("a", text)
    assert isinstance(client.backend("a", result(6, {})), Deliver)
    assert client.routes.attached() == {}
    assert client.attach_log == []


def test_close_of_an_attached_session_detaches_it_on_success() -> None:
    client = Client()
    client.new_session(1, "a", "s1")
    client.send(request(2, "session/close", sid("s1")))
    assert isinstance(client.backend("a", error(2, -32603)), Deliver)
    assert client.routes.attached() == {"s1": "a"}  # failed: still attached
    text = request(3, "session/close", sid("s1"))
    assert client.send(text) == Send("a", text)
    assert isinstance(client.backend("a", result(3, {})), Deliver)
    assert client.routes.attached() == {}
    assert client.attach_log == [("a", 1), ("a", -1)]


def test_status_and_list_are_handled_by_the_router() -> None:
    client = Client()
    status = client.send(request(1, "session/status", sid("s1")))
    assert isinstance(status, Handle)
    assert (status.duty, status.session_id) == (Duty.STATUS, "s1")
    listing = client.send(request(2, "session/list", {}))
    assert isinstance(listing, Handle)
    assert listing.duty is Duty.LIST
    assert reply(client.routes.answer(1, {"status": "active"}))["result"] == {"status": "active"}
    error_reply(client.routes.fail(2, NoBackendAvailable()), 2, -32011)
    assert client.routes.unanswered() == []


def test_methods_without_a_session_go_to_the_last_backend_used() -> None:
    client = Client()
    error_reply(client.send(request(1, "_vendor/thing", {})), 1, -32601)
    client.new_session(2, "b", "s1")
    text = request(3, "_vendor/thing", {"x": 1})
    assert client.send(text) == Send("b", text)
    note = notification("_vendor/ping", {})
    assert client.send(note) == Send("b", note)


def test_notifications_with_no_backend_are_dropped() -> None:
    assert isinstance(Client().send(notification("_vendor/ping", {})), Drop)


# -- ids ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("request_id", [0, "0", "a", -1])
def test_duplicate_in_flight_ids_are_refused(request_id: RequestId) -> None:
    client = Client()
    client.new_session(100, "a", "s1")
    first = request(request_id, "session/prompt", sid("s1"))
    assert client.send(first) == Send("a", first)
    again = client.send(request(request_id, "session/prompt", sid("s1")))
    error_reply(again, request_id, -32600)
    assert client.routes.calls[request_id].request.text == first
    assert isinstance(client.backend("a", result(request_id, {})), Deliver)
    # settled: the id may be used again
    assert isinstance(client.send(request(request_id, "session/prompt", sid("s1"))), Send)


def test_int_and_string_ids_are_different_ids() -> None:
    client = Client()
    client.new_session(100, "a", "s1")
    assert isinstance(client.send(request(1, "session/prompt", sid("s1"))), Send)
    assert isinstance(client.send(request("1", "session/prompt", sid("s1"))), Send)
    delivered = client.backend("a", result("1", {}))
    assert isinstance(delivered, Deliver)
    assert client.routes.unanswered() == [1]


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
        action = client.backend(backend, text)
        assert isinstance(action, Deliver)
        assert action.settled is None
        delivered = parse(action.text)
        assert isinstance(delivered, Request)
        assert isinstance(delivered.id, int)
        assert action.text == text.replace('"id": 1,', f'"id": {delivered.id},', 1)
        router_ids[backend] = delivered.id
    assert router_ids["a"] != router_ids["b"]

    for backend in ("b", "a"):
        answer = (
            f'{{"jsonrpc":"2.0", "result":{{"outcome":{{"outcome":"selected","optionId":"id"}}}},'
            f'"id":{router_ids[backend]}, "_meta":{{"id":"x"}}}}'
        )
        sent = client.send(answer)
        assert sent == Send(backend, answer.replace(f'"id":{router_ids[backend]},', '"id":1,'))
    # each reply is used once
    assert isinstance(client.send(result(router_ids["a"], {})), Drop)


def test_agent_request_string_ids_come_back_as_strings() -> None:
    client = Client()
    action = client.backend("a", request("perm-0", "fs/read_text_file", {"path": "/x"}))
    assert isinstance(action, Deliver)
    router_id = orjson.loads(action.text)["id"]
    sent = client.send(error(router_id, -32800))
    assert isinstance(sent, Send)
    assert orjson.loads(sent.text)["id"] == "perm-0"


def test_client_replies_to_no_agent_request_are_dropped() -> None:
    client = Client()
    assert isinstance(client.send(result(0, {})), Drop)
    assert isinstance(client.send(result("0", {})), Drop)
    assert isinstance(client.send(error(None, -32700)), Drop)


def test_agent_requests_beyond_the_limit_are_refused_to_the_backend() -> None:
    client = Client(Limits(max_agent_requests=1))
    assert isinstance(client.backend("a", request(1, "fs/read_text_file", {})), Deliver)
    refused = client.backend("b", request(7, "fs/read_text_file", {}))
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
    assert client.send(cancel) == Send("a", cancel)


@pytest.mark.parametrize("named", ["nope", "1", None, [1], {"id": 1}, True, 1.0])
def test_client_cancel_request_for_nothing_forwarded_is_dropped(named: Any) -> None:
    client = Client()
    client.new_session(5, "a", "s1")
    client.send(request(1, "session/prompt", sid("s1")))  # in flight on a, with id 1
    client.send(request(2, "session/status", sid("s1")))  # handled by the router
    for requested in (named, 2):
        action = client.send(notification("$/cancel_request", {"requestId": requested}))
        assert isinstance(action, Drop), requested
    assert isinstance(client.send(notification("$/cancel_request", None)), Drop)


def test_backend_cancel_request_is_rewritten_to_the_router_id() -> None:
    client = Client()
    client.backend("a", request(1, "session/request_permission", {}))
    client.backend("b", request(1, "session/request_permission", {}))
    delivered = client.backend(
        "b", notification("$/cancel_request", {"requestId": 1, "_meta": {"why": "x"}})
    )
    assert isinstance(delivered, Deliver)
    assert orjson.loads(delivered.text) == {
        "jsonrpc": "2.0",
        "method": "$/cancel_request",
        "params": {"requestId": 1, "_meta": {"why": "x"}},
    }
    for named in (8, "1", True, 1.0, [1]):
        stray = client.backend("b", notification("$/cancel_request", {"requestId": named}))
        assert isinstance(stray, Drop), named


def test_backend_cancel_request_keeps_members_the_router_does_not_know() -> None:
    client = Client()
    client.backend("b", request(5, "session/request_permission", {}))
    text = '{"jsonrpc":"2.0","method":"$/cancel_request","params":{"requestId":5},"x-trace":[1]}'
    delivered = client.backend("b", text)
    assert isinstance(delivered, Deliver)
    assert orjson.loads(delivered.text) == {
        "jsonrpc": "2.0",
        "method": "$/cancel_request",
        "params": {"requestId": 0},
        "x-trace": [1],
    }


def test_session_cancel_routes_by_session_id() -> None:
    client = Client()
    client.new_session(1, "b", "s1")
    cancel = notification("session/cancel", sid("s1"))
    assert client.send(cancel) == Send("b", cancel)
    assert isinstance(client.send(notification("session/cancel", sid("s2"))), Drop)
    assert isinstance(client.send(notification("session/cancel", {})), Drop)


def test_backend_notifications_are_delivered_as_they_came() -> None:
    text = (
        '{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"x","update":{}},"z":1}'
    )
    assert Client().backend("a", text) == Deliver(text)
    assert Client().routes.relays(parse(text))  # so the shell delivers it without asking


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


# -- losing a backend --------------------------------------------------------------------------


def test_backend_lost_answers_its_calls_once_and_detaches_its_sessions() -> None:
    client = Client()
    client.new_session(1, "a", "s1")
    client.new_session(2, "a", "s2")
    client.new_session(3, "b", "s3")
    client.send(request(10, "session/prompt", sid("s1")))
    client.send(request(0, "session/prompt", sid("s2")))
    client.send(request("x", "session/prompt", sid("s3")))
    client.send(request(11, "session/resume", sid("s4")))  # still being located
    client.backend("a", request(1, "fs/read_text_file", {}))
    client.attach_log.clear()

    replies = client.lost("a")
    answered = sorted((reply(r)["id"] for r in replies), key=repr)
    assert answered == [0, 10]
    for r in replies:
        assert reply(r)["error"]["code"] == -32013
        assert reply(r)["error"]["data"] == {"backend": "a", "retryable": True}
    assert sorted(client.attach_log) == [("a", -1), ("a", -1)]
    assert client.routes.attached() == {"s3": "b"}
    assert sorted(client.routes.unanswered(), key=repr) == ["x", 11]
    assert client.lost("a") == ()  # nothing twice
    assert isinstance(client.backend("a", result(10, {})), Drop)
    assert isinstance(client.send(result(0, {})), Drop)  # the agent request died with a
    assert isinstance(client.backend("b", result("x", {})), Deliver)
    error_reply(client.send(request(12, "session/prompt", sid("s1"))), 12, -32010)


def test_backend_lost_withdraws_its_agent_requests_from_the_client() -> None:
    client = Client()
    client.new_session(1, "a", "s1")
    client.new_session(2, "b", "s2")
    asked = [
        delivered(client.backend(b, request(7, "session/request_permission", {}))) for b in "aab"
    ]
    lost = client.routes.backend_lost(BackendId("a"), reason="closed by the backend (1009)")
    assert [json.loads(cancel.text) for cancel in lost.withdrawn] == [
        {"jsonrpc": "2.0", "method": "$/cancel_request", "params": {"requestId": asked[0]["id"]}},
        {"jsonrpc": "2.0", "method": "$/cancel_request", "params": {"requestId": asked[1]["id"]}},
    ]
    assert client.routes.backend_lost(BackendId("a")).withdrawn == ()  # nothing twice
    # the client's late answer to a withdrawn request is dropped; b's still goes through
    assert isinstance(client.send(result(asked[0]["id"], {})), Drop)
    assert client.send(result(asked[2]["id"], {})) == Send(BackendId("b"), result(7, {}))


def test_backend_lost_says_why_in_the_error_data() -> None:
    client = Client()
    client.new_session(1, "a", "s1")
    client.send(request(2, "session/prompt", sid("s1")))
    (failed,) = client.routes.backend_lost(BackendId("a"), reason="send failed").replies
    data = error_reply(failed, 2, -32013)
    assert data == {"backend": "a", "reason": "send failed", "retryable": True}


def test_backend_lost_forgets_it_as_the_last_backend() -> None:
    client = Client()
    client.new_session(1, "a", "s1")
    client.lost("a")
    error_reply(client.send(request(2, "_vendor/x", {})), 2, -32601)


def test_close_detaches_everything() -> None:
    client = Client()
    client.new_session(1, "a", "s1")
    client.new_session(2, "b", "s2")
    client.close()
    assert client.routes.attached() == {}
    assert sorted(client.attach_log) == [("a", -1), ("a", 1), ("b", -1), ("b", 1)]


# -- per-session order: frames wait behind their session's resume/load/close -----------------------


def resume(request_id: RequestId, session_id: str) -> str:
    return request(request_id, "session/resume", sid(session_id, cwd="/w"))


def prompt(request_id: RequestId, session_id: str) -> str:
    return request(request_id, "session/prompt", sid(session_id, prompt=[]))


def released(client: Client) -> list[Action]:
    """Everything the core releases now, as the shell would take it, one at a time."""
    actions = []
    while (action := client.routes.release()) is not None:
        actions.append(action)
    assert not client.routes.any_released()  # the shell's check before it asks
    return actions


def test_a_pipelined_prompt_waits_for_the_resume_then_goes_where_it_attached() -> None:
    client = Client()
    assert isinstance(client.send(resume(1, "s1")), Handle)
    assert client.send(prompt(2, "s1")) == Held(SessionId("s1"))
    assert client.routes.calls[2].held
    assert released(client) == []  # not while the resume is in flight
    client.routes.forward(1, "b")
    assert released(client) == []
    assert isinstance(client.backend("b", result(1, {})), Deliver)
    assert released(client) == [Send(BackendId("b"), prompt(2, "s1"))]
    assert client.routes.calls[2].backend == "b"
    assert released(client) == []


def test_held_frames_get_what_the_failed_resume_leaves_them() -> None:
    client = Client()
    client.send(resume(1, "s1"))
    client.send(prompt(2, "s1"))
    client.send(notification("session/cancel", sid("s1")))
    reply(client.routes.fail(1, LocateInconclusive()))
    first, second = released(client)
    data = error_reply(first, 2, -32010)  # truthful: the session is not attached here
    assert data["sessionId"] == "s1"
    assert isinstance(second, Drop)
    assert client.routes.unanswered() == []


def test_other_sessions_are_not_held() -> None:
    client = Client()
    client.new_session(1, "a", "s2")
    client.send(resume(2, "s1"))
    assert client.send(prompt(3, "s2")) == Send(BackendId("a"), prompt(3, "s2"))
    cancel = notification("session/cancel", sid("s2"))
    assert client.send(cancel) == Send(BackendId("a"), cancel)
    assert isinstance(client.send(request(4, "session/status", sid("s3"))), Handle)


def test_a_resume_of_an_attached_session_holds_it_too() -> None:
    """Its answer may move the session (a -32002 relocates): later frames wait for it."""
    client = Client()
    client.new_session(1, "a", "s1")
    assert client.send(resume(2, "s1")) == Send(BackendId("a"), resume(2, "s1"))
    assert client.send(prompt(3, "s1")) == Held(SessionId("s1"))
    assert isinstance(client.backend("a", error(2, -32002)), Relocate)
    assert released(client) == []  # relocating: still in flight
    client.routes.forward(2, "b")
    client.backend("b", result(2, {}))
    assert released(client) == [Send(BackendId("b"), prompt(3, "s1"))]


def test_a_released_resume_holds_the_frames_behind_it() -> None:
    client = Client()
    client.send(resume(1, "s1"))
    client.send(prompt(2, "s1"))
    assert client.send(resume(3, "s1")) == Held(SessionId("s1"))
    client.send(prompt(4, "s1"))
    client.routes.forward(1, "b")
    client.backend("b", result(1, {}))
    assert released(client) == [
        Send(BackendId("b"), prompt(2, "s1")),
        Send(BackendId("b"), resume(3, "s1")),  # attached now: straight there, and holding
    ]
    assert client.send(prompt(5, "s1")) == Held(SessionId("s1"))  # behind prompt 4
    client.backend("b", result(3, {}))
    assert released(client) == [
        Send(BackendId("b"), prompt(4, "s1")),
        Send(BackendId("b"), prompt(5, "s1")),
    ]
    assert client.send(prompt(6, "s1")) == Send(BackendId("b"), prompt(6, "s1"))


def test_frames_arriving_while_a_queue_drains_queue_behind_it() -> None:
    client = Client()
    client.send(resume(1, "s1"))
    client.send(prompt(2, "s1"))
    client.send(prompt(3, "s1"))
    client.routes.forward(1, "b")
    client.backend("b", result(1, {}))
    assert client.routes.release() == Send(BackendId("b"), prompt(2, "s1"))
    assert client.send(prompt(4, "s1")) == Held(SessionId("s1"))  # 3 has not gone yet
    assert released(client) == [
        Send(BackendId("b"), prompt(3, "s1")),
        Send(BackendId("b"), prompt(4, "s1")),
    ]


def test_a_close_of_a_detached_session_holds_it() -> None:
    client = Client()
    close = request(1, "session/close", sid("s1"))
    assert client.send(close) == Handle(Duty.LOCATE_DETACHED, as_request(close), SessionId("s1"))
    assert client.send(resume(2, "s1")) == Held(SessionId("s1"))
    client.routes.forward(1, "b")
    client.backend("b", result(1, {}))
    (located,) = released(client)
    assert located == Handle(Duty.LOCATE, as_request(resume(2, "s1")), SessionId("s1"))


def test_a_cancel_request_for_a_held_request_waits_behind_it() -> None:
    client = Client()
    client.send(resume(1, "s1"))
    client.send(prompt(2, "s1"))
    cancel = notification("$/cancel_request", {"requestId": 2})
    assert client.send(cancel) == Held(SessionId("s1"))
    client.routes.forward(1, "b")
    client.backend("b", result(1, {}))
    assert released(client) == [
        Send(BackendId("b"), prompt(2, "s1")),
        Send(BackendId("b"), cancel),
    ]


def test_held_frames_count_against_the_in_flight_limit() -> None:
    client = Client(Limits(max_in_flight=3))
    client.send(resume(1, "s1"))
    assert isinstance(client.send(prompt(2, "s1")), Held)
    assert isinstance(client.send(notification("session/cancel", sid("s1"))), Held)
    error_reply(client.send(prompt(3, "s1")), 3, -32014)
    assert isinstance(client.send(notification("session/cancel", sid("s1"))), Drop)
    assert sorted(client.routes.unanswered()) == [1, 2]


def test_a_backend_saying_not_attached_detaches_the_session() -> None:
    """The reference agent answers -32010 when another instance took the session: the
    next resume must be located, not sent back to it."""
    client = Client()
    client.new_session(1, "a", "s1")
    client.send(prompt(2, "s1"))
    delivered = client.backend("a", error(2, -32010, sid("s1")))
    assert isinstance(delivered, Deliver)
    assert client.routes.attached() == {}
    assert client.attach_log == [("a", 1), ("a", -1)]
    assert isinstance(client.send(resume(3, "s1")), Handle)


# -- limits ------------------------------------------------------------------------------------


def test_in_flight_limit() -> None:
    client = Client(Limits(max_in_flight=2))
    client.new_session(1, "a", "s1")
    assert isinstance(client.send(request(2, "session/prompt", sid("s1"))), Send)
    assert isinstance(client.send(request(3, "session/status", sid("s1"))), Handle)
    data = error_reply(client.send(request(4, "session/prompt", sid("s1"))), 4, -32014)
    assert data["retryable"] is True
    assert sorted(client.routes.unanswered()) == [2, 3]


def test_session_limit() -> None:
    client = Client(Limits(max_sessions=1))
    client.new_session(1, "a", "s1")
    error_reply(client.send(request(2, "session/new", new_params())), 2, -32015)
    data = error_reply(client.send(request(3, "session/resume", sid("s2"))), 3, -32015)
    assert data["sessionId"] == "s2"
    assert isinstance(client.send(request(4, "session/resume", sid("s1"))), Send)
    assert client.routes.unanswered() == [4]


def test_session_new_in_flight_counts_against_the_session_limit() -> None:
    # on the old main both were forwarded, and the second session ran unrouted
    client = Client(Limits(max_sessions=1))
    assert isinstance(client.send(request(1, "session/new", new_params())), Handle)
    client.routes.forward(1, "a")
    error_reply(client.send(request(2, "session/new", new_params())), 2, -32015)
    error_reply(client.send(request(3, "session/resume", sid("s2"))), 3, -32015)
    assert isinstance(client.backend("a", result(1, sid("s1"))), Deliver)
    assert client.routes.attached() == {"s1": "a"}
    assert client.attach_log == [("a", 1)]


def test_a_failed_session_new_frees_its_room() -> None:
    client = Client(Limits(max_sessions=1))
    assert isinstance(client.send(request(1, "session/new", new_params())), Handle)
    client.routes.fail(1, NoBackendAvailable())
    assert isinstance(client.send(request(2, "session/new", new_params())), Handle)


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
    assert client.routes.unanswered() == []
    # an id that merely contains it is the client's own
    assert isinstance(client.send(request("x-acp-router:1", "session/prompt", sid("s1"))), Send)


def test_a_close_answered_not_found_detaches_the_session() -> None:
    client = Client()
    client.new_session(1, "a", "s1")
    client.send(request(2, "session/close", sid("s1")))
    settled = client.backend("a", error(2, -32002, {"sessionId": "s1"}))
    assert isinstance(settled, Deliver)
    assert settled.settled is not None
    assert settled.settled.released == "s1"
    assert client.routes.attached() == {}
    error_reply(client.send(request(3, "session/prompt", sid("s1"))), 3, -32010)


def test_a_close_that_fails_otherwise_keeps_the_session_attached() -> None:
    client = Client()
    client.new_session(1, "a", "s1")
    client.send(request(2, "session/close", sid("s1")))
    settled = client.backend("a", error(2, -32603))
    assert isinstance(settled, Deliver)
    assert settled.settled is not None
    assert settled.settled.released is None
    assert client.routes.attached() == {"s1": "a"}


def test_a_lost_link_reports_the_calls_it_failed() -> None:
    client = Client()
    client.send(request(1, "session/resume", sid("s1")))
    client.routes.forward(1, "a")
    client.send(request(2, "_x/y"))
    lost = client.routes.backend_lost(BackendId("a"))
    assert [call.request.method for call in lost.calls] == ["session/resume", "_x/y"]


# -- links -------------------------------------------------------------------------------------


def test_the_first_frame_routed_to_a_backend_opens_its_link_with_the_handshake() -> None:
    client = Client()
    assert not client.routes.links_changed()
    assert client.routes.link_commands() == ()
    client.send(request(1, "session/new", new_params()))
    send = client.routes.forward(1, "a")
    assert client.routes.links_changed()
    (opened,) = client.routes.link_commands()
    assert not client.routes.links_changed()
    assert isinstance(opened, OpenLink)
    assert (opened.backend, opened.initialize.method, opened.authenticate, opened.first) == (
        "a",
        "initialize",
        None,
        (),
    )
    assert send == Send("a", request(1, "session/new", new_params()))
    client.send(request(2, "session/new", new_params()))
    client.routes.forward(2, "a")
    assert client.routes.link_commands() == ()  # one link per backend


def test_a_link_opened_ahead_is_closed_when_the_call_goes_elsewhere() -> None:
    client = Client()
    client.send(request(1, "session/resume", sid("s1")))
    client.routes.open_ahead(1, BackendId("a"))
    assert [type(c) for c in client.routes.link_commands()] == [OpenLink]
    client.routes.forward(1, "b")
    assert client.routes.link_commands() == (
        OpenLink(BackendId("b"), client.routes.initialize),
        CloseLink(BackendId("a"), "opened ahead, not needed"),
    )


def test_a_link_opened_ahead_stays_when_the_call_goes_there_or_another_frame_uses_it() -> None:
    client = Client()
    client.send(request(1, "session/resume", sid("s1")))
    client.routes.open_ahead(1, BackendId("a"))
    client.routes.link_commands()
    client.routes.forward(1, "a")
    assert client.routes.link_commands() == ()
    # used by another call first: the failed locate closes nothing
    client.send(request(2, "session/resume", sid("s2")))
    client.routes.open_ahead(2, BackendId("b"))
    client.routes.link_commands()
    client.send(request(3, "_x/y"))  # goes to the last backend used: a
    client.backend("a", result(1, {}))
    client.send(request(4, "session/prompt", sid("s1")))
    assert client.routes.fail(2, NoBackendAvailable()).error == -32011
    closed = [c for c in client.routes.link_commands() if isinstance(c, CloseLink)]
    assert closed == [CloseLink(BackendId("b"), "opened ahead, not needed")]


def test_a_failed_locate_closes_its_unused_link_ahead() -> None:
    client = Client()
    client.send(request(1, "session/resume", sid("s1")))
    client.routes.open_ahead(1, BackendId("a"))
    client.routes.link_commands()
    client.routes.fail(1, NoBackendAvailable())
    assert client.routes.link_commands() == (CloseLink(BackendId("a"), "opened ahead, not needed"),)


def test_a_link_that_opens_during_an_authenticate_round_joins_it() -> None:
    # on the old main, a link opened ahead of a resume during a round skipped it, and the
    # resume reached an agent that requires auth unauthenticated
    client = Client()
    client.new_session(1, "a", "s1")
    client.routes.link_commands()
    backends, routed_id = routed(client.send(AUTH))
    assert backends == ("a",)
    client.send(request(2, "session/resume", sid("s9")))
    client.routes.open_ahead(2, BackendId("b"))
    (opened,) = client.routes.link_commands()
    assert isinstance(opened, OpenLink)
    assert opened.backend == "b"
    assert opened.authenticate is None  # not accepted yet: it is the round's
    (first,) = opened.first
    assert orjson.loads(first) == {**orjson.loads(AUTH), "id": routed_id}
    # the round waits for every link that opens during it, and a joined link is not
    # closed as unused when the call it was opened ahead for goes elsewhere
    assert isinstance(client.backend("a", result(routed_id, {})), Drop)
    client.routes.forward(2, "c")
    commands = client.routes.link_commands()
    assert [(type(c), c.backend) for c in commands] == [(OpenLink, "c")]
    assert isinstance(client.backend("c", result(routed_id, {})), Drop)
    answered = client.backend("b", result(routed_id, {}))
    assert isinstance(answered, Deliver)
    assert kept(client) == as_request(AUTH)
    # a link opened after the round replays the accepted authenticate in its handshake
    client.send(request(3, "session/resume", sid("s8")))
    client.routes.forward(3, "d")
    (later,) = client.routes.link_commands()
    assert isinstance(later, OpenLink)
    assert (later.authenticate, later.first) == (as_request(AUTH), ())


# -- every request gets exactly one answer -----------------------------------------------------

BACKENDS = ("a", "b", "c")
IDS: tuple[RequestId, ...] = (0, 1, 2, 3, 4, 5, 6, "0", "a", "acp-router:authenticate:1")
SESSIONS = ("s1", "s2", "s3")
#: weighted towards the methods that place, locate, attach and detach
METHODS = (
    *("session/new",) * 3,
    *("session/prompt",) * 3,
    *("session/resume",) * 3,
    "session/load",
    *("session/close",) * 2,
    "session/status",
    "session/list",
    "_vendor/x",
    "initialize",
    "authenticate",
)
MAX_IN_FLIGHT = 5
MAX_SESSIONS = 2
MAX_AGENT_REQUESTS = 3


class Model:
    """The shell and the client around one ClientRoutes, keeping count of every answer.

    Each client frame is a *serial* (carried in its params as ``_n``); ``open`` maps the
    request ids in flight to theirs, and every answer the client can see is counted
    against the serial it answers. Frames of one session must leave the core (sent to a
    backend, or handed to the shell) in the order they came: ``left`` records that
    order. Each step takes three numbers that choose what it acts on among what exists
    then; after every step that can answer a request the shell releases held frames.
    """

    def __init__(self, *, failover: bool = False) -> None:
        self.attached: Counter[str] = Counter()
        limits = Limits(MAX_IN_FLIGHT, MAX_SESSIONS, MAX_AGENT_REQUESTS, failover=failover)
        self.routes = ClientRoutes(limits)
        #: [failover]: sessions whose link was lost, their frames waiting for the shell
        self.orphans: set[str] = set()
        #: the resumes the router made to fail sessions over, in flight -> their session
        self.internal: dict[RequestId, str] = {}
        init = self.routes.receive_client(parse(request("init", "initialize", {})))
        assert isinstance(init, Handle)
        self.routes.answer("init", {})
        self.serial = 0
        self.open: dict[RequestId, int] = {}
        self.answers: Counter[int] = Counter()
        self.forwarded: set[int] = set()
        self.handles: dict[RequestId, Handle] = {}
        self.agent_calls: dict[int, tuple[str, RequestId]] = {}
        self.relocated: dict[int, int] = {}
        self.waiting: set[RequestId] = set()  # held behind their session's resume/load/close
        self.holders: dict[RequestId, str] = {}  # resume/load/close in flight -> its session
        self.held_notifications = 0
        self.notes: set[int] = set()  # serials of notifications (they get no answer)
        #: per session, the frames waiting behind it: (serial, request id or None for a note)
        self.queued: dict[str, deque[tuple[int, RequestId | None]]] = defaultdict(deque)
        self.texts: dict[int, str] = {}
        self.left: dict[str, list[int]] = {}  # session -> serials, in the order they left
        #: the links the shell holds, as the core's link commands made them
        self.linked: set[str] = set()
        #: links opened ahead that nothing was sent on yet, and the call each was for
        self.unused: dict[str, RequestId | None] = {}
        #: the authenticate round in flight: the client's id, and the backends it waits on
        self.auth_id: RequestId | None = None
        self.auth_waiting: set[str] = set()
        self.auth_text = ""

    # -- the shell's links -----------------------------------------------------------------------

    def _links(self) -> None:
        """Carry out the core's link commands, as the shell does before each action."""
        for command in self.routes.link_commands():
            if isinstance(command, OpenLink):
                assert command.backend not in self.linked, "a second link to one backend"
                self.linked.add(command.backend)
                if command.first:
                    assert self.auth_id is not None, "a first frame with no round in flight"
                    assert command.first == (self.auth_text,)
                    self.auth_waiting.add(command.backend)
                else:
                    assert self.auth_id is None, "a link opened during a round skipped it"
                assert command.authenticate == self.routes.authenticate
            else:
                assert command.backend in self.unused, "closed a link that carried frames"
                self.linked.discard(command.backend)
                del self.unused[command.backend]

    def _sent(self, action: Action) -> None:
        """After the link commands: a frame goes only on a link the shell holds."""
        self._links()
        if isinstance(action, Send):
            assert action.backend in self.linked, f"sent to {action.backend} with no link"
            self.unused.pop(action.backend, None)
        elif isinstance(action, Broadcast):
            assert set(action.backends) <= self.linked
            for backend in action.backends:
                self.unused.pop(backend, None)

    def _no_link_ahead_for(self, request_id: RequestId) -> None:
        """A call that settled (or went where it goes) left no unused link behind."""
        assert request_id not in self.unused.values(), "an unused link outlived its call"

    def _round_began(self, action: Action, request_id: RequestId) -> None:
        assert isinstance(action, Broadcast), action
        assert self.auth_id is None
        self.auth_id = request_id
        self.auth_waiting = set(action.backends)
        self.auth_text = action.text
        assert orjson.loads(action.text)["id"] != request_id  # under a router id

    def _answered(self, text: str) -> None:
        request_id = orjson.loads(text)["id"]
        serial = self.open.pop(request_id)
        self.holders.pop(request_id, None)
        self.answers[serial] += 1
        assert self.answers[serial] == 1, f"request {request_id!r} answered twice"

    def _left(self, text: str) -> None:
        """A client frame left the core: note its place in its session's order."""
        frame = orjson.loads(text)
        if frame.get("method") in acp.SESSION_SCOPED:
            params = frame["params"]
            self.left.setdefault(params["sessionId"], []).append(params["_n"])

    def _routed(self, text: str, action: Action) -> None:
        """What became of a client request the core routed (on arrival or on release)."""
        request_id = orjson.loads(text)["id"]
        self._sent(action)
        if isinstance(action, Reply):
            self._answered(action.text)
            return
        if isinstance(action, Broadcast):
            assert action.backends == tuple(sorted(self.linked))
            self._round_began(action, request_id)
            return
        assert isinstance(action, Send | Handle), action
        self._left(text)
        call = self.routes.calls[request_id]
        if call.request.method in ("session/resume", "session/load") or (
            isinstance(action, Handle) and action.duty is Duty.LOCATE_DETACHED
        ):
            assert call.session_id is not None
            self.holders[request_id] = call.session_id
        if isinstance(action, Send):
            assert action.text == text
            assert call.backend == action.backend
            self.forwarded.add(self.open[request_id])
        else:
            assert action.request.text == text
            self.handles[request_id] = action

    def _is_held(self, session: str) -> bool:
        """True while a resume/load/close of ``session`` is in flight or frames wait on it
        (a failover's too)."""
        return (
            session in self.holders.values()
            or bool(self.queued[session])
            or session in self.orphans
            or session in self.internal.values()
        )

    def _room(self) -> bool:
        return len(self.routes.calls) + self.held_notifications < MAX_IN_FLIGHT

    def release_one(self) -> bool:
        """The shell takes one released frame and carries it out; False when none is."""
        session = next(
            iter(self.routes.sessions.releasable()), None
        )  # the core's choice, to check it
        # the shell asks only when this says so: it must agree with what release() does
        assert self.routes.any_released() == (session is not None)
        action = self.routes.release()
        if action is None:
            assert session is None
            return False
        assert session is not None
        serial, request_id = self.queued[session].popleft()
        if request_id is None:  # a notification
            self.held_notifications -= 1
            assert isinstance(action, Send | Drop), action
            self._sent(action)
            if isinstance(action, Send):
                assert orjson.loads(action.text)["params"].get("_n", serial) == serial
                self._left(action.text)
            return True
        self.waiting.remove(request_id)
        self._routed(self.texts[serial], action)
        return True

    def shell_releases(self, x: int, y: int, z: int) -> None:
        """The shell carries out a few released frames; client frames may come in between."""
        for _ in range(x % 3 + 1):
            self.release_one()

    # -- the client ----------------------------------------------------------------------------

    def client_request(self, x: int, y: int, z: int) -> None:
        request_id, method, session = IDS[x % len(IDS)], METHODS[y % len(METHODS)], SESSIONS[z % 3]
        self.serial += 1
        text = request(request_id, method, new_params() | sid(session, _n=self.serial))
        self.texts[self.serial] = text
        unscoped = ("session/new", "session/list", "_vendor/x", "initialize", "authenticate")
        scoped = method not in unscoped
        reserved = isinstance(request_id, str) and request_id.startswith("acp-router:")
        fresh = request_id not in self.open and not reserved
        expect_held = scoped and fresh and self._room() and self._is_held(session)
        action = self.routes.receive_client(parse(text))
        assert isinstance(action, Held) == expect_held, (action, expect_held)
        if isinstance(action, Reply):
            decoded = orjson.loads(action.text)
            assert decoded["id"] == request_id
            if not fresh:
                assert decoded["error"]["code"] == -32600  # reserved, or a refused duplicate
            self.answers[self.serial] += 1
            return
        assert fresh
        self.open[request_id] = self.serial
        if isinstance(action, Held):
            assert action.session_id == session
            assert self.routes.calls[request_id].held
            self.waiting.add(request_id)
            self.queued[session].append((self.serial, request_id))
            return
        self._routed(text, action)

    def client_cancels(self, x: int, y: int, z: int) -> None:
        self.serial += 1
        self.notes.add(self.serial)
        if z % 2:
            request_id = IDS[x % len(IDS)]
            note = notification("$/cancel_request", {"requestId": request_id, "_n": self.serial})
            call = self.routes.calls.get(request_id)
            backend = call.backend if call is not None else None
            held = call.session_id if call is not None and request_id in self.waiting else None
        else:
            session = SESSIONS[y % 3]
            note = notification("session/cancel", sid(session, _n=self.serial))
            backend = self.routes.attached().get(SessionId(session))
            held = SessionId(session) if self._is_held(session) else None
        room = self._room()
        action = self.routes.receive_client(parse(note))
        if held is not None and room:
            assert action == Held(held)
            self.held_notifications += 1
            self.queued[held].append((self.serial, None))
        elif held is not None or backend is None:
            assert isinstance(action, Drop)
        else:
            assert action == Send(backend, note)
            self._sent(action)
            self._left(note)

    def client_answers_an_agent(self, x: int, y: int, z: int) -> None:
        if not self.agent_calls:
            return
        router_id = sorted(self.agent_calls)[x % len(self.agent_calls)]
        backend, original = self.agent_calls.pop(router_id)
        action = self.routes.receive_client(parse(result(router_id, {"ok": router_id})))
        assert action == Send(backend, result(original, {"ok": router_id}))
        self._sent(action)

    # -- the shell -----------------------------------------------------------------------------

    def shell_decides(self, x: int, y: int, z: int) -> None:
        if not self.handles:
            return
        request_id = sorted(self.handles, key=repr)[x % len(self.handles)]
        handle = self.handles.pop(request_id)
        routed = handle.duty in (Duty.PLACE, Duty.LOCATE, Duty.LOCATE_DETACHED, Duty.AUTHENTICATE)
        choices = [*BACKENDS, "fail"] if routed else ["answer", "fail"]
        choice = choices[y % len(choices)]
        if request_id in self.internal:  # a failover's resume: the client sees nothing of it
            if choice == "fail":
                assert self.routes.end(request_id, NoBackendAvailable()) is None
                del self.internal[request_id]
                self._links()
            else:
                self._sent(self.routes.forward(request_id, choice))
            return
        if choice == "answer":
            reply = self.routes.answer(request_id, {})
            self._sent(reply)
            self._answered(reply.text)
        elif choice == "fail":
            failure = LocateInconclusive() if routed else NoBackendAvailable()
            reply = self.routes.fail(request_id, failure)
            self._sent(reply)
            self._answered(reply.text)
        elif handle.duty is Duty.AUTHENTICATE:
            broadcast = self.routes.authenticate_on(request_id, BackendId(choice))
            self._sent(broadcast)
            assert broadcast.backends == (choice,)
            self._round_began(broadcast, request_id)
            return
        else:
            send = self.routes.forward(request_id, choice)
            assert send == Send(choice, handle.request.text)
            self._sent(send)
            self.forwarded.add(self.open[request_id])
        self._no_link_ahead_for(request_id)

    def shell_opens_ahead(self, x: int, y: int, z: int) -> None:
        """The shell guesses where a resume being located will go and opens that link."""
        locating = sorted((i for i, h in self.handles.items() if h.duty is Duty.LOCATE), key=repr)
        if not locating:
            return
        request_id, backend = locating[x % len(locating)], BACKENDS[y % 3]
        fresh = backend not in self.linked
        self.routes.open_ahead(request_id, BackendId(backend))
        joins = self.auth_id is not None
        self._links()
        assert backend in self.linked
        if fresh and not joins:
            self.unused[backend] = request_id

    # -- backends ------------------------------------------------------------------------------

    def backend_answers(self, x: int, y: int, z: int) -> None:
        waiting = sorted((i for i, c in self.routes.calls.items() if c.backend), key=repr)
        if not waiting:
            return
        request_id = waiting[x % len(waiting)]
        call = self.routes.calls[request_id]
        assert call.backend is not None
        outcome = ("ok", "not_found", "error")[y % 3]
        session = call.session_id
        if outcome == "ok":
            text = result(request_id, sid(SESSIONS[z % 3]))
            if call.request.method == "session/new":
                session = SessionId(SESSIONS[z % 3])
        else:
            text = error(request_id, -32002 if outcome == "not_found" else -32603)
        before = self.routes.attached()
        action = self.routes.receive_backend(call.backend, parse(text))
        self._sent(action)
        self._check_attachment(call.request.method, outcome, call.backend, session, before)
        if request_id in self.internal:
            if isinstance(action, Relocate):
                self.handles[request_id] = Handle(Duty.LOCATE, call.request, call.session_id)
                return
            assert isinstance(action, Absorbed), action  # never delivered to the client
            assert action.settled.resume == ("ok" if outcome == "ok" else action.settled.resume)
            self.record(action.settled.changes)
            del self.internal[request_id]
            return
        if isinstance(action, Relocate):
            assert outcome == "not_found"
            assert call.request.method in ("session/resume", "session/load")
            serial = self.open[request_id]
            self.relocated[serial] = self.relocated.get(serial, 0) + 1
            assert self.relocated[serial] < Limits().max_resume_attempts, "relocated unbounded"
            assert self.routes.calls[request_id].tried[-1] == call.backend
            self.handles[request_id] = Handle(Duty.LOCATE, call.request, call.session_id)
            return
        assert isinstance(action, Deliver)
        assert action.text == text
        assert action.settled is not None
        assert action.settled.call == call
        self.record(action.settled.changes)
        self._answered(action.text)
        self._no_link_ahead_for(request_id)

    def shell_fails_over(self, x: int, y: int, z: int) -> None:
        """The shell resumes a lost session where it lives now ([failover]), or gives up."""
        if not self.orphans:
            return
        session = sorted(self.orphans)[x % len(self.orphans)]
        self.orphans.discard(session)
        if y % 3 == 0:
            self.routes.give_up_failover(SessionId(session))
            return
        handle = self.routes.fail_over(SessionId(session))
        assert handle is not None
        assert handle.request.method == "session/resume"
        assert handle.request.param("sessionId") == session
        assert str(handle.request.id).startswith("acp-router:failover:")
        assert self.routes.fail_over(SessionId(session)) is None  # once
        self.internal[handle.request.id] = session
        self.handles[handle.request.id] = handle

    def backend_answers_the_round(self, x: int, y: int, z: int) -> None:
        """A backend the authenticate round waits on accepts or refuses it."""
        if self.auth_id is None:
            return
        waiting = sorted(self.auth_waiting)
        backend = waiting[x % len(waiting)]
        routed_id = orjson.loads(self.auth_text)["id"]
        accepts = y % 3 != 0
        text = result(routed_id, {}) if accepts else error(routed_id, -32000)
        action = self.routes.receive_backend(BackendId(backend), parse(text))
        self._sent(action)
        self.auth_waiting.discard(backend)
        if accepts and self.auth_waiting:
            assert isinstance(action, Drop), action
            return
        assert isinstance(action, Deliver), action
        assert orjson.loads(action.text)["id"] == self.auth_id
        request_id, self.auth_id, self.auth_waiting = self.auth_id, None, set()
        assert (self.routes.authenticate is not None) is accepts or not accepts
        if accepts:
            assert self.routes.authenticate is not None
            assert self.routes.authenticate.id == request_id
        self._answered(action.text)

    def record(self, changes: Iterable[Change]) -> None:
        for change in changes:
            self.attached[change.backend] += 1 if isinstance(change, Attach) else -1

    def _check_attachment(
        self, method: str, outcome: str, backend: str, session: str | None, before: dict[str, str]
    ) -> None:
        after = self.routes.attached()
        closed = method == "session/close" and outcome in ("ok", "not_found")
        if closed and session is not None and before.get(session) == backend:
            assert after == {s: b for s, b in before.items() if s != session}
        elif outcome != "ok" or session is None:
            assert after == before
        elif method in ("session/new", "session/resume", "session/load"):
            room = session in before or len(before) < MAX_SESSIONS
            assert after == ((before | {session: backend}) if room else before)
        else:
            assert after == before

    def backend_answers_nothing_in_flight(self, x: int, y: int, z: int) -> None:
        backend, request_id = BACKENDS[x % 3], IDS[y % len(IDS)]
        call = self.routes.calls.get(request_id)
        answers_the_round = (
            backend in self.auth_waiting and request_id == (orjson.loads(self.auth_text)["id"])
        )
        if (call is None or call.backend != backend) and not answers_the_round:
            action = self.routes.receive_backend(backend, parse(result(request_id, {})))
            assert isinstance(action, Drop)

    def agent_request(self, x: int, y: int, z: int) -> None:
        backend, original = BACKENDS[x % 3], IDS[y % len(IDS)]
        if backend not in self.linked:
            return  # only a backend with a link sends anything
        action = self.routes.receive_backend(backend, parse(request(original, "fs/x", {})))
        self.unused.pop(backend, None)  # a link that carries a request is in use
        if len(self.agent_calls) >= MAX_AGENT_REQUESTS:
            assert isinstance(action, Send)
            assert action.backend == backend
            self._sent(action)
            return
        assert isinstance(action, Deliver)
        router_id = orjson.loads(action.text)["id"]
        assert router_id not in self.agent_calls
        self.agent_calls[router_id] = (backend, original)

    def backend_lost(self, x: int, y: int, z: int) -> None:
        backend = BACKENDS[x % 3]
        lost = self.routes.backend_lost(backend)
        self.linked.discard(backend)
        self.unused.pop(backend, None)
        self._links()
        self.record(lost.detached)
        for call in lost.calls:
            if call.request.id in self.internal:  # a failover lost with its link: quiet
                del self.internal[call.request.id]
                self.handles.pop(call.request.id, None)
        assert set(lost.orphaned) <= set(SESSIONS)
        self.orphans |= set(lost.orphaned)
        if backend in self.auth_waiting:
            assert self.auth_id in {orjson.loads(a.text)["id"] for a in lost.replies}
            self.auth_id, self.auth_waiting = None, set()
        for answer in lost.replies:
            assert orjson.loads(answer.text)["error"]["code"] == -32013
            self._answered(answer.text)
        self.agent_calls = {r: e for r, e in self.agent_calls.items() if e[0] != backend}
        assert all(c.backend != backend for c in self.routes.calls.values())
        assert backend not in self.routes.attached().values()

    # -- checks --------------------------------------------------------------------------------

    def check(self) -> None:
        assert set(self.routes.calls) == set(self.open) | set(self.internal)
        for request_id, call in self.routes.calls.items():
            unrouted = request_id in self.handles or call.held or request_id == self.auth_id
            assert (call.backend is None) == unrouted
            assert call.held == (request_id in self.waiting)
        assert set(self.answers.values()) <= {1}
        assert +self.attached == Counter(self.routes.attached().values())
        assert all(count >= 0 for count in self.attached.values())
        assert len(self.routes.attached()) <= MAX_SESSIONS
        for session, serials in self.left.items():
            assert serials == sorted(set(serials)), f"{session}'s frames left out of order"

    def finish(self) -> None:
        while self.release_one():
            pass
        # Every backend goes away: whatever was forwarded has its one answer now ...
        for backend in range(len(BACKENDS)):
            self.backend_lost(backend, 0, 0)
        while self.release_one():
            pass
        for serial in self.forwarded - set(self.open.values()):
            assert self.answers[serial] == 1
        # ... and the rest waits on the shell, or behind a call that waits on the shell
        # (or on a failover the shell has not decided yet).
        assert set(self.open) == (set(self.handles) - set(self.internal)) | self.waiting
        for session in sorted(self.orphans):
            self.routes.give_up_failover(SessionId(session))
        self.orphans.clear()
        while self.release_one():
            pass
        while self.handles:
            request_id = sorted(self.handles, key=repr)[0]
            del self.handles[request_id]
            if request_id in self.internal:
                assert self.routes.end(request_id, NoBackendAvailable()) is None
                del self.internal[request_id]
            else:
                reply = self.routes.fail(request_id, NoBackendAvailable())
                self._sent(reply)
                self._answered(reply.text)
            while self.release_one():
                pass
        assert not self.waiting
        assert self.routes.unanswered() == []
        assert sorted(self.answers) == sorted(
            n for n in range(1, self.serial + 1) if n not in self.notes
        )
        assert set(self.answers.values()) <= {1}
        self.check()


STEPS = (
    *(Model.client_request,) * 4,
    *(Model.shell_decides,) * 3,
    *(Model.backend_answers,) * 3,
    Model.shell_opens_ahead,
    Model.backend_answers_the_round,
    *(Model.shell_releases,) * 2,
    Model.client_cancels,
    Model.client_answers_an_agent,
    Model.backend_answers_nothing_in_flight,
    Model.agent_request,
    Model.backend_lost,
)
_STEP = st.tuples(st.sampled_from(STEPS), st.integers(0, 2**24 - 1))


@settings(max_examples=300, deadline=None)
@given(st.lists(_STEP, min_size=30, max_size=90))
def test_every_request_is_answered_exactly_once(steps: list[Any]) -> None:
    model = Model()
    for step, choice in steps:
        step(model, choice & 0xFF, (choice >> 8) & 0xFF, choice >> 16)
        model.check()
    model.finish()


_FAILOVER_STEP = st.tuples(
    st.sampled_from((*STEPS, Model.shell_fails_over, Model.shell_fails_over)),
    st.integers(0, 2**24 - 1),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(_FAILOVER_STEP, min_size=30, max_size=90))
def test_with_failover_every_request_is_still_answered_exactly_once(steps: list[Any]) -> None:
    model = Model(failover=True)
    for step, choice in steps:
        step(model, choice & 0xFF, (choice >> 8) & 0xFF, choice >> 16)
        model.check()
    model.finish()


# -- nothing a peer sends makes the core raise -----------------------------------------------------

_ANY_VALUE: st.SearchStrategy[Any] = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-2, 3)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.sampled_from(["s1", "a", ""]),
    lambda children: (
        st.lists(children, max_size=3)
        | st.dictionaries(
            st.sampled_from(["sessionId", "requestId", "cwd", "_meta", "x"]), children, max_size=3
        )
    ),
    max_leaves=4,
)
_ANY_PARAMS: st.SearchStrategy[Any] = (
    st.none()
    | st.lists(_ANY_VALUE, max_size=2)
    | st.dictionaries(st.sampled_from(["sessionId", "requestId", "cwd"]), _ANY_VALUE, max_size=3)
)
_ANY_METHOD = st.sampled_from(
    [
        *dict.fromkeys(METHODS),
        "authenticate",
        "session/cancel",
        "$/cancel_request",
        "session/update",
        "fs/x",
    ]
)
_ANY_ID: st.SearchStrategy[RequestId] = st.integers(0, 3) | st.sampled_from(["a", "0"])
_ANY_FRAME = st.one_of(
    st.builds(request, _ANY_ID, _ANY_METHOD, _ANY_PARAMS),
    st.builds(notification, _ANY_METHOD, _ANY_PARAMS),
    st.builds(result, _ANY_ID, _ANY_VALUE),
    st.builds(error, _ANY_ID, st.sampled_from([-32002, -32603]), _ANY_VALUE),
)


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["client", "a", "b", "lost", "shell"]), _ANY_FRAME), max_size=12
    )
)
def test_no_frame_makes_the_core_raise(steps: list[tuple[str, str]]) -> None:
    routes = ClientRoutes(Limits(max_in_flight=3, max_sessions=2, max_agent_requests=2))
    for who, text in steps:
        message = parse(text)
        if who == "client":
            _check_counted(routes.receive_client(message))
        elif who == "lost":
            for reply in routes.backend_lost("a").replies:
                _check_counted(reply)
        elif who == "shell":
            for request_id in [i for i, call in routes.calls.items() if call.backend is None]:
                if routes.auth.round is not None and routes.auth.round.request.id == request_id:
                    continue  # on its way: the backends answer it
                if routes.calls[request_id].request.method == "authenticate":
                    routes.authenticate_on(request_id, BackendId("a"))
                else:
                    routes.forward(request_id, BackendId("a"))
        else:
            relayed = routes.relays(message)
            action = routes.receive_backend(who, message)
            if relayed:  # the shell delivers such a frame without asking receive_backend
                assert action == Deliver(message.text), (text, action)


def _check_counted(action: object) -> None:
    """An error the router makes says its code as data (the shell counts it by that)."""
    if isinstance(action, Reply):
        error = orjson.loads(action.text).get("error")
        assert action.error == (None if error is None else error["code"])


# -- failover ------------------------------------------------------------------------------------


def test_with_failover_a_lost_sessions_frames_wait_and_it_is_resumed_quietly() -> None:
    client = Client(Limits(failover=True))
    client.new_session(1, "a", "s1")
    client.send(request(2, "session/prompt", sid("s1", prompt=[])))
    lost = client.routes.backend_lost(BackendId("a"))
    assert [orjson.loads(r.text)["id"] for r in lost.replies] == [2]  # the one error
    assert lost.orphaned == ("s1",)
    assert lost.detached == (Detach(SessionId("s1"), BackendId("a")),)
    # the client's next prompt waits for the failover
    assert client.send(request(3, "session/prompt", sid("s1", prompt=[]))) == Held("s1")
    handle = client.routes.fail_over(SessionId("s1"))
    assert handle is not None
    assert handle.duty is Duty.LOCATE
    resume = orjson.loads(handle.request.text)
    assert resume["method"] == "session/resume"
    assert resume["params"] == {**new_params(), "sessionId": "s1"}  # the new session's params
    assert str(resume["id"]).startswith("acp-router:failover:")
    assert client.routes.fail_over(SessionId("s1")) is None  # once
    client.routes.forward(handle.request.id, "b")
    absorbed = client.routes.receive_backend(BackendId("b"), parse(result(resume["id"], {})))
    assert isinstance(absorbed, Absorbed)  # the client never sees this answer
    assert absorbed.settled.resume == "ok"
    assert client.routes.attached() == {"s1": "b"}
    released = client.routes.release()
    assert released == Send(BackendId("b"), request(3, "session/prompt", sid("s1", prompt=[])))


def test_a_failover_given_up_lets_the_frames_go_as_unattached() -> None:
    client = Client(Limits(failover=True))
    client.new_session(1, "a", "s1")
    assert client.routes.backend_lost(BackendId("a")).orphaned == ("s1",)
    assert client.send(request(2, "session/prompt", sid("s1"))) == Held("s1")
    client.routes.give_up_failover(SessionId("s1"))
    error_reply(client.routes.release() or Drop("none"), 2, -32010)
    assert client.routes.fail_over(SessionId("s1")) is None


def test_a_failover_that_finds_no_home_answers_nothing_and_releases_the_frames() -> None:
    client = Client(Limits(failover=True))
    client.new_session(1, "a", "s1")
    client.routes.backend_lost(BackendId("a"))
    assert client.send(request(2, "session/prompt", sid("s1"))) == Held("s1")
    handle = client.routes.fail_over(SessionId("s1"))
    assert handle is not None
    assert client.routes.internal(handle.request.id)
    assert client.routes.end(handle.request.id, NoBackendAvailable()) is None
    error_reply(client.routes.release() or Drop("none"), 2, -32010)


def test_without_failover_nothing_is_orphaned() -> None:
    client = Client()
    client.new_session(1, "a", "s1")
    assert client.routes.backend_lost(BackendId("a")).orphaned == ()
    error_reply(client.send(request(2, "session/prompt", sid("s1"))), 2, -32010)
