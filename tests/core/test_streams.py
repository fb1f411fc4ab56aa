"""Streamable HTTP's event streams, sans-I/O (:mod:`router.core.streams`): where each
frame to the client goes, what waits for a stream the client has not opened, and the
checks on a POST."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given, strategies as st

from router.core.quotas import ByteBudget
from router.core.streams import (
    Delivery,
    EventStreams,
    Held,
    Opened,
    Overflow,
    Rejected,
    StreamKey,
    Write,
)
from router.protocol.ids import SessionId
from router.protocol.jsonrpc import Message
from router.protocol.reading import parse

S1, S2 = SessionId("s1"), SessionId("s2")


def message(**fields: Any) -> Message:
    return parse(orjson.dumps({"jsonrpc": "2.0", **fields}).decode())


def request(request_id: int, method: str, session: str | None = None) -> Message:
    params = {} if session is None else {"sessionId": session}
    return message(id=request_id, method=method, params=params)


def answer(request_id: int, result: Any = None) -> Message:
    return message(id=request_id, result={} if result is None else result)


def update(session: str) -> Message:
    return message(method="session/update", params={"sessionId": session, "update": {}})


def streams(budget: ByteBudget | None = None, **bounds: int) -> EventStreams:
    defaults = {"max_held": 8, "max_held_chars": 1000, "max_sessions": 8, "max_awaited": 8}
    return EventStreams(**{**defaults, **bounds}, budget=budget)


def send(table: EventStreams, frame: Message) -> Delivery:
    return table.deliver(frame.text, frame)


def open_stream(table: EventStreams, key: StreamKey) -> tuple[int, list[str]]:
    """A GET on ``key``: its reader number and the held frames it writes first."""
    attached = table.attach(key)
    assert isinstance(attached, Opened)
    taken = []
    while (text := table.take(key, attached.reader)) is not None:
        taken.append(text)
    return attached.reader, taken


def created(table: EventStreams, session: str) -> Delivery:
    """session/new on the connection: its answer names ``session``; where it went."""
    assert table.post(request(90, "session/new"), None) is None
    return send(table, answer(90, {"sessionId": session}))


def test_answers_go_where_the_client_looks_for_them() -> None:
    table = streams()
    connection, _ = open_stream(table, None)
    assert created(table, S1) == Write(None, connection)
    session, _ = open_stream(table, S1)
    # a session-scoped POST: its answer on the session's stream
    assert table.post(request(1, "session/prompt", S1), S1) is None
    assert send(table, update(S1)) == Write(S1, session)
    assert send(table, answer(1, {"stopReason": "end_turn"})) == Write(S1, session)
    # the same request without the header (not one that needs it): the connection stream
    assert table.post(request(2, "_vendor/poke", S1), None) is None
    assert send(table, answer(2)) == Write(None, connection)
    # load, resume, new and fork are answered on the connection stream, header or not
    for n, method in enumerate(("session/load", "session/resume", "session/fork"), start=3):
        assert table.post(request(n, method, S1), S1) is None
        assert send(table, answer(n)) == Write(None, connection)
    # an agent's request for a session the connection does not know
    assert send(table, update("elsewhere")) == Write(None, connection)
    assert table.open_streams == 2


def test_a_new_sessions_frames_wait_for_its_stream_in_order() -> None:
    table = streams()
    open_stream(table, None)
    assert table.post(request(1, "session/new"), None) is None
    first, second = update(S1), update(S1)
    assert send(table, first) == Write(None, 1)  # the session is not known yet
    assert send(table, answer(1, {"sessionId": S1})) == Write(None, 1)
    assert send(table, second) == Held(S1)
    assert table.post(request(2, "session/prompt", S1), S1) is None
    assert send(table, answer(2)) == Held(S1)
    reader, taken = open_stream(table, S1)
    assert taken == [second.text, answer(2).text]
    assert send(table, update(S1)) == Write(S1, reader)
    # its GET ends: frames wait for the next one
    assert table.release(S1, reader)
    assert not table.release(S1, reader)
    assert send(table, update(S1)) == Held(S1)
    again, taken = open_stream(table, S1)
    assert taken == [update(S1).text]
    assert again != reader


def test_a_session_attached_before_its_stream_opens_uses_the_connection_stream() -> None:
    """The Python SDK's client loads, then opens the session's stream when a frame
    naming the session arrives (on the connection stream: it has no other yet)."""
    table = streams()
    connection, _ = open_stream(table, None)
    assert table.post(request(1, "session/load", S1), None) is None
    assert send(table, update(S1)) == Write(None, connection)  # the replay
    assert send(table, answer(1)) == Write(None, connection)
    assert table.post(request(2, "session/prompt", S1), S1) is None  # known: no 404
    assert send(table, update(S1)) == Write(None, connection)
    session, taken = open_stream(table, S1)
    assert taken == []
    assert send(table, answer(2)) == Write(S1, session)


def test_the_rfd_client_opens_the_session_stream_before_it_loads() -> None:
    table = streams()
    connection, _ = open_stream(table, None)
    session, _ = open_stream(table, S1)  # not known yet: a GET makes it known
    assert table.post(request(1, "session/load", S1), S1) is None
    assert send(table, update(S1)) == Write(S1, session)  # the replay, on its stream
    assert send(table, answer(1)) == Write(None, connection)


@pytest.mark.parametrize(
    ("frame", "header", "status"),
    [
        (request(1, "session/prompt", S1), None, 400),  # the header is required
        (message(method="session/cancel", params={"sessionId": S1}), None, 400),
        (request(1, "session/set_mode", S2), S2, 404),  # a session this connection lacks
        (request(1, "session/prompt", S2), S1, 400),  # header and params disagree
        (request(1, "session/load", S2), S1, 400),
    ],
)
def test_a_post_is_checked_against_its_session_header(
    frame: Message, header: str | None, status: int
) -> None:
    table = streams()
    created(table, S1)
    rejected = table.post(frame, header)
    assert isinstance(rejected, Rejected)
    assert rejected.status == status


def test_posts_that_need_no_session_pass() -> None:
    table = streams()
    created(table, S1)
    assert table.post(None, None) is None  # not JSON-RPC: the routing core answers it
    assert table.post(answer(7), None) is None  # the client answering an agent request
    assert table.post(request(1, "session/list"), None) is None
    assert table.post(message(method="session/cancel", params={"sessionId": S1}), S1) is None
    assert table.post(request(2, "session/prompt", S1), S1) is None


def test_a_stream_that_is_never_opened_overflows() -> None:
    table = streams(max_held=2)
    assert send(table, update("x")) == Held(None)
    assert send(table, update("x")) == Held(None)
    assert send(table, update("x")) == Overflow(None)


def test_the_characters_held_over_a_connection_are_bounded_too() -> None:
    frame = update("x")
    table = streams(max_held=100, max_held_chars=2 * len(frame.text))
    assert send(table, frame) == Held(None)
    assert send(table, frame) == Held(None)
    assert send(table, frame) == Overflow(None)  # a third would pass the characters' bound
    attached = table.attach(None)
    assert isinstance(attached, Opened)
    assert table.take(None, attached.reader) == frame.text  # taking one makes room for one
    assert table.held_chars == len(frame.text)
    assert send(table, frame) == Held(None)


def test_the_bytes_held_over_every_connection_are_bounded_too() -> None:
    frame = update("x")
    budget = ByteBudget(2 * len(frame.text))
    first, second = (
        EventStreams(
            max_held=100, max_held_chars=1000, max_sessions=8, max_awaited=8, budget=budget
        )
        for _ in range(2)
    )
    assert send(first, frame) == Held(None)
    assert send(second, frame) == Held(None)
    # each holds far less than its own bound: together they hold all they may
    assert send(first, frame) == Overflow(None, shared=True)
    _, taken = open_stream(second, None)
    assert taken == [frame.text]  # a frame written gives its bytes back
    assert budget.held == len(frame.text)
    assert send(first, frame) == Held(None)
    first.drop()  # its connection ended: what it held goes back
    assert (budget.held, first.held_chars) == (0, 0)


def test_a_second_get_displaces_the_first() -> None:
    table = streams()
    first, _ = open_stream(table, None)
    attached = table.attach(None)
    assert isinstance(attached, Opened)
    assert attached.displaced == first
    assert send(table, update("x")) == Held(None)  # the new GET has not taken the held ones yet
    assert table.take(None, first) is None  # the displaced GET gets nothing more
    assert table.take(None, attached.reader) == update("x").text
    assert table.take(None, attached.reader) is None
    assert send(table, update("x")) == Write(None, attached.reader)
    assert not table.release(None, first)
    assert table.open_streams == 1
    assert table.release(None, attached.reader)
    assert table.open_streams == 0


def test_known_sessions_are_bounded() -> None:
    table = streams(max_sessions=2)
    created(table, S1)
    open_stream(table, S1)
    created(table, S2)  # frames held for it: neither can make room
    assert send(table, update(S2)) == Held(S2)
    assert table.attach(SessionId("s3")) == Rejected(
        429, "too many session streams on this connection"
    )
    assert send(table, update("s3")) == Held(None)  # not known: the connection stream
    # S2's frames are taken: it can make room now, and S1 (open) still cannot
    open_stream(table, S2)
    reader = table.attach(S2)
    assert isinstance(reader, Opened)
    assert table.release(S2, reader.reader)
    assert isinstance(table.attach(SessionId("s3")), Opened)
    assert table.post(request(1, "session/prompt", S2), S2) == Rejected(
        404, "no such session on this connection"
    )
    assert table.post(request(1, "session/prompt", S1), S1) is None


def test_answers_awaited_are_bounded() -> None:
    table = streams(max_awaited=1)
    connection, _ = open_stream(table, None)
    created(table, S1)
    session, _ = open_stream(table, S1)
    assert table.post(request(1, "session/prompt", S1), S1) is None
    assert table.post(request(2, "session/prompt", S1), S1) is None  # past the bound
    assert send(table, answer(2)) == Write(None, connection)
    assert send(table, answer(1)) == Write(S1, session)


@given(st.lists(st.sampled_from(["frame", "open", "close"]), max_size=60))
def test_a_streams_frames_arrive_once_and_in_order(steps: list[str]) -> None:
    """Any interleaving of frames and GETs opening and closing: every frame reaches the
    client once, in order (written at once, or taken by the next GET)."""
    table = streams(max_held=1000, max_held_chars=10**9)
    sent: list[str] = []
    received: list[str] = []
    reader: int | None = None
    for n, step in enumerate(steps):
        if step == "frame":
            frame = update(f"unknown-{n}")
            sent.append(frame.text)
            delivery = send(table, frame)
            if isinstance(delivery, Write):
                assert delivery.reader == reader
                received.append(frame.text)
            else:
                assert delivery == Held(None)
        elif step == "open":
            reader, taken = open_stream(table, None)
            received.extend(taken)
        elif reader is not None:
            assert table.release(None, reader)
            reader = None
    _, taken = open_stream(table, None)
    assert received + taken == sent
