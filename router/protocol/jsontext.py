"""JSON text to values and back: every legal JSON text is read, fast when it is common.

orjson reads almost every frame, but it rejects some legal JSON (RFC 8259): lone
surrogate escapes (``"\\ud83d"``, which agents emit when they cut a string inside an
emoji), numbers beyond a double (``1e400``) and nesting deeper than 1024. Peers send
all three, and a frame the router cannot read is an answer a client never gets. So
:func:`loads` falls back to the standard library's parser, and when that runs out of
recursion depth (about 1000 levels), to a decoder that keeps its own stack and has no
depth limit. The fallbacks read exactly what ``json.loads`` reads, except the
non-JSON constants ``NaN`` and ``Infinity``, and only frames orjson rejected pay
for them.

:func:`dumps` likewise falls back to the standard library for values orjson will not
write (strings holding a lone surrogate), escaping them so the text stays valid UTF-8.
"""

from __future__ import annotations

import json
import re
from typing import Any

import orjson

_SPACE = re.compile(r"[ \t\n\r]*")


def loads(frame: str | bytes) -> Any:
    """Decode one JSON text; raises :class:`ValueError` only, when it is not JSON."""
    try:
        return orjson.loads(frame)
    except orjson.JSONDecodeError:
        pass
    text = _unicode(frame)
    try:
        return json.loads(text, parse_constant=_not_json)
    except RecursionError:
        return _decode_with_a_stack(text)


def dumps(value: Any) -> str:
    """Encode ``value`` compactly; lone surrogates are written as ``\\u`` escapes."""
    try:
        return orjson.dumps(value).decode()
    except orjson.JSONEncodeError:
        return json.dumps(value, separators=(",", ":"), allow_nan=False)


def _unicode(frame: str | bytes) -> str:
    """``frame`` as text that is valid Unicode (no raw surrogates), else ValueError."""
    if isinstance(frame, bytes):
        return frame.decode()  # UnicodeDecodeError is a ValueError
    frame.encode()  # a str holding a raw surrogate raises UnicodeEncodeError (a ValueError)
    return frame


def _not_json(constant: str) -> Any:
    raise ValueError(f"{constant} is not JSON")


#: reads one scalar (string, number, literal) with the C scanner, which never recurses there
_SCALARS = json.JSONDecoder(parse_constant=_not_json)


def _decode_with_a_stack(text: str) -> Any:
    """Decode JSON of any depth: containers wait on an explicit stack, not the C stack."""
    open_containers: list[dict[str, Any] | list[Any]] = []
    keys: list[str] = []  # the pending key of each open object, innermost last
    i = _skip(text, 0)
    while True:
        value, i = _value(text, i)
        if isinstance(value, _Opened):
            container, i = value.container, _skip(text, i)
            if text.startswith("}" if isinstance(container, dict) else "]", i):
                value, i = container, i + 1  # empty: a finished value
            else:
                open_containers.append(container)
                if isinstance(container, dict):
                    key, i = _key(text, i)
                    keys.append(key)
                continue
        while True:  # place the finished value in its container, closing what ends here
            if not open_containers:
                if _skip(text, i) != len(text):
                    raise ValueError(f"extra data at {i}")
                return value
            container = open_containers[-1]
            if isinstance(container, dict):
                container[keys[-1]] = value
            else:
                container.append(value)
            i = _skip(text, i)
            if text.startswith(",", i):
                i = _skip(text, i + 1)
                if isinstance(container, dict):
                    keys[-1], i = _key(text, i)
                break
            if not text.startswith("}" if isinstance(container, dict) else "]", i):
                raise ValueError(f"expected ',' or a closing bracket at {i}")
            open_containers.pop()
            if isinstance(container, dict):
                keys.pop()
            value, i = container, i + 1


class _Opened:
    """A container whose members are still to come."""

    __slots__ = ("container",)

    def __init__(self, container: dict[str, Any] | list[Any]) -> None:
        self.container = container


def _value(text: str, i: int) -> tuple[Any, int]:
    """The scalar (or an opened container) starting at ``i``, and the index after it."""
    if text.startswith("{", i):
        return _Opened({}), i + 1
    if text.startswith("[", i):
        return _Opened([]), i + 1
    return _SCALARS.raw_decode(text, i)


def _key(text: str, i: int) -> tuple[str, int]:
    """An object key starting at ``i`` and the index of the value after its colon."""
    if not text.startswith('"', i):
        raise ValueError(f"expected a key at {i}")
    key, i = _SCALARS.raw_decode(text, i)
    i = _skip(text, i)
    if not text.startswith(":", i):
        raise ValueError(f"expected ':' at {i}")
    return key, _skip(text, i + 1)


def _skip(text: str, i: int) -> int:
    match = _SPACE.match(text, i)
    assert match is not None  # the pattern matches the empty string
    return match.end()
