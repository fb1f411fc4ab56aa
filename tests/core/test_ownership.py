"""Session ownership, sans-I/O: sealed session ids, and the frames crossing the seal."""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest
from hypothesis import given, strategies as st

from router.core.effects import Reply, refusal
from router.core.frontdoor import principal_of
from router.core.ownership import Ownership, SessionSeal
from router.protocol.errors import MethodNotFound, SessionNotAttached, SessionNotFound
from router.protocol.jsonrpc import Notification, Request, Response, encode_error
from router.protocol.reading import parse

SEAL = SessionSeal(b"a shared secret of 32 bytes ....")
ALICE, BOB = principal_of("alice-token"), principal_of("bob-token")
AS_ALICE, AS_BOB = Ownership(SEAL, ALICE), Ownership(SEAL, BOB)


def test_a_sealed_id_opens_only_for_its_principal_and_secret() -> None:
    sealed = SEAL.seal(ALICE, "sess_1")
    assert sealed.startswith("sess_1.")
    assert SEAL.open(ALICE, sealed) == "sess_1"
    assert SEAL.open(BOB, sealed) is None
    assert SessionSeal(b"another secret, 32 bytes long...").open(ALICE, sealed) is None
    assert SEAL.open(ALICE, "sess_1") is None  # the agent's own id is no key
    assert SEAL.open(ALICE, sealed[:-1] + ("A" if sealed[-1] != "A" else "B")) is None
    assert SEAL.open(ALICE, SEAL.seal(ALICE, "sess_2").replace("sess_2", "sess_1")) is None


@given(st.text(min_size=1, max_size=80))
def test_any_agent_id_survives_the_seal(session_id: str) -> None:
    assert SEAL.open(ALICE, SEAL.seal(ALICE, session_id)) == session_id
    assert SEAL.open(BOB, SEAL.seal(ALICE, session_id)) is None


def test_inbound_opens_the_session_id_in_text_and_params() -> None:
    sealed = SEAL.seal(ALICE, "sess_1")
    text = (
        '{"jsonrpc":"2.0", "id":3, "method":"session/prompt",'
        f' "params":{{ "sessionId" : "{sealed}", "prompt":[{{"type":"text","text":"sessionId"}}],'
        ' "_meta":{"x":1.50}}}'
    )
    message = AS_ALICE.inbound(parse(text))
    assert isinstance(message, Request)
    assert message.param("sessionId") == "sess_1"
    assert message.text == text.replace(sealed, "sess_1")  # nothing else moved


@pytest.mark.parametrize(
    "sealed",
    [SEAL.seal(ALICE, "sess_1"), "sess_1", "sess_1.", "sess_1." + "A" * 22, "", "."],
)
def test_an_id_that_does_not_open_is_an_unknown_session(sealed: str) -> None:
    request = parse(orjson.dumps(_prompt(1, sealed)).decode())
    with pytest.raises(SessionNotFound) as caught:
        AS_BOB.inbound(request)
    assert caught.value.to_error() == {
        "code": -32002,
        "message": "Resource not found",
        "data": {"sessionId": sealed},
    }


def test_inbound_covers_every_method_and_notifications() -> None:
    sealed = SEAL.seal(ALICE, "sess_1")
    for method in ("session/cancel", "_vendor/anything", "session/set_mode"):
        frame = orjson.dumps({"jsonrpc": "2.0", "method": method, "params": {"sessionId": sealed}})
        with pytest.raises(SessionNotFound):
            AS_BOB.inbound(parse(frame.decode()))
        opened = AS_ALICE.inbound(parse(frame.decode()))
        assert isinstance(opened, Notification)
        assert orjson.loads(opened.text)["params"]["sessionId"] == "sess_1"


def test_a_repeated_key_cannot_smuggle_another_id_past_the_seal() -> None:
    mine = SEAL.seal(BOB, "sess_bob")
    text = (
        '{"jsonrpc":"2.0","id":1,"method":"session/prompt",'
        f'"params":{{"sessionId":"sess_alice","sessionId":"{mine}"}}}}'
    )
    opened = AS_BOB.inbound(parse(text))
    assert "sess_alice" not in opened.text  # every copy of the key carries the opened id
    assert opened.text.count('"sess_bob"') == 2


def test_messages_without_a_session_id_pass_untouched() -> None:
    for text in (
        '{"jsonrpc":"2.0","id":1,"method":"session/new","params":{"cwd":"/"}}',
        '{"jsonrpc":"2.0","id":1,"method":"initialize"}',
        '{"jsonrpc":"2.0","id":1,"result":{"outcome":"selected"}}',
        '{"jsonrpc":"2.0","id":1,"method":"session/prompt","params":{"sessionId":7}}',
    ):
        message = parse(text)
        assert AS_ALICE.inbound(message) is message


def test_session_list_is_not_offered() -> None:
    with pytest.raises(MethodNotFound):
        AS_ALICE.inbound(parse('{"jsonrpc":"2.0","id":1,"method":"session/list","params":{}}'))
    capabilities: dict[str, Any] = {
        "agentCapabilities": {
            "loadSession": True,
            "sessionCapabilities": {"list": {}, "status": {}, "resume": {}},
        }
    }
    offered = AS_ALICE.capabilities(capabilities)
    assert offered["agentCapabilities"]["sessionCapabilities"] == {"status": {}, "resume": {}}
    assert offered["agentCapabilities"]["loadSession"] is True
    assert capabilities["agentCapabilities"]["sessionCapabilities"]["list"] == {}  # not mutated


def test_outbound_seals_every_session_id_the_client_sees() -> None:
    sealed = SEAL.seal(ALICE, "sess_1")
    update = parse(
        '{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"sess_1",'
        '"update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"hi"}}}}'
    )
    sealed_update = AS_ALICE.outbound(update)
    assert sealed_update.text == update.text.replace('"sess_1"', f'"{sealed}"')
    assert isinstance(sealed_update, Notification)
    assert sealed_update.param("sessionId") == "sess_1"  # the core still sees the agent's id
    created = AS_ALICE.outbound(parse('{"jsonrpc":"2.0","id":2,"result":{"sessionId":"sess_1"}}'))
    assert isinstance(created, Response)
    assert orjson.loads(created.text)["result"]["sessionId"] == sealed
    assert created.result == {"sessionId": "sess_1"}
    unknown = AS_ALICE.outbound(parse(encode_error(3, SessionNotFound("sess_1"))))
    assert orjson.loads(unknown.text)["error"]["data"]["sessionId"] == sealed
    asks = AS_ALICE.outbound(
        parse(
            '{"jsonrpc":"2.0","id":9,"method":"fs/read_text_file","params":{"sessionId":"sess_1"}}'
        )
    )
    assert orjson.loads(asks.text)["params"]["sessionId"] == sealed
    plain = parse('{"jsonrpc":"2.0","id":4,"result":{"stopReason":"end_turn"}}')
    assert AS_ALICE.outbound(plain) is plain


def _said(reply: Reply) -> tuple[str, str | None]:
    """A reply the router made, and the session id its error names (which the core
    reads off the error it made, never off the text)."""
    return reply.text, reply.session_id


def test_the_routers_own_replies_are_sealed() -> None:
    sealed = SEAL.seal(ALICE, "sess_1")
    reply = AS_ALICE.reply(*_said(refusal(5, SessionNotAttached("sess_1"))))
    error = orjson.loads(reply)["error"]
    assert error["code"] == -32010
    assert error["data"] == {"sessionId": sealed, "retryable": False}
    plain = '{"jsonrpc":"2.0","id":5,"result":{"status":"active"}}'
    assert AS_ALICE.reply(plain, None) == plain
    # a session id with a lone surrogate (an agent cut one mid-emoji) is sealed too
    cut = json.loads(AS_ALICE.reply(*_said(refusal(6, SessionNotAttached("sess_\ud83d")))))
    assert cut["error"]["data"]["sessionId"] == AS_ALICE.seal.seal(
        AS_ALICE.principal, "sess_\ud83d"
    )


def _prompt(request_id: int, session_id: str) -> dict[str, object]:
    return {
        "jsonrpc": "2.0",
        "id": request_id,
        "method": "session/prompt",
        "params": {"sessionId": session_id, "prompt": []},
    }


def test_a_made_up_id_with_a_lone_surrogate_is_refused_as_not_found() -> None:
    prompt = parse(json.dumps(_prompt(7, "sess_\ud83d.AAAAAAAAAAAAAAAAAAAAAA")))
    with pytest.raises(SessionNotFound):
        AS_ALICE.inbound(prompt)
