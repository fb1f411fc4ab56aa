"""JSON text to values and back, at a cost the text's size bounds whatever its shape.

Two ways in. :func:`loads` decodes a whole value: orjson, else the standard library for
the legal JSON orjson rejects (lone surrogate escapes such as ``"\\ud83d"``, which agents
emit when they cut a string inside an emoji, and numbers beyond a double such as
``1e400``). :func:`read` decodes only the members a msgspec type names (a ``Struct``
of ``msgspec.Raw`` fields): msgspec checks the rest and skips it at C speed without
building anything, so the envelope of a 16 MiB prompt costs no tree of 16 MiB.
:func:`value_end` measures one value in place, for splicing.

msgspec refuses lone surrogate escapes too. A text that holds some is read through a
copy of the same length where each ``\\uD800``-``\\uDFFF`` escape is written
``\\uE800``-``\\uEFFF`` (:func:`shift`); values read from such a copy are shifted back
before they are decoded (:func:`decode`), so they come out as sent.

Nesting is bounded: the parsers refuse a text nested deeper than the interpreter lets
them go (msgspec and the standard library at Python's recursion limit on 3.11, about a
thousand levels, and at its C stack bound on 3.12 and later, about ten thousand; orjson
at 1,024), and :class:`TooDeep` says so. Nothing here keeps its own stack: a frame of 16 MiB of
``[`` costs a refusal, not a tree.

:func:`dumps` falls back to the standard library for values orjson will not write
(strings holding a lone surrogate), escaping them so the text stays valid UTF-8.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any, TypeVar

import msgspec
import orjson

T = TypeVar("T")


class TooDeep(ValueError):
    """The text nests deeper than the parsers read."""

    def __init__(self) -> None:
        super().__init__("nesting is too deep (more than the interpreter reads)")


class NotReadable(ValueError):
    """Legal JSON the router cannot read cheaply: lone surrogate escapes alongside
    ``\\uE800``-``\\uEFFF`` escapes (see :func:`shift`)."""


def loads(frame: str | bytes | memoryview) -> Any:
    """Decode one JSON text; raises :class:`ValueError` only (:class:`TooDeep` for
    nesting beyond what the parsers read), when it is not JSON."""
    try:
        return orjson.loads(frame)
    except orjson.JSONDecodeError:
        pass
    text = _unicode(frame)
    try:
        return json.loads(text, parse_constant=_not_json)
    except RecursionError:
        raise TooDeep() from None


def dumps(value: Any) -> str:
    """Encode ``value`` compactly; lone surrogates are written as ``\\u`` escapes."""
    try:
        return orjson.dumps(value).decode()
    except orjson.JSONEncodeError:
        return json.dumps(value, separators=(",", ":"), allow_nan=False)


def _unicode(frame: str | bytes | memoryview) -> str:
    """``frame`` as text that is valid Unicode (no raw surrogates), else ValueError."""
    if not isinstance(frame, str):
        return bytes(frame).decode()  # UnicodeDecodeError is a ValueError
    frame.encode()  # a str holding a raw surrogate raises UnicodeEncodeError (a ValueError)
    return frame


def _not_json(constant: str) -> Any:
    raise ValueError(f"{constant} is not JSON")


# -- reading members without the rest ------------------------------------------------------------

#: The stack a parse leaves for later reads of the same text. msgspec's nesting bound is
#: Python's recursion limit less the stack in use (on 3.11), so a text read at one depth
#: could fail at a deeper one; :func:`read` therefore reads a large text with this much
#: less stack than any later read of its parts will have (the frames cost ~4 us: nothing
#: beside 64 KiB). A later read of a smaller text that fails there falls back to walking
#: its tokens (:func:`value_end`), which 64 KiB bounds.
_HEADROOM = 64
_LARGE = 64 * 1024


def read(decoder: msgspec.json.Decoder[T], text: str | bytes) -> tuple[T, bytes | None]:
    """``text`` decoded by ``decoder``, and the shifted copy it was read from when it
    holds lone surrogate escapes (:func:`shift`; decode its members with
    :func:`decode`, and read it again through that copy), else None.

    Raises:
        TooDeep: it nests deeper than the parsers read.
        NotReadable: see the exception.
        msgspec.ValidationError: JSON, but not of the decoder's type.
        ValueError: not JSON.
    """
    try:
        return _with_less_stack(text, decoder.decode), None
    except RecursionError:
        raise TooDeep() from None
    except msgspec.ValidationError:
        raise
    except msgspec.DecodeError as exc:
        failure = ValueError(str(exc))
    except UnicodeEncodeError as exc:  # a str holding a raw surrogate
        raise ValueError(str(exc)) from None
    shifted = shift(text.encode() if isinstance(text, str) else text)
    if shifted is None:
        raise failure
    if isinstance(shifted, NotReadable):
        raise shifted
    try:
        return _with_less_stack(shifted, decoder.decode), shifted
    except RecursionError:
        raise TooDeep() from None


def read_plain(decoder: msgspec.json.Decoder[T], text: str | bytes) -> T:
    """``text`` decoded by ``decoder``, as msgspec reads it (lone surrogate escapes
    refused: :func:`read` reads them), with less stack for a large text.

    Raises:
        msgspec.DecodeError: msgspec cannot read it (ValidationError: not of the type).
        RecursionError: it nests deeper than msgspec reads.
        UnicodeEncodeError: a str holding a raw surrogate.
    """
    return _with_less_stack(text, decoder.decode)


def _with_less_stack(text: str | bytes, decode: Callable[[str | bytes], T]) -> T:
    """``decode(text)``, with :data:`_HEADROOM` frames less stack when ``text`` is large."""
    if len(text) < _LARGE:
        return decode(text)
    return _deeper(_HEADROOM, text, decode)


def _deeper(frames: int, text: str | bytes, decode: Callable[[str | bytes], T]) -> T:
    return decode(text) if frames == 0 else _deeper(frames - 1, text, decode)


def decode(raw: msgspec.Raw | bytes, shifted: bool = False) -> Any:
    """The value of a member :func:`read` returned (``shifted`` as it said).

    Raises:
        ValueError: it cannot be decoded (:class:`TooDeep` included).
    """
    if not shifted:
        try:
            return msgspec.json.decode(raw)
        except msgspec.DecodeError:
            pass  # a number beyond a double, or a lone surrogate: loads reads them
        except RecursionError:
            raise TooDeep() from None
        return loads(memoryview(raw))
    return loads(unshift(bytes(raw)))


# -- lone surrogate escapes ----------------------------------------------------------------------

_PAIR = b"\\\\"
_MASKED_PAIR = b"\x00\x00"  # a raw NUL is never in JSON text, so it marks escaped backslashes
#: surrogate escapes (D8-DF) and their shifted spellings (E8-EF), each case on its own
#: so that shifting back restores the text's own spelling
_SURROGATE = (re.compile(rb"\\ud(?=[89a-fA-F])"), re.compile(rb"\\uD(?=[89a-fA-F])"))
_SHIFTED = (re.compile(rb"\\ue(?=[89a-fA-F])"), re.compile(rb"\\uE(?=[89a-fA-F])"))


def shift(text: bytes) -> bytes | NotReadable | None:
    """``text`` with each ``\\uD800``-``\\uDFFF`` escape written ``\\uE800``-``\\uEFFF``:
    the same length, and every other byte as it was.

    None when ``text`` holds no such escape (or a raw NUL: then it is not JSON); a
    :class:`NotReadable` when it holds ``\\uE8xx``-``\\uEFxx`` escapes too, which
    :func:`unshift` could not tell apart. Escaped backslashes are masked first, so
    ``\\\\ud83d`` (a backslash, then text) is left alone.
    """
    if b"\\" not in text or b"\x00" in text:
        return None
    masked = text.replace(_PAIR, _MASKED_PAIR)
    if all(pattern.search(masked) is None for pattern in _SURROGATE):
        return None
    if any(pattern.search(masked) is not None for pattern in _SHIFTED):
        return NotReadable(
            "lone surrogate escapes alongside \\uE800-\\uEFFF escapes: not read here"
        )
    masked = _SURROGATE[0].sub(rb"\\ue", masked)
    return _SURROGATE[1].sub(rb"\\uE", masked).replace(_MASKED_PAIR, _PAIR)


def unshift(text: bytes) -> bytes:
    """Undo :func:`shift` on any part of a shifted text."""
    if b"\\" not in text:
        return text
    masked = _SHIFTED[0].sub(rb"\\ud", text.replace(_PAIR, _MASKED_PAIR))
    return _SHIFTED[1].sub(rb"\\uD", masked).replace(_MASKED_PAIR, _PAIR)


# -- measuring a value in place ------------------------------------------------------------------

_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_SCALAR_END = re.compile(rb"[\s,}\]]")
_TOKEN = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"|[{}\[\]]', re.DOTALL)
_TRAILING = re.compile(r"trailing characters \(byte (\d+)\)")


def value_end(text: bytes, start: int) -> int:
    """The index just past the JSON value that starts at ``start`` in ``text`` (a text
    :func:`read` accepted, shifted if it was).

    Strings and scalars by a regex; containers by msgspec, which checks one value and
    reports where the text goes on after it, at C speed and without building it. That
    report is an error message: its offset is checked (the slice must be exactly one
    value) and, should msgspec ever word it otherwise, the containers are walked token
    by token instead.
    """
    first = text[start : start + 1]
    if first == b'"':
        match = _STRING.match(text, start)
        assert match is not None, "measuring needs text read before"
        return match.end()
    if first not in (b"{", b"["):
        found = _SCALAR_END.search(text, start)
        return found.start() if found else len(text)
    end = _measured(text, start)
    return end if end is not None else _walked(text, start)


def _measured(text: bytes, start: int) -> int | None:
    try:
        msgspec.json.decode(memoryview(text)[start:], type=msgspec.Raw)
    except msgspec.DecodeError as exc:
        found = _TRAILING.search(str(exc))
    except RecursionError:
        return None
    else:
        return len(text.rstrip())  # the value runs to the end of the text
    if found is None:
        return None
    # "byte N": the offset just past the first byte after the value that is not a space
    # (tests/core/test_jsontext.py holds msgspec to that)
    end = start + int(found.group(1)) - 1
    while text[end - 1] in _SPACES:
        end -= 1
    return end


_SPACES = frozenset(b" \t\r\n")


def _walked(text: bytes, start: int) -> int:
    depth = 0
    for token in _TOKEN.finditer(text, start):
        kind = token.group()
        if kind in (b"{", b"["):
            depth += 1
        elif kind in (b"}", b"]"):
            depth -= 1
            if depth == 0:
                return token.end()
    raise AssertionError("unbalanced JSON value")  # read() accepted it: cannot happen
