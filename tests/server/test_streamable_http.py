"""The Streamable HTTP door's pieces: which ``Accept`` takes event streams, and a frame as an
event (tests/e2e/test_streamable_http.py: the door end to end)."""

from __future__ import annotations

import pytest

from router.server.door.event_stream import event
from router.server.door.streamable_http import accepts_events


@pytest.mark.parametrize(
    ("accept", "accepted"),
    [
        (None, False),
        ("application/json", False),
        ("text/event-stream", True),
        ("application/json, text/event-stream;q=0.9", True),
        ("TEXT/EVENT-STREAM", True),
        ("text/*", True),
        ("*/*", True),
    ],
)
def test_accept_must_include_event_streams(accept: str | None, accepted: bool) -> None:
    assert accepts_events(accept) is accepted


def test_a_frame_with_line_breaks_is_one_event_of_several_data_lines() -> None:
    assert event('{"a":1}') == b'data: {"a":1}\n\n'
    assert event('{\n  "a": 1\r\n}') == b'data: {\ndata:   "a": 1\ndata: }\n\n'
