"""The host's bookkeeping, sans-I/O: ids kept apart, sessions routed to their owner."""

from __future__ import annotations

import json
from typing import Any

import pytest

from router.host.multiplex import (
    HANDSHAKE_ID,
    Action,
    HostLimits,
    Multiplexer,
    ToAgent,
    ToClient,
)
from router.host.stderr import StderrTail
from router.protocol.acp import EPOCH_META_KEY as EPOCH
from router.protocol.errors import InternalError
from router.protocol.ids import SessionId
from router.protocol.jsonrpc import Response
from router.protocol.reading import parse


def frame(**members: Any) -> str:
    return json.dumps({"jsonrpc": "2.0", **members})


def ready_mux(agent_caps: dict[str, Any] | None = None) -> Multiplexer:
    mux = Multiplexer()
    caps = agent_caps if agent_caps is not None else {"loadSession": True}
    result = {"protocolVersion": 1, "agentCapabilities": caps}
    response = parse(frame(id=HANDSHAKE_ID, result=result))
    assert isinstance(response, Response)
    mux.agent_initialized(response, "nonce-1", StderrTail())
    return mux


def joined(mux: Multiplexer) -> int:
    client = mux.client_joined()
    mux.receive_client(client, parse(frame(id=0, method="initialize", params={})))
    return client


def only(actions: list[Action]) -> Action:
    assert len(actions) == 1, actions
    return actions[0]


def agent_id_of(action: Action) -> Any:
    assert isinstance(action, ToAgent)
    return json.loads(action.text)["id"]


def test_clients_with_equal_ids_get_distinct_agent_ids_and_their_own_answers() -> None:
    mux = ready_mux()
    a, b = joined(mux), joined(mux)
    new = frame(id=1, method="session/new", params={"cwd": "/", "mcpServers": []})
    to_a = agent_id_of(only(mux.receive_client(a, parse(new))))
    to_b = agent_id_of(only(mux.receive_client(b, parse(new))))
    assert to_a != to_b
    answer = only(mux.receive_agent(parse(frame(id=to_b, result={"sessionId": "s_b"}))))
    assert answer == ToClient(b, frame(id=1, result={"sessionId": "s_b"}))
    assert mux.sessions == {"s_b": b}


def test_a_cancel_request_names_the_agent_side_id() -> None:
    mux = ready_mux()
    a = joined(mux)
    prompt = frame(id="p", method="session/prompt", params={"sessionId": "s", "prompt": []})
    host_id = agent_id_of(only(mux.receive_client(a, parse(prompt))))
    cancel = only(
        mux.receive_client(a, parse(frame(method="$/cancel_request", params={"requestId": "p"})))
    )
    assert isinstance(cancel, ToAgent)
    assert json.loads(cancel.text)["params"] == {"requestId": host_id}
    # naming a request this client does not have goes nowhere
    other = frame(method="$/cancel_request", params={"requestId": "zzz"})
    assert mux.receive_client(a, parse(other)) == []


def test_agent_requests_go_to_the_owner_and_are_refused_when_it_left() -> None:
    mux = ready_mux()
    a = joined(mux)
    host_id = agent_id_of(
        only(mux.receive_client(a, parse(frame(id=1, method="session/new", params={}))))
    )
    mux.receive_agent(parse(frame(id=host_id, result={"sessionId": "s"})))
    ask = frame(id=40, method="session/request_permission", params={"sessionId": "s"})
    assert only(mux.receive_agent(parse(ask))) == ToClient(a, ask)
    refused = only(mux.client_left(a))
    assert isinstance(refused, ToAgent)
    assert json.loads(refused.text)["id"] == 40
    assert "error" in json.loads(refused.text)
    # the session outlives its client, owned by nobody; its traffic is refused
    assert mux.sessions == {"s": None}
    again = only(
        mux.receive_agent(
            parse(frame(id=41, method="fs/read_text_file", params={"sessionId": "s"}))
        )
    )
    assert isinstance(again, ToAgent)
    assert json.loads(again.text)["error"]["code"] == -32603


def test_the_agents_death_answers_what_it_owed_and_forgets_every_session() -> None:
    mux = ready_mux()
    a = joined(mux)
    mux.sessions[SessionId("s")] = a
    prompt = frame(id=9, method="session/prompt", params={"sessionId": "s", "prompt": []})
    mux.receive_client(a, parse(prompt))
    [lost] = mux.agent_lost()
    assert isinstance(lost, ToClient)
    assert json.loads(lost.text)["error"]["code"] == -32013
    assert mux.sessions == {}
    assert mux.agent_result is None


def test_close_makes_a_session_inactive_only_when_the_agent_can_restore_it() -> None:
    for caps, expected in (({"loadSession": True}, "inactive"), ({}, None)):
        mux = ready_mux(caps)
        a = joined(mux)
        mux.sessions[SessionId("s")] = a
        close = frame(id=2, method="session/close", params={"sessionId": "s"})
        host_id = agent_id_of(only(mux.receive_client(a, parse(close))))
        mux.receive_agent(parse(frame(id=host_id, result={})))
        status = frame(id=3, method="session/status", params={"sessionId": "s"})
        answer = json.loads(only(mux.receive_client(a, parse(status))).text)
        if expected is None:
            assert answer["error"] == {
                "code": -32002,
                "message": "Resource not found",
                "data": {"sessionId": "s"},
            }
        else:
            assert answer["result"] == {"status": expected, "_meta": {EPOCH: 0}}


def request_of(action: Action) -> dict[str, Any]:
    answer: dict[str, Any] = json.loads(action.text)
    return answer


def test_limits_and_duplicates_are_answered_by_the_host() -> None:
    mux = Multiplexer(HostLimits(max_sessions=1, max_in_flight_per_client=2, max_in_flight=3))
    ready = ready_mux()
    mux.agent_result = ready.agent_result
    a, b = joined(mux), joined(mux)
    new = frame(id=1, method="session/new", params={})
    assert isinstance(only(mux.receive_client(a, parse(new))), ToAgent)
    again = request_of(only(mux.receive_client(a, parse(new))))
    assert again["error"]["code"] == -32600  # id 1 is in flight
    mux.sessions[SessionId("s")] = a
    full = request_of(only(mux.receive_client(a, parse(frame(id=2, method="session/new")))))
    assert full["error"]["code"] == -32015
    ext = frame(id=3, method="_x/y")
    assert isinstance(only(mux.receive_client(a, parse(ext))), ToAgent)
    busy = request_of(only(mux.receive_client(a, parse(frame(id=4, method="_x/y")))))
    assert busy["error"]["code"] == -32014
    assert isinstance(only(mux.receive_client(b, parse(ext))), ToAgent)
    agent_full = request_of(only(mux.receive_client(b, parse(frame(id=5, method="_x/y")))))
    assert agent_full["error"]["code"] == -32014
    # notifications pass as they are
    cancel = frame(method="session/cancel", params={"sessionId": "s"})
    assert mux.receive_client(a, parse(cancel)) == [ToAgent(cancel)]
    # answers to nothing go nowhere
    assert mux.receive_client(a, parse(frame(id=99, result={}))) == []
    assert mux.receive_agent(parse(frame(id=12345, result={}))) == []
    # while the agent restarts, requests are refused
    mux.agent_lost()
    restarting = request_of(only(mux.receive_client(a, parse(frame(id=7, method="_x/y")))))
    assert restarting["error"]["code"] == -32013


def test_the_agents_own_status_answer_is_translated_from_its_dialect() -> None:
    mux = ready_mux({"sessionCapabilities": {"status": {}}})
    a = joined(mux)
    cases: list[tuple[dict[str, Any], dict[str, Any]]] = [
        (
            {"result": {"status": "open", "_meta": {"k": 1}}},
            {"result": {"status": "active", "_meta": {"k": 1, EPOCH: 0}}},
        ),
        ({"result": {"status": "live"}}, {"result": {"status": "active", "_meta": {EPOCH: 0}}}),
        (
            {"result": {"status": "saved"}},
            {"result": {"status": "inactive", "_meta": {EPOCH: 0}}},
        ),
        (
            {"result": {"status": "hibernating"}},
            {"result": {"status": "inactive", "_meta": {EPOCH: 0}}},
        ),
        (
            {"result": {"status": "not_found"}},
            {
                "error": {
                    "code": -32002,
                    "message": "Resource not found",
                    "data": {"sessionId": "s"},
                }
            },
        ),
        (
            {"error": {"code": -32002, "message": "nope", "data": {"uri": "s"}}},
            {
                "error": {
                    "code": -32002,
                    "message": "Resource not found",
                    "data": {"sessionId": "s"},
                }
            },
        ),
        # no usable answer: the host's own table (it never saw "s")
        (
            {"error": {"code": -32603, "message": "boom"}},
            {
                "error": {
                    "code": -32002,
                    "message": "Resource not found",
                    "data": {"sessionId": "s"},
                }
            },
        ),
    ]
    for n, (agent_says, client_gets) in enumerate(cases):
        asked = frame(id=n, method="session/status", params={"sessionId": "s"})
        host_id = agent_id_of(only(mux.receive_client(a, parse(asked))))
        answer = only(mux.receive_agent(parse(frame(id=host_id, **agent_says))))
        assert request_of(answer) == {"jsonrpc": "2.0", "id": n, **client_gets}, agent_says


def test_agent_traffic_without_a_session_follows_the_request_it_names() -> None:
    mux = ready_mux()
    a, b = joined(mux), joined(mux)
    host_id = agent_id_of(only(mux.receive_client(b, parse(frame(id=1, method="_long")))))
    # a request-scoped agent request goes to the client whose request it serves
    elicit = frame(id="e1", method="elicitation/create", params={"requestId": host_id})
    assert only(mux.receive_agent(parse(elicit))) == ToClient(b, elicit)
    # the agent's $/cancel_request for it goes to the same client
    withdrawn = frame(method="$/cancel_request", params={"requestId": "e1"})
    assert only(mux.receive_agent(parse(withdrawn))) == ToClient(b, withdrawn)
    # the answer comes only from that client
    assert mux.receive_client(a, parse(frame(id="e1", result={}))) == []
    assert mux.receive_client(b, parse(frame(id="e1", result={}))) == [
        ToAgent(frame(id="e1", result={}))
    ]
    # a notification for a session nobody owns is dropped
    update = frame(method="session/update", params={"sessionId": "zzz", "update": {}})
    assert mux.receive_agent(parse(update)) == []
    # an answer whose client left settles the bookkeeping and goes nowhere
    mux.client_left(b)
    assert mux.receive_agent(parse(frame(id=host_id, result={}))) == []


def test_too_many_agent_requests_are_refused_and_old_closed_sessions_forgotten() -> None:
    mux = Multiplexer(HostLimits(max_agent_requests=1, max_remembered=1))
    mux.agent_result = ready_mux().agent_result
    a = joined(mux)
    for name in ("s1", "s2"):
        mux.sessions[SessionId(name)] = a
    first = frame(id=1, method="session/request_permission", params={"sessionId": "s1"})
    assert only(mux.receive_agent(parse(first))) == ToClient(a, first)
    second = frame(id=2, method="session/request_permission", params={"sessionId": "s2"})
    assert request_of(only(mux.receive_agent(parse(second))))["error"]["code"] == -32014
    for n, name in enumerate(("s1", "s2")):
        close = frame(id=10 + n, method="session/close", params={"sessionId": name})
        host_id = agent_id_of(only(mux.receive_client(a, parse(close))))
        mux.receive_agent(parse(frame(id=host_id, result={})))
    status = frame(id=20, method="session/status", params={"sessionId": "s1"})
    assert request_of(only(mux.receive_client(a, parse(status))))["error"]["code"] == -32002
    status = frame(id=21, method="session/status", params={"sessionId": "s2"})
    assert request_of(only(mux.receive_client(a, parse(status))))["result"] == {
        "status": "inactive",
        "_meta": {EPOCH: 0},
    }


def test_an_agent_that_refuses_initialize_is_reported() -> None:
    refused = parse(frame(id=HANDSHAKE_ID, error={"code": -32603, "message": "no"}))
    assert isinstance(refused, Response)
    with pytest.raises(InternalError, match="did not initialize"):
        Multiplexer().agent_initialized(refused, "nonce-1", StderrTail())


def test_a_child_announced_by_its_parent_belongs_to_the_parents_client() -> None:
    mux = ready_mux()
    a = joined(mux)
    resume = frame(id=1, method="session/resume", params={"sessionId": "p", "cwd": "/"})
    host_id = agent_id_of(only(mux.receive_client(a, parse(resume))))
    announce = frame(
        method="session/update",
        params={"sessionId": "p", "update": {"sessionUpdate": "subagent_update", "sessionId": "c"}},
    )
    # announced while the parent's resume is still being answered
    assert only(mux.receive_agent(parse(announce))) == ToClient(a, announce)
    mux.receive_agent(parse(frame(id=host_id, result={})))
    assert mux.sessions == {"c": a, "p": a}
    grandchild = frame(
        method="session/update",
        params={"sessionId": "c", "update": {"sessionUpdate": "subagent_update", "sessionId": "g"}},
    )
    mux.receive_agent(parse(grandchild))
    assert mux.sessions["g"] == a  # type: ignore[index]
    ask = frame(id=5, method="session/request_permission", params={"sessionId": "g"})
    assert only(mux.receive_agent(parse(ask))) == ToClient(a, ask)


def test_the_stderr_tail_keeps_the_last_lines_and_counts_them_all() -> None:
    tail = StderrTail()
    tail.feed(b"one\ntw")
    assert (tail.count, tail.last()) == (1, "one")
    tail.feed(b"o\n\nthree")
    assert tail.since(1) == "two"  # blank lines are not reported
    tail.end()  # a last line without a newline counts
    assert (tail.count, tail.since(3)) == (4, "three")
    assert tail.since(4) is None
    tail.feed(b"".join(b"line %d\n" % n for n in range(100)))
    assert tail.last() == "\n".join(f"line {n}" for n in range(95, 100))


def test_a_refused_session_carries_what_the_agent_wrote_since_it_was_asked() -> None:
    mux = ready_mux()
    tail = StderrTail()
    mux.stderr = tail
    a = joined(mux)
    tail.feed(b"starting up\n")  # before the request: not its reason
    new = frame(id=1, method="session/new", params={"cwd": "/", "mcpServers": []})
    host_id = agent_id_of(only(mux.receive_client(a, parse(new))))
    tail.feed(b"cannot run as root\n")
    refusal = {"code": -32603, "message": "Query closed", "data": {"k": 1}}
    answer = only(mux.receive_agent(parse(frame(id=host_id, error=refusal))))
    assert isinstance(answer, ToClient)
    assert json.loads(answer.text)["error"] == {
        "code": -32603,
        "message": "Query closed",
        "data": {"k": 1, "agentStderr": "cannot run as root"},
    }
    # data that is not an object is left alone; so is a refusal with nothing new said
    for data in ("a string", None):
        host_id = agent_id_of(only(mux.receive_client(a, parse(new))))
        if data is not None:
            tail.feed(b"again\n")
        refusal = {"code": -32603, "message": "no", **({"data": data} if data else {})}
        answer = only(mux.receive_agent(parse(frame(id=host_id, error=refusal))))
        assert isinstance(answer, ToClient)
        assert json.loads(answer.text)["error"] == refusal


def test_initialize_names_the_agent_process_and_keeps_the_agents_meta() -> None:
    mux = Multiplexer()
    result = {"protocolVersion": 1, "agentCapabilities": {}, "_meta": {"instanceId": "x", "k": 1}}
    response = parse(frame(id=HANDSHAKE_ID, result=result))
    assert isinstance(response, Response)
    mux.agent_initialized(response, "nonce-2", StderrTail())
    assert mux.advertised()["_meta"] == {"instanceId": "nonce-2", "k": 1}


def test_the_host_keeps_the_epoch_a_resume_carried_and_reports_it() -> None:
    """A stdio agent knows nothing of epochs: the host keeps each session's, so that it
    takes part in the router's fencing (never lowered; forgotten with the session)."""
    mux = ready_mux({"sessionCapabilities": {"resume": {}}})
    a = joined(mux)
    for n, epoch in enumerate((1_000, 500, 2_000)):
        params = {"sessionId": "s", "cwd": "/w", "_meta": {EPOCH: epoch}}
        resume = frame(id=10 + n, method="session/resume", params=params)
        host_id = agent_id_of(only(mux.receive_client(a, parse(resume))))
        mux.receive_agent(parse(frame(id=host_id, result={})))
    status = frame(id=20, method="session/status", params={"sessionId": "s"})
    answer = json.loads(only(mux.receive_client(a, parse(status))).text)
    assert answer["result"] == {"status": "active", "_meta": {EPOCH: 2_000}}
