"""The size of a text in UTF-8, counted without encoding a copy where it can be."""

from __future__ import annotations


def size(text: str) -> int:
    """The bytes ``text`` takes in UTF-8: an ASCII str (which CPython flags, so that
    ``isascii()`` is O(1)) has one byte per character; any other is encoded to be counted."""
    return len(text) if text.isascii() else len(text.encode())
