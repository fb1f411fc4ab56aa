"""router.core.gate: what a connection's frames become past the front door, sealed ids
and hinted ids together, and what a frame refused at the gate is answered."""

from __future__ import annotations

import orjson

from router.core.frontdoor import principal_of
from router.core.gate import Gate, Refusal
from router.core.hinted_ids import HintedSessions, hinted
from router.core.ownership import Ownership, SessionSeal
from router.core.quotas import Budget, Client, LocateQuota, SessionQuota
from router.protocol.ids import BackendId
from router.protocol.jsonrpc import Request, Response
from router.protocol.reading import parse

SEAL = SessionSeal(b"a shared secret of 32 bytes ....")
ALICE = principal_of("alice-token")
AGENT = BackendId("agent-1")


def _gate(*, sealed: bool, hinted_ids: bool) -> Gate:
    ownership = Ownership(SEAL, ALICE) if sealed else None
    locates = LocateQuota(60, 60, max_clients=8, per_principal=60)
    budget = Budget(
        SessionQuota(60, 60, max_addresses=8), locates, "::1", Client.of(ALICE, "::1"), 0.0
    )
    return Gate(budget, ownership, HintedSessions(8) if hinted_ids else None)


def _new_session_answer(session_id: str) -> Response:
    answer = parse(orjson.dumps({"jsonrpc": "2.0", "id": 1, "result": {"sessionId": session_id}}))
    assert isinstance(answer, Response)
    return answer


def test_an_id_the_agent_made_is_hinted_then_sealed_and_comes_back_as_the_agents() -> None:
    gate = _gate(sealed=True, hinted_ids=True)
    out = gate.outbound(_new_session_answer("sess_1"), AGENT)
    assert isinstance(out, Response)
    assert out.result["sessionId"] == "sess_1"  # the core reads the agent's id
    client_id = orjson.loads(out.text)["result"]["sessionId"]  # the client sees this one
    opened = SEAL.open(ALICE, client_id)
    assert opened == hinted("sess_1", AGENT)  # the seal wraps the hinted id
    prompt = {"jsonrpc": "2.0", "id": 2, "method": "session/prompt"}
    passed = gate.inbound(parse(orjson.dumps({**prompt, "params": {"sessionId": client_id}})))
    assert not isinstance(passed, Refusal)
    message, claimed = passed
    assert isinstance(message, Request)
    assert message.param("sessionId") == "sess_1"
    assert claimed == AGENT


def test_a_request_refused_at_the_gate_gets_its_answer_and_a_notification_none() -> None:
    gate = _gate(sealed=True, hinted_ids=False)
    forged = {"jsonrpc": "2.0", "id": 7, "method": "session/prompt"}
    refused = gate.inbound(parse(orjson.dumps({**forged, "params": {"sessionId": "sess_1"}})))
    assert isinstance(refused, Refusal)
    assert refused.answers == 7
    assert refused.text is not None
    answer = orjson.loads(refused.text)
    assert answer["id"] == 7
    assert answer["error"]["code"] == refused.code == -32002
    cancel = {"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": "sess_1"}}
    dropped = gate.inbound(parse(orjson.dumps(cancel)))
    assert isinstance(dropped, Refusal)
    assert dropped.text is None
    assert dropped.answers is None


def test_without_a_seal_or_hints_frames_pass_as_they_are() -> None:
    gate = _gate(sealed=False, hinted_ids=False)
    text = '{"jsonrpc":"2.0","id":3,"method":"session/prompt","params":{"sessionId":"s"}}'
    passed = gate.inbound(parse(text))
    assert not isinstance(passed, Refusal)
    assert passed[0].text == text
    assert passed[1] is None
    answer = _new_session_answer("s")
    assert gate.outbound(answer, AGENT) is answer
