"""Every id a client sends is read total: any text, of any length, gets an answer (an id
that is not one, a JSON-RPC error, a 4xx), never an exception.

The readers: a hinted session id, a sealed one, ``Acp-Session-Id`` on a POST or a GET,
and ``params.sessionId`` through the gate and the routing core (a tagged
``Acp-Connection-Id``: tests/server/test_workers.py). Hypothesis feeds each arbitrary Unicode (lone surrogates included)
and lengths up to past the 4,300 digits ``int()`` refuses.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import assume, example, given, settings, strategies as st

from router.core.frontdoor import principal_of
from router.core.hinted_ids import HintedSessions, hinted, read
from router.core.ownership import Ownership, SessionSeal
from router.core.routes import ClientRoutes, Limits
from router.core.streams import EventStreams, Opened, Rejected
from router.protocol import acp
from router.protocol.errors import InvalidRequest, SessionNotFound
from router.protocol.ids import BackendId
from router.protocol.jsonrpc import Request
from router.protocol.reading import parse
from tests.core.support import IDS

SEAL = SessionSeal(b"k" * 32)
ALICE = principal_of("alice")
SESSION_METHODS = sorted(
    {acp.SESSION_PROMPT, acp.SESSION_CANCEL, acp.SESSION_CLOSE, *acp.ATTACHING, "session/status"}
)


def _with_session(method: str, session_id: str, request_id: int = 1) -> Request:
    text = json.dumps(
        {"jsonrpc": "2.0", "id": request_id, "method": method, "params": {"sessionId": session_id}}
    )
    try:
        message = parse(text)
    except InvalidRequest as exc:
        # the one shape the router refuses to read on purpose (lone surrogate escapes
        # beside escapes of U+E800..U+EFFF): a clean -32600 answer, with the id
        refused: InvalidRequest | None = exc
        message = None
    else:
        refused = None
    if refused is not None:
        assert refused.request_id == request_id
        assume(False)
    assert isinstance(message, Request)
    return message


@given(IDS)
def test_a_hinted_id_opens_or_is_no_hinted_id(client_id: str) -> None:
    opened = read(client_id)
    if opened is not None:
        session_id, home = opened
        assert read(hinted(session_id, home)) == opened


@given(IDS)
@example("sess_1." + "\ud800" * 22)  # a MAC that does not encode
def test_a_sealed_id_opens_or_is_none(sealed: str) -> None:
    opened = SEAL.open(ALICE, sealed)
    assert opened is None or SEAL.seal(ALICE, opened) == sealed


@settings(max_examples=200)
@given(IDS, st.sampled_from(SESSION_METHODS))
def test_a_session_id_through_the_connections_readers_is_answered(
    session_id: str, method: str
) -> None:
    message = _with_session(method, session_id)
    opened, _ = HintedSessions(8).inbound(message)
    with pytest.raises(SessionNotFound):  # not sealed for alice: an unknown session
        Ownership(SEAL, ALICE).inbound(opened)
    routes = ClientRoutes(Limits())
    routes.receive_client(_with_session(acp.INITIALIZE, ""))
    routes.answer(1, {"protocolVersion": 1})
    routes.receive_client(_with_session(method, session_id, request_id=2))  # an action


@given(st.one_of(st.none(), IDS), IDS)
def test_acp_session_id_headers_are_answered(header: str | None, session_id: str) -> None:
    streams = EventStreams(max_held=4, max_held_chars=1000, max_sessions=2, max_awaited=4)
    for method in SESSION_METHODS:
        rejected = streams.post(_with_session(method, session_id), header)
        assert rejected is None or 400 <= rejected.status < 500
    attached = streams.attach(header)  # type: ignore[arg-type]
    assert isinstance(attached, Opened | Rejected)
    created = json.dumps({"jsonrpc": "2.0", "id": 1, "result": {"sessionId": session_id}})
    streams.deliver(created, parse(created))
    HintedSessions(8).learn(parse(created), BackendId("agent-1"))
