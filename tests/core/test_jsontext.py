"""router.protocol.jsontext: every legal JSON text is read, as the standard library reads it,
up to the nesting the parsers read; members are read without the rest, and measured in place."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings, strategies as st

from router.protocol.jsontext import (
    NotReadable,
    TooDeep,
    decode,
    dumps,
    loads,
    read,
    unshift,
    value_end,
)

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
@given(_VALUES, st.sampled_from([None, 1, "\t"]), st.booleans(), st.sampled_from([1, 300]))
def test_reads_what_the_standard_library_reads(
    value: Any, indent: int | str | None, ascii_only: bool, depth: int
) -> None:
    text = json.dumps(value, indent=indent, ensure_ascii=ascii_only)
    assert loads(text) == json.loads(text)
    assert _dig(loads(_deep(depth, text)), depth) == json.loads(text)  # at any depth


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet='{}[]":,0123456789.eE-+ \ntrufalsn\\'))
def test_rejects_what_the_standard_library_rejects(text: str) -> None:
    # Inside a list in both cases, once shallow and once deep; whether it is read (orjson
    # and the standard library may read a large integer differently: not our concern)
    try:
        json.loads(_deep(1, text))
        expected = True
    except ValueError:
        expected = False
    for depth in (1, 300):
        try:
            loads(_deep(depth, text))
            got = True
        except ValueError:
            got = False
        assert got == expected


def test_odd_but_legal_json() -> None:
    assert loads('"\\ud83d"') == "\ud83d"
    assert loads("1e400") == float("inf")
    assert _dig(loads(_deep(300, '"\\udc00"')), 300) == "\udc00"


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("NaN", "NaN is not JSON"),
        ("[Infinity]", "Infinity is not JSON"),
        ("-Infinity", "-Infinity is not JSON"),
        ("[" * 50_000, "nesting is too deep"),  # too deep for 3.11's bound and 3.12's
        (_deep(50_000, '"\\ud83d"'), "nesting is too deep"),
        ("[" * (16 * 1024 * 1024), "nesting is too deep"),
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


# -- reading members, shifting, measuring ----------------------------------------------------------


class _Pick(msgspec.Struct):
    a: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET


_PICK = msgspec.json.Decoder(_Pick)


@settings(max_examples=150, deadline=None)
@given(_VALUES, _VALUES, st.booleans())
def test_read_keeps_one_member_as_the_standard_library_decodes_it(
    value: Any, other: Any, ascii_only: bool
) -> None:
    text = json.dumps({"b": other, "a": value}, ensure_ascii=ascii_only)
    picked, shifted = read(_PICK, text)
    assert isinstance(picked.a, msgspec.Raw)
    assert decode(picked.a, shifted is not None) == json.loads(text)["a"]


@pytest.mark.parametrize(
    "text",
    [
        '{"a":"cut \\ud83d","b":"\\\\ud83d \\\\\\udc00"}',
        '{"b":["\\udbff\\udfff",{"\\ud800":1}],"a":{"\\ud800":"\\u00e9\\\\"}}',
    ],
)
def test_lone_surrogates_are_read_through_a_shifted_copy(text: str) -> None:
    picked, shifted = read(_PICK, text)
    assert shifted is not None
    assert len(shifted) == len(text.encode())
    assert unshift(shifted) == text.encode()
    assert isinstance(picked.a, msgspec.Raw)
    assert decode(picked.a, True) == json.loads(text)["a"]


def test_a_shift_that_could_not_be_undone_is_refused() -> None:
    with pytest.raises(NotReadable):
        read(_PICK, '{"a":"\\ud83d","b":"\\ue83d"}')
    assert read(_PICK, '{"a":"\\\\ud83d","b":"\\ue83d"}')[1] is None  # no lone surrogate


@pytest.mark.parametrize("text", ["{", '{"a":"\\ud83d"', '{"a":"\\x"}', '{"a":"\x01"}', "\ud800"])
def test_read_refuses_what_is_not_json(text: str) -> None:
    with pytest.raises(ValueError):  # noqa: PT011 (any message: msgspec's or the codec's)
        read(_PICK, text)


def test_read_refuses_deep_nesting_at_once() -> None:
    with pytest.raises(TooDeep):
        read(_PICK, '{"b":' + "[" * (16 * 1024 * 1024) + "}")


@settings(max_examples=200, deadline=None)
@given(_VALUES, st.sampled_from(["", " ", "\n\t "]), st.sampled_from([",1]", "}", "]"]))
def test_value_end_measures_one_value_in_place(value: Any, space: str, after: str) -> None:
    encoded = json.dumps(value).encode()
    text = b'["x",' + encoded + space.encode() + after.encode()
    assert value_end(text, 5) == 5 + len(encoded)


def test_value_end_relies_on_msgspecs_offset_past_the_next_byte() -> None:
    # value_end reads this message; a msgspec that words it otherwise fails here first
    with pytest.raises(msgspec.DecodeError, match=r"trailing characters \(byte 6\)"):
        msgspec.json.decode(b"[1]  ,", type=msgspec.Raw)
