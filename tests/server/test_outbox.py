"""The bounded outbox in front of a link's or a host client's socket."""

from __future__ import annotations

from router.outbox import Outbox


def test_frames_leave_in_the_order_they_were_put() -> None:
    outbox = Outbox(max_frames=3, max_chars=100)
    assert not outbox
    for text in ("a", "bb", "ccc"):
        assert outbox.put(text)
    assert outbox
    assert [outbox.take(), outbox.take(), outbox.take(), outbox.take()] == ["a", "bb", "ccc", None]
    assert not outbox


def test_a_frame_past_either_bound_is_refused_whole() -> None:
    outbox = Outbox(max_frames=2, max_chars=5)
    assert outbox.put("abc")
    assert not outbox.put("xyz")  # 6 characters in all: over the size bound
    assert outbox.put("de")  # exactly at the size bound
    assert not outbox.put("")  # a third frame: over the frame bound
    assert [outbox.take(), outbox.take(), outbox.take()] == ["abc", "de", None]
    assert outbox.put("fghij")  # taking frees both bounds
