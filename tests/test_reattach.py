"""What ``connect`` replays after a reconnect, sans-I/O: the editor's state as the frames
pass, and the replay's steps."""

from __future__ import annotations

import json
from typing import Any

import pytest

from router.commands.reattach import EditorState, Reattach, ReplayRefused
from router.protocol.jsonrpc import Response
from router.protocol.reading import parse

CWD = "/w"


def frame(**members: Any) -> str:
    return json.dumps({"jsonrpc": "2.0", **members})


def exchange(editor: EditorState, request_id: Any, method: str, result: Any, **params: Any) -> None:
    """The editor asks, the router answers ``result`` (an error when it has ``code``)."""
    assert editor.sending(parse(frame(id=request_id, method=method, params=params)))
    outcome = (
        {"error": result} if isinstance(result, dict) and "code" in result else {"result": result}
    )
    editor.received(parse(frame(id=request_id, **outcome)))


def initialized() -> EditorState:
    editor = EditorState()
    exchange(editor, 0, "initialize", {"protocolVersion": 1}, protocolVersion=1)
    return editor


def answer(request: str, result: Any = None, error: Any = None) -> Response:
    request_id = json.loads(request)["id"]
    body = {"error": error} if error is not None else {"result": result or {}}
    response = parse(frame(id=request_id, **body))
    assert isinstance(response, Response)
    return response


def advertising(*, resume: bool, load: bool) -> dict[str, Any]:
    caps: dict[str, Any] = {"loadSession": load}
    if resume:
        caps["sessionCapabilities"] = {"resume": {}}
    return {"protocolVersion": 1, "agentCapabilities": caps}


@pytest.mark.parametrize(
    ("resume", "load", "expected"),
    [
        (True, True, ["session/resume", "session/load"]),
        (False, True, ["session/load", "session/load"]),
        (True, False, ["session/resume", "session/resume"]),
        (False, False, []),
    ],
)
def test_sessions_are_attached_again_as_the_editor_did_or_as_the_router_allows(
    resume: bool, load: bool, expected: list[str]
) -> None:
    editor = initialized()
    exchange(editor, 1, "session/new", {"sessionId": "s1"}, cwd=CWD, mcpServers=[])
    exchange(editor, 2, "session/load", {}, sessionId="s2", cwd=CWD, mcpServers=[])
    replay = Reattach(editor)
    (init,) = replay.start()
    steps = replay.answered(answer(init, advertising(resume=resume, load=load)))
    assert [json.loads(step)["method"] for step in steps] == expected
    if not expected:
        assert replay.done
        assert [session for session, _ in replay.dropped] == ["s1", "s2"]
        assert editor.sessions == {}


def test_a_session_the_router_will_not_attach_again_is_forgotten() -> None:
    editor = initialized()
    exchange(editor, 1, "session/resume", {}, sessionId="s1", cwd=CWD)
    exchange(editor, 2, "session/resume", {}, sessionId="s2", cwd=CWD)
    replay = Reattach(editor)
    (init,) = replay.start()
    first, second = replay.answered(answer(init, advertising(resume=True, load=False)))
    refused = answer(first, error={"code": -32002, "message": "gone"})
    assert (replay.answered(refused), replay.done) == ([], False)
    assert (replay.answered(answer(second)), replay.done) == ([], True)
    assert list(editor.sessions) == ["s2"]
    assert replay.dropped == [("s1", "-32002 gone")]


def test_a_refused_handshake_is_final() -> None:
    editor = initialized()
    exchange(editor, "a", "authenticate", {}, methodId="m")
    replay = Reattach(editor)
    (init,) = replay.start()
    (auth,) = replay.answered(answer(init, advertising(resume=True, load=True)))
    assert json.loads(auth)["params"] == {"methodId": "m"}
    with pytest.raises(ReplayRefused, match="authenticate: -32000 no"):
        replay.answered(answer(auth, error={"code": -32000, "message": "no"}))


def test_only_what_was_accepted_is_replayed_and_closed_sessions_are_not() -> None:
    editor = EditorState()
    assert Reattach(editor).start() == []  # never initialized: nothing to replay
    exchange(editor, 0, "initialize", {"code": -32603, "message": "no"}, protocolVersion=1)
    assert editor.initialize is None
    exchange(editor, 1, "initialize", {}, protocolVersion=1)
    exchange(editor, 2, "authenticate", {"code": -32000, "message": "no"}, methodId="m")
    assert editor.authenticate is None
    exchange(editor, 3, "session/new", {"sessionId": "s1"}, cwd=CWD)
    exchange(editor, 4, "session/new", {"sessionId": "s2"}, cwd=CWD)
    exchange(editor, 5, "session/close", {}, sessionId="s1")
    exchange(editor, 6, "session/close", {"code": -32002, "message": "unknown"}, sessionId="s2")
    assert editor.sessions == {}


def test_answers_owed_are_given_once_and_late_answers_dropped() -> None:
    editor = EditorState()
    assert editor.sending(parse(frame(id=1, method="session/prompt", params={})))
    editor.received(parse(frame(id=40, method="session/request_permission", params={})))
    owed_before = editor.owes
    unsent = [parse(frame(id=2, method="x")), parse(frame(method="session/cancel"))]
    lost = [json.loads(text) for text in editor.lost("the router connection was lost", unsent)]
    assert [m["id"] for m in lost] == [1, 2]
    assert lost[0]["error"]["data"] == {
        "reason": "the router connection was lost",
        "retryable": True,
    }
    assert (owed_before, editor.owes) == (True, False)
    assert editor.lost("again") == []
    # the question of the old connection: its answer is not sent
    assert not editor.sending(parse(frame(id=40, result={})))
    editor.received(parse(frame(id=41, method="session/request_permission", params={})))
    assert editor.sending(parse(frame(id=41, result={})))
    assert not editor.sending(parse(frame(id=41, result={})))  # answered once


def test_a_replayed_load_mutes_its_history_until_its_answer() -> None:
    editor = initialized()
    exchange(editor, 1, "session/load", {}, sessionId="s1", cwd=CWD, mcpServers=[])
    replay = Reattach(editor)
    (init,) = replay.start()
    (load,) = replay.answered(answer(init, advertising(resume=True, load=True)))
    history = parse(frame(method="session/update", params={"sessionId": "s1", "update": {}}))
    other = parse(frame(method="session/update", params={"sessionId": "s2", "update": {}}))
    assert replay.mutes(history)
    assert not replay.mutes(other)
    replay.answered(answer(load))
    assert not replay.mutes(history)
    assert replay.done
