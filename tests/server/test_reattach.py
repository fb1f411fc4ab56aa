"""What ``connect`` replays after a reconnect, sans-I/O: the editor's state as the frames
pass, and the replay's steps."""

from __future__ import annotations

import json
from typing import Any

import pytest

from router.commands.reattach import EditorState, Reattach, Reattachments, ReplayRefused, Steps
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


# -- a session the router let go of while the connection stayed up ---------------------------------

NOT_ATTACHED = {
    "code": -32010,
    "message": "Session is not attached to this connection: send session/resume first",
    "data": {"sessionId": "s1", "retryable": False},
}


def attached_editor(*, resume: bool = True, load: bool = True) -> EditorState:
    editor = EditorState()
    exchange(editor, 0, "initialize", advertising(resume=resume, load=load), protocolVersion=1)
    exchange(editor, 1, "session/new", {"sessionId": "s1"}, cwd=CWD, mcpServers=[])
    return editor


def sent(editor: EditorState, request_id: Any, method: str = "session/prompt") -> str:
    text = frame(id=request_id, method=method, params={"sessionId": "s1", "prompt": []})
    assert editor.sending(parse(text))
    return text


def refused(request_id: Any, error: dict[str, Any] = NOT_ATTACHED) -> Response:
    response = parse(frame(id=request_id, error=error))
    assert isinstance(response, Response)
    return response


def test_a_request_answered_not_attached_is_sent_again_once_the_session_is_back() -> None:
    editor = attached_editor()
    again = Reattachments(editor)
    prompt, second = sent(editor, 7), sent(editor, 8)
    steps = again.take(refused(7))
    assert steps is not None
    (resume,) = steps.to_router
    assert steps.to_editor == []
    assert json.loads(resume)["method"] == "session/resume"
    assert json.loads(resume)["params"] == {"sessionId": "s1", "cwd": CWD, "mcpServers": []}
    assert again.take(refused(8)) == Steps([], [])  # waits behind the same resume
    assert editor.owes  # both still owed to the editor
    assert again.take(answer(resume)) == Steps([prompt, second], [])
    # the answers to the requests sent again go to the editor as they come, even -32010
    assert again.take(refused(7)) is None
    editor.received(refused(7))
    assert again.take(parse(frame(id=8, result={}))) is None


def test_a_retryable_refusal_of_the_resume_answers_the_held_requests_and_keeps_the_session() -> (
    None
):
    editor = attached_editor()
    again = Reattachments(editor)
    sent(editor, 7)
    steps = again.take(refused(7))
    assert steps is not None
    inconclusive = {"code": -32012, "message": "retry later", "data": {"retryable": True}}
    after = again.take(answer(steps.to_router[0], error=inconclusive))
    assert after is not None
    assert [json.loads(text) for text in after.to_editor] == [
        {"jsonrpc": "2.0", "id": 7, "error": inconclusive}
    ]
    assert not editor.owes
    assert list(editor.sessions) == ["s1"]  # the next -32010 tries again
    sent(editor, 9)
    assert again.take(refused(9)) is not None


def test_a_final_refusal_gives_the_editor_its_own_answer_and_forgets_the_session() -> None:
    editor = attached_editor(resume=False, load=True)
    again = Reattachments(editor)
    sent(editor, 7)
    steps = again.take(refused(7))
    assert steps is not None
    (load,) = steps.to_router
    assert json.loads(load)["method"] == "session/load"
    history = parse(frame(method="session/update", params={"sessionId": "s1", "update": {}}))
    assert again.take(history) == Steps([], [])  # the history a load sends again
    gone = {"code": -32002, "message": "Resource not found", "data": {"sessionId": "s1"}}
    after = again.take(answer(load, error=gone))
    assert after is not None
    assert [json.loads(text)["error"] for text in after.to_editor] == [NOT_ATTACHED]
    assert editor.sessions == {}
    assert again.take(history) is None
    sent(editor, 9)
    assert again.take(refused(9)) is None  # not an attached session: passed on


def test_a_turn_cut_short_by_a_move_is_not_run_again() -> None:
    editor = attached_editor()
    again = Reattachments(editor)
    sent(editor, 7)
    moved = {**NOT_ATTACHED, "data": {"sessionId": "s1", "retryable": False, "turnStarted": True}}
    steps = again.take(refused(7, moved))
    assert steps is not None
    after = again.take(answer(steps.to_router[0]))
    assert after is not None
    assert after.to_router == []
    (lost,) = [json.loads(text) for text in after.to_editor]
    assert (lost["id"], lost["error"]["code"], lost["error"]["data"]["retryable"]) == (
        7,
        -32013,
        True,
    )
    assert not editor.owes


@pytest.mark.parametrize(
    ("method", "session_id", "error_code"),
    [
        ("session/prompt", "s2", -32010),  # a session the editor never attached
        ("session/resume", "s1", -32010),  # an attach of its own
        ("session/prompt", "s1", -32012),  # another error
    ],
)
def test_other_answers_pass_as_they_are(method: str, session_id: str, error_code: int) -> None:
    editor = attached_editor()
    again = Reattachments(editor)
    params = {"sessionId": session_id, "cwd": CWD}
    assert editor.sending(parse(frame(id=7, method=method, params=params)))
    assert again.take(refused(7, {**NOT_ATTACHED, "code": error_code})) is None
