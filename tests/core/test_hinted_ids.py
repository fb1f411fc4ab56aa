"""Session ids that say where their session lives (``router.hinted_ids``): the id itself,
read and spliced, and a connection's table of them (tests/e2e/test_hinted_ids.py: on
real agents)."""

from __future__ import annotations

import json

import orjson
import pytest
from hypothesis import given, strategies as st

from router.core.effects import refusal
from router.core.hinted_ids import HintedSessions, hinted, read
from router.protocol.errors import SessionNotFound
from router.protocol.ids import BackendId
from router.protocol.jsonrpc import Request, encode_error
from router.protocol.reading import parse
from tests.core.support import forged


@given(st.text(min_size=1, max_size=60), st.text(min_size=1, max_size=40))
def test_any_agent_id_and_backend_id_survive_the_hint(session_id: str, backend: str) -> None:
    assert read(hinted(session_id, backend)) == (session_id, backend)


@pytest.mark.parametrize(
    "client_id",
    [
        "sess_1",
        "sess@1",
        "user@example.org",  # an agent's own id with an "@" and a "." is not a hinted one
        "sess_1@YWdlbnQtMQ.AAAAAA",  # a forged check
        "@YWdlbnQtMQ." + hinted("x", "agent-1").rsplit(".", 1)[1],
        "",
    ],
)
def test_other_ids_are_not_hinted(client_id: str) -> None:
    assert read(client_id) is None


@pytest.mark.parametrize("home", ["\u00e9", "\ud83d", "YQ\u0661", "\x00"])
def test_a_home_that_is_not_base64url_is_no_home(home: str) -> None:
    assert read(forged("sess_x", home)) is None


def test_ids_with_the_separators_in_them_are_read_from_the_right() -> None:
    client_id = hinted("a@b.c@d", "127.0.0.4")
    assert read(client_id) == ("a@b.c@d", "127.0.0.4")


def test_ids_holding_lone_surrogates_are_read_not_raised() -> None:
    assert read("a\ud83d@YQ.abcdef") is None  # shaped like a hinted id: a forged check
    assert read(hinted("cut\ud83d", "agent-1")) == ("cut\ud83d", "agent-1")


def test_a_reply_naming_a_session_with_a_lone_surrogate_is_spliced() -> None:
    sessions = HintedSessions(limit=8)
    created = parse('{"jsonrpc":"2.0","id":1,"result":{"sessionId":"s\\ud83d"}}')
    sessions.learn(created, BackendId("agent-2"))
    client_id = hinted("s\ud83d", "agent-2")
    error = refusal(3, SessionNotFound("s\ud83d"))
    assert (
        json.loads(sessions.reply(error.text, error.session_id))["error"]["data"]["sessionId"]
        == client_id
    )
    other = refusal(4, SessionNotFound("other"))
    assert sessions.reply(other.text, other.session_id) == encode_error(4, SessionNotFound("other"))


def _frame(obj: dict[str, object]) -> str:
    return orjson.dumps(obj).decode()


def test_a_connection_opens_hinted_ids_and_gives_them_back_out() -> None:
    sessions = HintedSessions(limit=8)
    created = parse(_frame({"jsonrpc": "2.0", "id": 1, "result": {"sessionId": "s1"}}))
    sessions.learn(created, BackendId("agent-2"))
    shown = sessions.outbound(created)
    client_id = orjson.loads(shown.text)["result"]["sessionId"]
    assert read(client_id) == ("s1", "agent-2")
    assert shown.member("result", "sessionId") == "s1"  # the core keeps the agent's id
    prompt = parse(_frame({"jsonrpc": "2.0", "id": 2, "method": "session/prompt",
                           "params": {"sessionId": client_id, "prompt": []}}))  # fmt: skip
    opened, home = sessions.inbound(prompt)
    assert isinstance(opened, Request)
    assert (opened.param("sessionId"), home) == ("s1", "agent-2")
    assert orjson.loads(opened.text)["params"]["sessionId"] == "s1"
    update = parse(_frame({"jsonrpc": "2.0", "method": "session/update",
                           "params": {"sessionId": "s1", "update": {}}}))  # fmt: skip
    assert orjson.loads(sessions.outbound(update).text)["params"]["sessionId"] == client_id
    # the id stays the client's wherever the session moves: a frame from another backend
    sessions.learn(update, BackendId("agent-3"))
    assert orjson.loads(sessions.outbound(update).text)["params"]["sessionId"] == client_id
    error = (
        '{"jsonrpc":"2.0","id":3,"error":{"code":-32010,"message":"x","data":{"sessionId":"s1"}}}'
    )
    assert orjson.loads(sessions.reply(error, "s1"))["error"]["data"]["sessionId"] == client_id
    # an agent's own id (a session made directly on it) passes as it is
    raw = parse(
        _frame({"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": "s9"}})
    )
    assert sessions.inbound(raw) == (raw, None)


def test_the_table_is_bounded() -> None:
    sessions = HintedSessions(limit=2)
    for n in range(5):
        result = parse(_frame({"jsonrpc": "2.0", "id": n, "result": {"sessionId": f"s{n}"}}))
        sessions.learn(result, BackendId("a"))
    assert len(sessions._known) == 2
