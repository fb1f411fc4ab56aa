"""router.core.listing: the merged session/list with its composite cursor, and merged capabilities."""

from __future__ import annotations

import base64
from typing import Any

import orjson
import pytest

from router import __version__
from router.core.listing import (
    MAX_CURSOR_CHARS,
    MAX_CWD_CHARS,
    ListPage,
    listed,
    merge_capabilities,
)
from router.protocol.errors import (
    BackendLinkLost,
    BackendRefused,
    ErrorObject,
    InvalidParams,
    LocateInconclusive,
)
from router.protocol.ids import BackendId

POOL = ["a", "b", "c"]


def _info(session_id: str, **extra: Any) -> dict[str, Any]:
    return {"sessionId": session_id, "cwd": "/w", **extra}


def _page(sessions: list[Any], next_cursor: str | None = None) -> dict[str, Any]:
    result: dict[str, Any] = {"sessions": sessions}
    if next_cursor is not None:
        result["nextCursor"] = next_cursor
    return result


# -- ListPage.from_params --------------------------------------------------------------------------


@pytest.mark.parametrize("params", [None, {}, [], "x"])
def test_first_page_asks_every_ready_backend(params: Any) -> None:
    page = ListPage.from_params(params, POOL)
    assert page == ListPage(None, dict.fromkeys(POOL))
    assert list(page.pending) == POOL
    assert page.backend_params("a") == {}


def test_cwd_is_passed_to_every_backend() -> None:
    page = ListPage.from_params({"cwd": "/work"}, POOL)
    assert page.cwd == "/work"
    assert all(page.backend_params(b) == {"cwd": "/work"} for b in POOL)


@pytest.mark.parametrize(
    "params",
    [{"cwd": 1}, {"cwd": ["/"]}, {"cursor": 5}, {"cursor": {"a": "x"}}, {"cursor": True}],
)
def test_bad_param_types_are_invalid_params(params: dict[str, Any]) -> None:
    with pytest.raises(InvalidParams) as caught:
        ListPage.from_params(params, POOL)
    assert caught.value.code == -32602


@pytest.mark.parametrize(
    "params",
    [{"cwd": "/" + "x" * MAX_CWD_CHARS}, {"cursor": "a" * (MAX_CURSOR_CHARS + 1)}],
)
def test_oversized_params_never_reach_a_backend(params: dict[str, Any]) -> None:
    with pytest.raises(InvalidParams) as caught:
        ListPage.from_params(params, POOL)
    assert caught.value.code == -32602


def test_params_at_the_bounds_pass() -> None:
    cwd = "/" + "x" * (MAX_CWD_CHARS - 1)
    assert ListPage.from_params({"cwd": cwd}, POOL).cwd == cwd


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


@pytest.mark.parametrize(
    "cursor",
    [
        "",
        "garbage!",
        "@@@@",
        "é",
        "not base64 at all",
        _b64(b"not json"),
        _b64(b"[1,2]"),
        _b64(b'{"v":2,"b":{"a":"x"}}'),
        _b64(b'{"v":1}'),
        _b64(b'{"v":1,"b":["a"]}'),
        _b64(b'{"v":1,"b":{"a":5}}'),
        _b64(b'{"v":1,"b":{"a":null}}'),
    ],
)
def test_garbage_cursors_are_invalid_params(cursor: str) -> None:
    with pytest.raises(InvalidParams) as caught:
        ListPage.from_params({"cursor": cursor}, POOL)
    assert caught.value.code == -32602
    assert caught.value.to_error()["code"] == -32602


# -- listed: what each backend's page, or its failure, makes of the answer --------------------------


def test_a_page_that_did_not_come_leaves_its_backend_out_and_named() -> None:
    page = ListPage.from_params({}, POOL)
    answers = {"a": _page([_info("s1")]), "b": TimeoutError(), "c": BackendLinkLost()}
    merged = listed(page, answers, [*POOL, "d"], listable={"a", "b", "c"})
    assert merged == {"sessions": [_info("s1")], "_meta": {"unlistedBackends": ["b", "c", "d"]}}


def test_no_page_at_all_is_retryable_and_a_refusal_is_the_clients() -> None:
    page = ListPage.from_params({}, POOL)
    with pytest.raises(LocateInconclusive) as silent:
        listed(page, {"a": TimeoutError()}, POOL, listable={"a"})
    assert silent.value.data == {"backends": ["a"], "retryable": True}
    refusal = BackendRefused(BackendId("b"), ErrorObject(-32000, "no list for you"))
    with pytest.raises(BackendRefused):
        listed(page, {"a": _page([]), "b": refusal}, POOL, listable={"a", "b"})


# -- merge -----------------------------------------------------------------------------------------


def test_merge_keeps_pool_order_and_drops_repeated_sessions() -> None:
    page = ListPage.from_params({}, POOL)
    merged = page.merge(
        {
            # answers arrive in any order; the merge follows the pool's
            "c": _page([_info("s5"), _info("s1", title="from c")]),
            "a": _page([_info("s1", title="from a"), _info("s2")]),
            "b": _page([_info("s3"), _info("s2"), _info("s4")]),
        }
    )
    assert merged == {
        "sessions": [
            _info("s1", title="from a"),
            _info("s2"),
            _info("s3"),
            _info("s4"),
            _info("s5"),
        ]
    }


def test_merge_skips_missing_and_malformed_answers() -> None:
    page = ListPage.from_params({}, POOL)
    merged = page.merge(
        {
            "a": _page([{"no": "id"}, "x", _info("s1"), {"sessionId": 5}, None]),
            "b": "not a result",
            # c did not answer (or does not list)
            "stranger": _page([_info("s9")], "zz"),
        }
    )
    assert merged == {"sessions": [_info("s1")]}


@pytest.mark.parametrize("sessions", [5, True, "abc", {"sessionId": "s"}, None])
def test_merge_survives_a_backend_with_a_malformed_sessions_member(sessions: Any) -> None:
    page = ListPage.from_params({}, ["a", "b"])
    merged = page.merge(
        {"a": {"sessions": sessions, "nextCursor": "a2"}, "b": _page([_info("s1")])}
    )
    assert merged["sessions"] == [_info("s1")]
    following = ListPage.from_params({"cursor": merged["nextCursor"]}, ["a", "b"])
    assert following.pending == {"a": "a2"}


def test_merge_keeps_unknown_fields_of_session_infos() -> None:
    info = _info("s1", _meta={"x": [1, {"y": None}]}, updatedAt="2026-01-01T00:00:00Z")
    merged = ListPage.from_params({}, POOL).merge({"a": _page([info])})
    assert merged == {"sessions": [info]}


def test_no_next_cursor_when_every_backend_is_done() -> None:
    page = ListPage.from_params({}, POOL)
    merged = page.merge({BackendId(b): _page([]) for b in POOL})
    assert merged == {"sessions": []}


def test_the_cursor_round_trips_each_backends_own_cursor() -> None:
    first = ListPage.from_params({"cwd": "/w"}, POOL)
    merged = first.merge(
        {
            "a": _page([_info("s1")], next_cursor="a-page-2"),
            "b": _page([_info("s2")]),  # done
            "c": _page([_info("s3")], next_cursor='c "2" / é'),
        }
    )
    cursor = merged["nextCursor"]
    assert isinstance(cursor, str)
    assert cursor.isascii()

    second = ListPage.from_params({"cwd": "/w", "cursor": cursor}, POOL)
    assert second.pending == {"a": "a-page-2", "c": 'c "2" / é'}
    assert second.backend_params("a") == {"cwd": "/w", "cursor": "a-page-2"}
    assert second.backend_params("c") == {"cwd": "/w", "cursor": 'c "2" / é'}
    assert second.backend_params("b") == {"cwd": "/w"}  # not asked: b is not pending

    last = second.merge(
        {
            "a": _page([_info("s4")]),
            "c": _page([_info("s5")], next_cursor="c3"),
            "b": _page([_info("never")]),  # b was done; an answer from it is ignored
        }
    )
    assert last["sessions"] == [_info("s4"), _info("s5")]
    third = ListPage.from_params({"cursor": last["nextCursor"]}, POOL)
    assert third.pending == {"c": "c3"}
    assert third.merge({"c": _page([])}) == {"sessions": []}


def test_a_backends_cursor_cut_inside_an_emoji_round_trips() -> None:
    merged = ListPage.from_params({}, ["a"]).merge({"a": _page([], next_cursor="p\ud83d")})
    following = ListPage.from_params({"cursor": merged["nextCursor"]}, ["a"])
    assert following.backend_params("a") == {"cursor": "p\ud83d"}


def test_an_empty_backend_cursor_is_still_a_cursor() -> None:
    merged = ListPage.from_params({}, ["a"]).merge({"a": _page([], next_cursor="")})
    following = ListPage.from_params({"cursor": merged["nextCursor"]}, ["a"])
    assert following.backend_params("a") == {"cursor": ""}


def test_backends_gone_since_the_last_page_are_skipped() -> None:
    merged = ListPage.from_params({}, POOL).merge(
        {"a": _page([], next_cursor="a2"), "b": _page([], next_cursor="b2")}
    )
    page = ListPage.from_params({"cursor": merged["nextCursor"]}, ["b", "c"])
    assert page.pending == {"b": "b2"}


def test_the_cursor_is_opaque_versioned_json() -> None:
    merged = ListPage.from_params({}, ["a"]).merge({"a": _page([], next_cursor="x")})
    cursor = merged["nextCursor"]
    raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
    assert orjson.loads(raw) == {"v": 1, "b": {"a": "x"}}


# -- merge_capabilities ----------------------------------------------------------------------------


def _init(
    *,
    session: dict[str, Any] | None = None,
    load: bool | None = None,
    prompt: dict[str, Any] | None = None,
    mcp: dict[str, Any] | None = None,
    auth: list[Any] | None = None,
) -> dict[str, Any]:
    agent: dict[str, Any] = {}
    if load is not None:
        agent["loadSession"] = load
    if prompt is not None:
        agent["promptCapabilities"] = prompt
    if mcp is not None:
        agent["mcpCapabilities"] = mcp
    if session is not None:
        agent["sessionCapabilities"] = session
    result: dict[str, Any] = {"protocolVersion": 1, "agentCapabilities": agent}
    if auth is not None:
        result["authMethods"] = auth
    return result


def _caps(results: list[Any]) -> dict[str, Any]:
    merged = merge_capabilities(results)
    assert merged["protocolVersion"] == 1
    assert merged["agentInfo"]["name"] == "acp-router"
    assert merged["agentInfo"]["version"] == __version__
    caps: dict[str, Any] = merged["agentCapabilities"]
    return caps


def test_no_backends_yet() -> None:
    merged = merge_capabilities([])
    assert merged["authMethods"] == []
    assert merged["agentCapabilities"] == {
        "loadSession": False,
        "promptCapabilities": {},
        "mcpCapabilities": {},
        "sessionCapabilities": {"status": {}},
    }


def test_status_is_always_advertised() -> None:
    assert _caps([_init()])["sessionCapabilities"] == {"status": {}}
    assert _caps([_init(session={"status": None})])["sessionCapabilities"] == {"status": {}}


def test_session_markers_are_the_intersection() -> None:
    caps = _caps(
        [
            _init(session={"close": {}, "fork": {}, "status": {}}),
            _init(session={"close": {}, "fork": {}}),
            _init(session={"close": True, "fork": {}}),  # close: invalid marker
            _init(session={"close": {}}),
        ]
    )
    assert caps["sessionCapabilities"] == {"status": {}}


def test_resume_is_advertised_when_any_backend_resumes() -> None:
    # one backend without resume does not take it from the sessions on the others
    caps = _caps([_init(session={"resume": {}}), _init(session={}), _init(session={"resume": 1})])
    assert caps["sessionCapabilities"] == {"resume": {}, "status": {}}
    assert _caps([_init(session={"resume": True})])["sessionCapabilities"] == {"status": {}}


def test_list_is_advertised_when_any_backend_lists() -> None:
    caps = _caps([_init(session={"list": {}}), _init(session={})])
    assert caps["sessionCapabilities"] == {"list": {}, "status": {}}


def test_an_invalid_list_marker_does_not_count() -> None:
    # RFD: "an invalid value means the capability is unsupported"
    caps = _caps([_init(session={"list": True}), _init(session={"list": None})])
    assert caps["sessionCapabilities"] == {"status": {}}


def test_load_session_when_any_backend_loads() -> None:
    assert _caps([_init(load=True), _init(load=True)])["loadSession"] is True
    assert _caps([_init(load=True), _init(load=False)])["loadSession"] is True
    assert _caps([_init(load=False), _init()])["loadSession"] is False
    assert _caps([{"agentCapabilities": {"loadSession": 1}}])["loadSession"] is False


def test_flags_are_the_intersection() -> None:
    caps = _caps(
        [
            _init(
                prompt={"image": True, "audio": True, "embeddedContext": True}, mcp={"http": True}
            ),
            _init(prompt={"image": True, "audio": False}, mcp={"http": True, "sse": True}),
        ]
    )
    assert caps["promptCapabilities"] == {"image": True, "audio": False}
    assert caps["mcpCapabilities"] == {"http": True}


def test_auth_methods_come_from_the_first_backend_that_has_them() -> None:
    methods = [{"id": "token", "name": "Token"}]
    merged = merge_capabilities([_init(), _init(auth=methods), _init(auth=[])])
    assert merged["authMethods"] == methods


@pytest.mark.parametrize("agent_caps", [None, [], "x", 5, True, [{"loadSession": True}]])
def test_malformed_agent_capabilities_count_as_none(agent_caps: Any) -> None:
    caps = _caps(
        [{"agentCapabilities": agent_caps}, _init(load=True, session={"resume": {}, "list": {}})]
    )
    assert caps["loadSession"] is True
    assert caps["sessionCapabilities"] == {"list": {}, "resume": {}, "status": {}}
    assert caps["promptCapabilities"] == {}


def test_results_that_are_not_objects_are_ignored() -> None:
    caps = _caps([None, "x", _init(load=True, session={"resume": {}})])
    assert caps["loadSession"] is True
    assert caps["sessionCapabilities"] == {"resume": {}, "status": {}}
