"""Edits of a frame's text in place, sans-I/O: the only edits the router makes to a
forwarded frame.

They are its top-level ``id`` (agent requests get router-assigned ids so two agents never
collide) and, rarely, one member of ``params`` (or, sealing session ids, of ``result``
and ``error.data``): :func:`replace_id`, :func:`replace_param` and :func:`replace_member`
splice the new value into the original text without touching the rest of it. They walk
the members of the objects they change, measuring each value in place at C speed
(:func:`router.protocol.jsontext.value_end`); past :data:`MAX_WALKED_MEMBERS` members in
one object they stop with :class:`~router.protocol.errors.InvalidRequest` rather than
walk on.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from typing import Any

from router.protocol import jsontext
from router.protocol.errors import InvalidRequest
from router.protocol.jsontext import dumps

#: Members a splice walks in one object before it gives up (a JSON-RPC envelope has
#: six at most; ACP's params a dozen).
MAX_WALKED_MEMBERS = 4096

# -- splicing values into original text ----------------------------------------------------------

_KEY = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_SPACE = re.compile(rb"[ \t\r\n]*")
_STRING_TEXT = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_SPACE_TEXT = re.compile(r"[ \t\r\n]*")
_SCALAR_END_TEXT = re.compile(r"[\s,}\]]")
_ESCAPE_U = re.compile(r"\\u")

#: one edit of a frame's bytes: replace [start, end) with the bytes given
_Edit = tuple[int, int, bytes]


class _Walk:
    """A frame's text, to find members' spans in.

    An ASCII frame is walked as it is (character offsets are byte offsets, so msgspec
    measures a container in an encoded copy made when one is first measured). Any
    other is walked as UTF-8 bytes (edits are made to the bytes, then decoded again);
    one holding lone surrogate escapes in its shifted copy (the same length, so the
    same offsets: :func:`router.protocol.jsontext.shift`).
    """

    def __init__(self, text: str) -> None:
        self.text = text
        self.shifted = False
        self._encoded: bytes | None = None
        self.scan: str | bytes = text
        if text.isascii() and ("\\" not in text or "\\u" not in text):  # one char first: fast
            return
        shifted = jsontext.shift(self.encoded)
        self.shifted = isinstance(shifted, bytes)
        if isinstance(shifted, bytes):
            self.scan = shifted
        elif not text.isascii():
            self.scan = self.encoded

    @property
    def encoded(self) -> bytes:
        if self._encoded is None:
            self._encoded = self.text.encode()
        return self._encoded

    def at(self, i: int) -> str:
        char = self.scan[i]
        return char if isinstance(char, str) else chr(char)

    def skip_space(self, i: int) -> int:
        if self.at(i) not in " \t\r\n":  # compact JSON: no regex call at all
            return i
        scan = self.scan
        match = _SPACE_TEXT.match(scan, i) if isinstance(scan, str) else _SPACE.match(scan, i)
        return match.end() if match else i

    def key_at(self, i: int) -> str | bytes:
        scan = self.scan
        key = _STRING_TEXT.match(scan, i) if isinstance(scan, str) else _KEY.match(scan, i)
        assert key is not None, "splicing needs a frame parse() accepted"
        return key.group()

    def value_end(self, start: int) -> int:
        scan = self.scan
        if isinstance(scan, bytes):
            return jsontext.value_end(scan, start)
        first = scan[start]
        if first == '"':
            match = _STRING_TEXT.match(scan, start)
            assert match is not None
            return match.end()
        if first not in "{[":
            found = _SCALAR_END_TEXT.search(scan, start)
            return found.start() if found else len(scan)
        return jsontext.value_end(self.encoded, start)  # ASCII: the same offsets

    def top(self) -> int:
        return self.skip_space(0)

    def members(self, brace: int) -> Iterator[tuple[str | bytes, int]]:
        """Key token and value start of each member of the object at ``brace``; a value
        is measured only when the caller asks for the next member."""
        i = brace + 1
        for _ in range(MAX_WALKED_MEMBERS):
            i = self.skip_space(i)
            if self.at(i) == "}":
                return
            if self.at(i) == ",":
                i = self.skip_space(i + 1)
            key = self.key_at(i)
            i = self.skip_space(i + len(key)) + 1  # past ":"
            start = self.skip_space(i)
            yield key, start
            i = self.value_end(start)
        raise InvalidRequest(f"more than {MAX_WALKED_MEMBERS} members in one object: not spliced")

    def key_is(self, token: str | bytes, name: str) -> bool:
        """Whether the JSON string ``token`` spells ``name`` (escapes included)."""
        raw = token if isinstance(token, bytes) else token.encode()
        if raw[1:-1] == name.encode():
            return True
        return b"\\" in raw and jsontext.decode(raw, self.shifted) == name

    def may_repeat(self, start: int, name: str) -> bool:
        """Whether a ``name`` key could come after ``start``: spelled plainly, or behind
        any ``\\u`` escape (which could spell it)."""
        scan = self.scan
        if isinstance(scan, str):
            if scan.find("\\", start) >= 0 and scan.find("\\u", start) >= 0:
                return True
            return scan.find(f'"{name}"', start) >= 0
        if scan.find(b"\\", start) >= 0 and scan.find(b"\\u", start) >= 0:
            return True
        return scan.find(f'"{name}"'.encode(), start) >= 0

    def path_spans(self, brace: int, path: tuple[str, ...]) -> Iterator[tuple[int, int]]:
        name, rest = path[0], path[1:]
        for key, start in self.members(brace):
            if self.key_is(key, name):
                if not rest:
                    yield start, self.value_end(start)
                elif self.at(start) == "{":
                    yield from self.path_spans(start, rest)
                if not self.may_repeat(start + 1, name):
                    return

    def insertion(self, brace: int, member: bytes) -> _Edit:
        """The edit that puts ``member`` first in the object opening at ``brace``."""
        empty = self.at(self.skip_space(brace + 1)) == "}"
        return (brace + 1, brace + 1, member if empty else member + b",")

    def edited(self, edits: Iterable[_Edit]) -> str:
        if self.text.isascii():  # byte offsets are character offsets: edit the text itself
            pieces: list[str] = []
            at = 0
            for start, end, replacement in edits:
                pieces += (self.text[at:start], replacement.decode())
                at = end
            pieces.append(self.text[at:])
            return "".join(pieces)
        raw = self.encoded
        out: list[bytes] = []
        last = 0
        for start, end, replacement in edits:
            out += (raw[last:start], replacement)
            last = end
        out.append(raw[last:])
        return b"".join(out).decode()


def replace_id(text: str, new_id: int | str) -> str:
    """Return ``text`` with the value of its top-level ``"id"`` member(s) replaced.

    ``text`` must be a JSON object that :func:`~router.protocol.reading.parse` accepted. Everything else in the
    frame (spacing, key order, ``_meta``, unknown fields) stays exactly as it was.

    Senders put ``"id"`` near the front, so the walk usually stops there and the cost
    does not grow with the payload: it goes on only when the rest of the frame could
    hold the key again (a plain ``"id"`` or an escape), so a frame repeating the key
    cannot keep an id of its own past the router; each value it passes is measured in
    place at C speed.
    """
    walk = _Walk(text)
    encoded = dumps(new_id).encode()
    return walk.edited((s, e, encoded) for s, e in walk.path_spans(walk.top(), ("id",)))


def replace_param(text: str, name: str, value: Any) -> str:
    """Return ``text`` with ``params[name]`` set to ``value``, the rest byte for byte.

    For the rare rewrite inside ``params`` (a ``$/cancel_request`` naming an agent
    request). ``text`` must be a JSON object that :func:`~router.protocol.reading.parse` accepted; a member
    ``params`` lacks is added first in it, and a ``params`` that is not an object (or
    is missing) becomes ``{name: value}``. Repeated keys are all rewritten, as in
    :func:`replace_id`.
    """
    walk = _Walk(text)
    encoded = dumps(value).encode()
    member = dumps(name).encode() + b":" + encoded
    top = walk.top()
    params = [start for key, start in walk.members(top) if walk.key_is(key, "params")]
    if not params:
        return walk.edited([walk.insertion(top, b'"params":{' + member + b"}")])
    edits: list[_Edit] = []
    for start in params:
        if walk.at(start) != "{":
            edits.append((start, walk.value_end(start), b"{" + member + b"}"))
            continue
        spans = [(s, walk.value_end(s)) for key, s in walk.members(start) if walk.key_is(key, name)]
        edits += [(s, e, encoded) for s, e in spans] or [walk.insertion(start, member)]
    return walk.edited(edits)


def replace_member(text: str, path: tuple[str, ...], value: Any) -> str:
    """Return ``text`` with the value at ``path`` (e.g. ``("params", "sessionId")``)
    replaced wherever the path leads, repeated keys included; the rest byte for byte.

    ``text`` must be a frame :func:`~router.protocol.reading.parse` accepted; a path that leads nowhere (or
    through something that is not an object) leaves it as it was. As in
    :func:`replace_id`, the walk stops after a match unless the key could come again,
    so a large value after the match (a prompt, a tool call's output) is never walked.
    """
    walk = _Walk(text)
    encoded = dumps(value).encode()
    return walk.edited((s, e, encoded) for s, e in walk.path_spans(walk.top(), path))


def put_member(text: str, path: tuple[str, ...], value: Any) -> str:
    """Return ``text`` with the value at ``path`` set to ``value``, the rest byte for
    byte: replaced wherever the path leads (repeated keys included), else added first
    in the deepest object on the path, with the objects the path still needs (a
    ``params._meta.traceparent`` for a request without ``_meta``).

    ``text`` must be a frame :func:`~router.protocol.reading.parse` accepted. A path
    through something that is not an object (``params`` an array, ``_meta`` null)
    leaves the frame as it was: its sender's value is not the router's to replace.
    """
    walk = _Walk(text)
    edits = list(_put(walk, walk.top(), path, dumps(value).encode()))
    return walk.edited(edits) if edits else text


def _put(walk: _Walk, brace: int, path: tuple[str, ...], encoded: bytes) -> Iterator[_Edit]:
    """The edits that set ``path`` to ``encoded`` in the object opening at ``brace``.

    As in :func:`replace_member`, the walk stops after a match unless the key could come
    again, and an object the key cannot be in (not spelled after its brace, no escape)
    is not walked at all: the member is added at once."""
    name, rest = path[0], path[1:]
    found = False
    if walk.may_repeat(brace + 1, name):
        for key, start in walk.members(brace):
            if not walk.key_is(key, name):
                continue
            found = True
            if not rest:
                yield start, walk.value_end(start), encoded
            elif walk.at(start) == "{":
                yield from _put(walk, start, rest, encoded)
            if not walk.may_repeat(start + 1, name):
                break
    if not found:
        member = encoded
        for outer in reversed(rest):
            member = b"{" + dumps(outer).encode() + b":" + member + b"}"
        yield walk.insertion(brace, dumps(name).encode() + b":" + member)


def replace_parsed_member(text: str, path: tuple[str, ...], value: Any) -> str:
    """:func:`replace_member` for a path the caller has parsed and found in the frame.

    The common frame spells the path's last key once, plainly, with no ``\\u`` escape
    anywhere: then that one spelling is the member (a value or an escaped quote cannot
    spell ``"key"`` followed by ``:`` without a second, real spelling), and its value, a
    string, is spliced without walking the frame. Any other frame takes the full walk.
    """
    quoted = f'"{path[-1]}"'
    at = text.find(quoted)
    if at < 0 or text.find(quoted, at + 1) >= 0 or _ESCAPE_U.search(text) is not None:
        return replace_member(text, path, value)
    colon = _SPACE_TEXT.match(text, at + len(quoted))
    assert colon is not None  # the pattern matches the empty string
    if not text.startswith(":", colon.end()):
        return replace_member(text, path, value)
    spaces = _SPACE_TEXT.match(text, colon.end() + 1)
    assert spaces is not None
    string = _STRING_TEXT.match(text, spaces.end())
    if string is None:
        return replace_member(text, path, value)
    return text[: string.start()] + dumps(value) + text[string.end() :]
