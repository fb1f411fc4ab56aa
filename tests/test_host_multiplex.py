"""The host's bookkeeping, sans-I/O: ids kept apart, sessions routed to their owner."""

from __future__ import annotations

import json
from typing import Any

from router.host.multiplex import HANDSHAKE_ID, Action, Multiplexer, ToAgent, ToClient
from router.protocol.ids import SessionId
from router.protocol.jsonrpc import Response, parse


def frame(**members: Any) -> str:
    return json.dumps({"jsonrpc": "2.0", **members})


def ready_mux(agent_caps: dict[str, Any] | None = None) -> Multiplexer:
    mux = Multiplexer()
    caps = agent_caps if agent_caps is not None else {"loadSession": True}
    result = {"protocolVersion": 1, "agentCapabilities": caps}
    response = parse(frame(id=HANDSHAKE_ID, result=result))
    assert isinstance(response, Response)
    mux.agent_initialized(response)
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
            assert answer["result"] == {"status": expected}
