"""W3C Trace Context's ``traceparent``, read and written (router.protocol.trace_context)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings, strategies as st

from router.protocol.trace_context import SAMPLED, TraceContext, parse_traceparent

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
SPAN = "00f067aa0ba902b7"
VALID = f"00-{TRACE}-{SPAN}-01"

_HEX = "0123456789abcdef"
_LOWER_HEX = st.text(_HEX, min_size=1, max_size=1)


def _hex(size: int) -> st.SearchStrategy[str]:
    return st.text(_HEX, min_size=size, max_size=size)


@settings(max_examples=500)
@given(st.text() | st.from_regex(r"[0-9a-fA-F]{2}-[0-9a-f-]{30,60}", fullmatch=True))
def test_parse_is_total_on_any_text(text: str) -> None:
    context = parse_traceparent(text)
    assert context is None or isinstance(context, TraceContext)
    if context is not None:  # whatever it read, it writes back as a valid version 00
        assert parse_traceparent(context.traceparent) == TraceContext(
            context.trace_id, context.span_id, context.flags & 0x03
        )


@given(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()
    | st.lists(st.text(max_size=3), max_size=2)
    | st.dictionaries(st.text(max_size=3), st.text(max_size=3), max_size=2)
)
def test_parse_of_anything_but_a_string_is_none(value: Any) -> None:
    assert parse_traceparent(value) is None


@given(_hex(32), _hex(16), _hex(2))
def test_a_valid_version_00_value_reads_back_as_it_was_written(
    trace_id: str, span_id: str, flags: str
) -> None:
    context = parse_traceparent(f"00-{trace_id}-{span_id}-{flags}")
    if trace_id == "0" * 32 or span_id == "0" * 16:
        assert context is None  # names no trace, or no span
        return
    assert context == TraceContext(trace_id, span_id, int(flags, 16))


def test_the_w3c_example_is_read() -> None:
    context = parse_traceparent(VALID)
    assert context == TraceContext(TRACE, SPAN, 1)
    assert context.flags & SAMPLED
    assert context.traceparent == VALID


@pytest.mark.parametrize(
    "value",
    [
        "",
        VALID.upper(),  # uppercase hex is not the format
        f"00-{TRACE.upper()}-{SPAN}-01",
        f"00-{'0' * 32}-{SPAN}-01",  # no trace
        f"00-{TRACE}-{'0' * 16}-01",  # no span
        f"ff-{TRACE}-{SPAN}-01",  # the version that is never valid
        f"00-{TRACE}-{SPAN}-01-more",  # version 00 is exactly 55 characters
        f"00-{TRACE}-{SPAN}-1",
        f"00-{TRACE[:-1]}-{SPAN}-01",
        f"00_{TRACE}_{SPAN}_01",
        f" {VALID}",
        f"{VALID}\n",
        f"0g-{TRACE}-{SPAN}-01",
        f"01-{TRACE}-{SPAN}-01more",  # a later version's extra fields follow a "-"
    ],
)
def test_invalid_values_name_no_trace(value: str) -> None:
    assert parse_traceparent(value) is None


def test_a_later_version_is_read_by_its_first_four_fields() -> None:
    context = parse_traceparent(f"cc-{TRACE}-{SPAN}-01-what-the-future-holds")
    assert context == TraceContext(TRACE, SPAN, 1)
    assert context.traceparent == VALID  # written as the version this router knows
    assert parse_traceparent(f"01-{TRACE}-{SPAN}-00") == TraceContext(TRACE, SPAN, 0)


def test_unknown_flags_are_written_as_zeros() -> None:
    context = parse_traceparent(f"00-{TRACE}-{SPAN}-ff")
    assert context is not None
    assert context.flags == 0xFF
    assert context.traceparent == f"00-{TRACE}-{SPAN}-03"


def test_the_routers_own_ids() -> None:
    context = TraceContext.of(int(TRACE, 16), int(SPAN, 16), 0x05)
    assert context == TraceContext(TRACE, SPAN, 0x01)
    assert TraceContext.of(1, 1, 0).traceparent == f"00-{'0' * 31}1-{'0' * 15}1-00"
    for trace_id, span_id in [(0, 1), (1, 0), (1 << 128, 1), (1, 1 << 64)]:
        with pytest.raises(ValueError, match="neither is zero"):
            TraceContext.of(trace_id, span_id, 0)
