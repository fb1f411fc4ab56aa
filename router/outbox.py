"""Frames waiting for a writer, bounded in frames and in characters.

Sans-I/O: the router's links to backends and the host's clients each keep one in
front of their socket and decide themselves when to write and when to wait. A frame
that would pass a bound is refused whole (nothing of it is queued), so the caller can
give up the slow peer instead of buffering without end.
"""

from __future__ import annotations

import collections


class Outbox:
    """Frames in the order they were put, at most ``max_frames`` of them and
    ``max_chars`` characters in all."""

    __slots__ = ("_chars", "_max_chars", "_max_frames", "frames")

    def __init__(self, max_frames: int, max_chars: int) -> None:
        #: the frames queued, in order: None or empty when none are (made on the first
        #: frame queued: an empty deque is ~600 B of every idle link). Read it, do not
        #: write it: a writer of every frame asks it, and a call to ``bool`` costs more
        self.frames: collections.deque[str] | None = None
        self._chars = 0
        self._max_frames = max_frames
        self._max_chars = max_chars

    def __bool__(self) -> bool:
        return bool(self.frames)

    def put(self, text: str) -> bool:
        """Queue ``text``; False (and nothing queued) when that would pass a bound."""
        frames = self.frames
        if frames is None:
            frames = self.frames = collections.deque()
        if len(frames) >= self._max_frames or self._chars + len(text) > self._max_chars:
            return False
        frames.append(text)
        self._chars += len(text)
        return True

    def take(self) -> str | None:
        """The oldest frame, or None when there is none (then the deque is let go)."""
        if not self.frames:
            self.frames = None
            return None
        text = self.frames.popleft()
        self._chars -= len(text)
        return text
