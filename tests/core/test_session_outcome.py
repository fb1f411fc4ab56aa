"""What an answered request did to a session (router.protocol.acp.session_outcome), as
the host and the editor's bridge both read it."""

from __future__ import annotations

import json

import pytest

from router.protocol.acp import SessionOutcome, session_outcome
from router.protocol.jsonrpc import Request, Response
from router.protocol.reading import parse

HELD, RELEASED = SessionOutcome.HELD, SessionOutcome.RELEASED


def _request(method: str, session_id: str | None = None) -> Request:
    params = {} if session_id is None else {"sessionId": session_id}
    message = parse(json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}))
    assert isinstance(message, Request)
    return message


def _response(result: object = None, code: int | None = None) -> Response:
    body: dict[str, object] = {"jsonrpc": "2.0", "id": 1}
    if code is None:
        body["result"] = result
    else:
        body["error"] = {"code": code, "message": "x"}
    message = parse(json.dumps(body))
    assert isinstance(message, Response)
    return message


@pytest.mark.parametrize(
    ("method", "session_id", "response", "outcome"),
    [
        ("session/new", None, _response({"sessionId": "s1"}), (HELD, "s1")),
        ("session/fork", "s0", _response({"sessionId": "s2"}), (HELD, "s2")),
        ("session/new", None, _response({}), None),
        ("session/new", None, _response(code=-32603), None),
        ("session/load", "s1", _response({}), (HELD, "s1")),
        ("session/resume", "s1", _response(code=-32002), None),
        ("session/close", "s1", _response({}), (RELEASED, "s1")),
        ("session/delete", "s1", _response(code=-32002), (RELEASED, "s1")),  # gone already
        ("session/archive", "s1", _response(code=-32603), None),
        ("session/prompt", "s1", _response({"stopReason": "end_turn"}), None),
        ("session/close", None, _response({}), None),
    ],
)
def test_what_an_answer_did_to_a_session(
    method: str,
    session_id: str | None,
    response: Response,
    outcome: tuple[SessionOutcome, str] | None,
) -> None:
    assert session_outcome(_request(method, session_id), response) == outcome
