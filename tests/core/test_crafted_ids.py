"""Every id a client sends is read total: any text, of any length, gets an answer (an id
that is not one, a JSON-RPC error, a 4xx), never an exception.

The readers: a tagged ``Acp-Connection-Id`` (workers), a hinted session id, a sealed
one, ``Acp-Session-Id`` on a POST or a GET, and ``params.sessionId`` through the gate and
the routing core. Hypothesis feeds each arbitrary Unicode (lone surrogates included)
and lengths up to past the 4,300 digits ``int()`` refuses.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import assume, example, given, settings, strategies as st

from router.core.frontdoor import principal_of
from router.core.hinted_ids import HintedSessions, _check, hinted, read
from router.core.ownership import Ownership, SessionSeal
from router.core.routes import ClientRoutes, Limits
from router.core.streams import EventStreams, Opened, Rejected
from router.protocol import acp
from router.protocol.errors import InvalidRequest, SessionNotFound
from router.protocol.ids import BackendId
from router.protocol.jsonrpc import Request
from router.protocol.reading import parse
from router.server.workers import worker_of

#: any text: every code point, lone surrogates too (JSON's \ud800 escapes make them)
ANY_TEXT = st.text(st.characters(exclude_categories=()), max_size=80)
#: and long ones, made of the characters the readers split on
LONG_TEXT = st.builds(
    lambda unit, times, tail: unit * times + tail,
    st.sampled_from(["9", "0", "@", ".", "é", "\ud83d", "A"]),
    st.integers(0, 6000),
    ANY_TEXT,
)
#: shaped like a hinted id: any agent id and home, with the check they need (no secret
#: is needed for one)
HINTED_SHAPE = st.builds(lambda s, h: f"{s}@{h}.{_check(s, h)}", ANY_TEXT, ANY_TEXT)
#: shaped like a sealed id: any text, a dot, as many characters as a MAC has
SEALED_SHAPE = st.builds(
    lambda s, m: f"{s}.{m}",
    ANY_TEXT,
    st.text(st.characters(exclude_categories=()), min_size=22, max_size=22),
)
IDS = ANY_TEXT | LONG_TEXT | HINTED_SHAPE | SEALED_SHAPE
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


@given(IDS, st.integers(1, 256))
def test_a_connection_id_names_a_worker_or_nothing(tagged: str, count: int) -> None:
    tag = worker_of(tagged, count)
    if tag is not None:
        index, bare = tag
        assert 0 <= index < count
        assert tagged == f"{index}.{bare}"


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


def test_a_connection_id_with_leading_zeros_names_no_worker() -> None:
    """Found by the property above: ``00.x`` reached worker 0 as ``x``, an alias of ``0.x``."""
    assert worker_of("0.x", 10) == (0, "x")
    assert worker_of("00.x", 10) is None
    assert worker_of("07.x", 10) is None
