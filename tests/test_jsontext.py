"""router.protocol.jsontext: every legal JSON text is read, as the standard library reads it."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings, strategies as st

from router.protocol.jsontext import dumps, loads

_VALUES: st.SearchStrategy[Any] = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)  # beyond, orjson reads a float: not our concern here
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=3), children, max_size=4)
    ),
    max_leaves=20,
)


def _deep(depth: int, inner: str) -> str:
    return '{"a":[' * depth + inner + "]}" * depth


def _dig(value: Any, depth: int) -> Any:
    for _ in range(depth):
        value = value["a"][0]
    return value


@settings(max_examples=150, deadline=None)
@given(_VALUES, st.sampled_from([None, 1, "\t"]), st.booleans(), st.sampled_from([1, 1100, 3000]))
def test_reads_what_the_standard_library_reads(
    value: Any, indent: int | str | None, ascii_only: bool, depth: int
) -> None:
    text = json.dumps(value, indent=indent, ensure_ascii=ascii_only)
    assert loads(text) == json.loads(text)
    assert _dig(loads(_deep(depth, text)), depth) == json.loads(text)  # at any depth


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet='{}[]":,0123456789.eE-+ \ntrufalsn\\'))
def test_rejects_what_the_standard_library_rejects(text: str) -> None:
    # Inside a list in both cases: once shallow for the standard library, once too deep for it.
    try:
        expected: Any = _dig(json.loads(_deep(1, text)), 1)
    except (ValueError, IndexError):
        expected = ValueError
    try:
        got: Any = _dig(loads(_deep(1100, text)), 1100)
    except (ValueError, IndexError):
        got = ValueError
    assert got == expected


def test_odd_but_legal_json() -> None:
    assert loads('"\\ud83d"') == "\ud83d"
    assert loads("1e400") == float("inf")
    assert _dig(loads(_deep(20_000, '"\\udc00"')), 20_000) == "\udc00"


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("NaN", "NaN is not JSON"),
        ("[Infinity]", "Infinity is not JSON"),
        ("-Infinity", "-Infinity is not JSON"),
        ("[" * 5000, "Expecting value"),
        # 20,000 deep: past the standard library's depth on every Python we run (3.13's C
        # scanner reads 5,000 nested objects itself), so these reach the stack decoder
        (_deep(20_000, "1")[:-1], "expected ',' or a closing bracket"),
        ('{"a":' * 20_000 + "1 2", "expected ',' or a closing bracket"),
        ("\ud800", "surrogates not allowed"),
    ],
)
def test_not_json(text: str, reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        loads(text)


def test_dumps_escapes_a_lone_surrogate() -> None:
    text = dumps({"t": "cut \ud83d", "é": 1})
    assert text == '{"t":"cut \\ud83d","\\u00e9":1}'
    text.encode()  # valid UTF-8
    assert dumps({"é": [1, None]}) == '{"é":[1,null]}'  # the common case: orjson, compact
