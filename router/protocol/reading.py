"""Reading one frame, sans-I/O: :func:`parse` turns a text frame into a
:class:`~router.protocol.jsonrpc.Request`, :class:`~router.protocol.jsonrpc.Notification` or
:class:`~router.protocol.jsonrpc.Response`, or raises a
:class:`~router.protocol.errors.ProtocolError`; it never raises anything else (a Hypothesis
test holds it to that).

A frame costs what its size says, whatever its shape. :func:`parse` reads the envelope
(``jsonrpc``, ``id``, ``method``) and the few members the router routes on
(``params.sessionId``, ``params.requestId``, ``params.update.sessionUpdate`` and
``.sessionId``, ``result.sessionId``, the error's code and message) in one msgspec pass
that checks the whole frame and builds nothing else (:func:`router.protocol.jsontext.read`).
The rest is decoded only when asked (:class:`Frame`): ``params``, ``result`` and
``error.data`` in full, any other member by its path in one more pass that again builds
only that member.

Every legal JSON text parses, odd ones included (lone surrogate escapes, ``1e400``,
400-digit integers), except JSON nested deeper than about a thousand levels:
:class:`~router.protocol.errors.NestingTooDeep` (-32600, naming the id when it comes
before the nesting). Text no JSON parser accepts is a
:class:`~router.protocol.errors.ParseError`.
"""

from __future__ import annotations

import re
from typing import Any

import msgspec

from router.protocol import jsontext
from router.protocol.errors import InvalidRequest, NestingTooDeep, ParseError, ProtocolError
from router.protocol.frame import (
    ANY,
    ENVELOPE,
    ERROR,
    FLAT_ENVELOPE,
    FLAT_PARAMS,
    PLAIN_PARAMS,
    RESULT,
    UNSET,
    FlatError,
    Frame,
    Member,
    ReadError,
    ReadParams,
    ReadResult,
)
from router.protocol.jsonrpc import (
    UNREAD,
    Message,
    Notification,
    Params,
    Request,
    RequestId,
    Response,
    Unread,
)
from router.protocol.jsontext import loads

#: request ids are integers that fit 64 bits (as orjson reads them) or strings
_ID_LOW, _ID_HIGH = -(2**63), 2**64


# -- parse ---------------------------------------------------------------------------------------


def parse(frame: str | bytes) -> Message:
    """Parse one frame. Raises :class:`ParseError` or :class:`InvalidRequest` only."""
    # ``type(x) is T`` where ``isinstance`` would do: what msgspec decodes is of exactly
    # the type asked for, and a failed isinstance costs a lookup of ``__class__`` (two
    # of these run for every frame the router relays)
    try:
        text = frame if type(frame) is str or isinstance(frame, str) else frame.decode()
    except UnicodeDecodeError as exc:
        raise ParseError(f"Parse error: {exc}") from None
    try:
        envelope = (
            ENVELOPE.decode(text) if len(text) < 4096 else jsontext.read_plain(ENVELOPE, text)
        )
    except (msgspec.DecodeError, UnicodeEncodeError, RecursionError):
        return _parse_flat(text)  # odd, invalid or too deep: the slow path says which
    params, result, error = envelope.params, envelope.result, envelope.error
    typed_error = error if type(error) is ReadError else None
    frame_read = Frame(
        text,
        text,
        False,
        params if type(params) is ReadParams else None,
        result if type(result) is ReadResult else None,
        typed_error.data if typed_error is not None else UNSET,
    )
    method = envelope.method
    request_id = envelope.id
    if type(method) is str and envelope.jsonrpc == "2.0":
        unread = None if params is None or params is UNSET else UNREAD
        if request_id is UNSET:
            # a notification (what _classify would make of it): most frames an agent sends
            return Notification(method, unread, text, frame_read)
        known_id = _request_id(request_id)
        if known_id is not None:  # a request (what _classify would make of it)
            return Request(known_id, method, unread, text, frame_read)
    elif method is UNSET and error is UNSET and result is not UNSET:
        known_id = _request_id(request_id)
        if known_id is not None and envelope.jsonrpc == "2.0":  # a call's answer, likewise
            return Response(known_id, UNREAD, None, text, frame_read)
    code: Any = None
    message: Any = None
    if typed_error is not None:
        code, message = typed_error.code, typed_error.message
    return _classify(
        frame_read,
        envelope.jsonrpc,
        envelope.id,
        envelope.method,
        None if params is None or params is UNSET else UNREAD,
        result is not UNSET,
        error is not UNSET,
        code,
        message,
    )


def _parse_flat(text: str) -> Message:
    """A frame :class:`Envelope` does not fit: read flat, then each member on its own."""
    try:
        flat, shifted = jsontext.read(FLAT_ENVELOPE, text)
    except msgspec.ValidationError:
        raise _not_an_object(text) from None
    except ValueError as exc:
        raise _read_error(exc, text) from None
    frame = Frame(text, shifted or text, shifted is not None, None, None, UNSET)
    frame.params = _object(FLAT_PARAMS, flat.params) or _object(PLAIN_PARAMS, flat.params)
    frame.result = _object(RESULT, flat.result)
    error = _object(ERROR, flat.error)
    if isinstance(error, FlatError):
        frame.data = error.data
    return _classify(
        frame,
        _value_or_unset(frame, flat.jsonrpc),
        _value_or_unset(frame, flat.id),
        _value_or_unset(frame, flat.method),
        _params_kind(flat.params),
        flat.result is not UNSET,
        flat.error is not UNSET,
        frame.value(error.code) if error else None,
        frame.value(error.message) if error else None,
    )


def _value_or_unset(frame: Frame, raw: Member) -> Any:
    return UNSET if raw is UNSET else frame.value(raw)


def _params_kind(raw: Member) -> Params | Unread | msgspec.Raw:
    if not isinstance(raw, msgspec.Raw):
        return None
    first = bytes(memoryview(raw)[:1])
    if first in (b"{", b"["):
        return UNREAD
    return None if bytes(raw) == b"null" else raw


def _object(decoder: msgspec.json.Decoder[Any], raw: Member) -> Any:
    """``raw`` read by ``decoder``; None when it is not an object of that shape."""
    if not isinstance(raw, msgspec.Raw):
        return None
    try:
        return decoder.decode(raw)
    except (msgspec.ValidationError, msgspec.DecodeError, RecursionError):
        return None


def _read_error(exc: ValueError, text: str) -> ProtocolError:
    """The error for a frame :func:`jsontext.read` refused."""
    if isinstance(exc, jsontext.TooDeep):
        return _invalid(f"{exc}: not read", _readable_id(text), NestingTooDeep)
    if isinstance(exc, jsontext.NotReadable):
        return _invalid(str(exc), _readable_id(text))
    if not text.strip():  # msgspec's own words ("Input data was truncated") mislead here
        return ParseError("Parse error: an empty message (one JSON-RPC message per frame or line)")
    return ParseError(f"Parse error: {exc}")


def _not_an_object(text: str) -> ProtocolError:
    """Why a frame that is JSON but not an object is refused (or not JSON at all)."""
    try:
        jsontext.read(ANY, text)
    except ValueError as exc:
        return _read_error(exc, text)
    if text.lstrip(" \t\r\n").startswith("["):
        return _invalid("Batches are not supported: send one JSON-RPC message per frame")
    return _invalid("A JSON-RPC message must be a JSON object")


def _classify(
    frame: Frame,
    jsonrpc: Any,
    request_id: Any,
    method: Any,
    params: Params | Unread | msgspec.Raw,
    has_result: bool,
    has_error: bool,
    code: Any,
    message: Any,
) -> Message:
    """The message the envelope read (values decoded, ``UNSET`` where absent; params
    None when absent or null, unread when a container, else its text) is."""
    known_id = _request_id(request_id)
    if jsonrpc != "2.0":
        raise _invalid('"jsonrpc" must be exactly "2.0"', known_id)
    if method is not UNSET:
        if not isinstance(method, str):
            raise _invalid('"method" must be a string', known_id)
        if isinstance(params, msgspec.Raw):
            raise _invalid('"params" must be an object or an array', known_id)
        if request_id is UNSET:
            return Notification(method, params, frame.text, frame)
        if known_id is None:
            raise _invalid('"id" must be a string or an integer')
        return Request(known_id, method, params, frame.text, frame)
    if request_id is UNSET or (known_id is None and request_id is not None):
        raise _invalid('a message without "method" is a response and needs a valid "id"')
    if has_result == has_error:
        raise _invalid('a response has exactly one of "result" and "error"', known_id)
    if has_result:
        return Response(known_id, UNREAD, None, frame.text, frame)
    if not isinstance(code, int) or isinstance(code, bool) or not isinstance(message, str):
        raise _invalid('"error" must be an object with an integer code and a string message')
    return Response(known_id, None, (code, message), frame.text, frame)


def _request_id(value: Any) -> RequestId | None:
    kind = type(value)  # what the envelope read: exactly a str or an int, or neither
    if kind is str:
        return value  # type: ignore[no-any-return]
    if kind is int:
        return value if _ID_LOW <= value < _ID_HIGH else None
    if isinstance(value, str):
        return value
    if isinstance(value, int) and not isinstance(value, bool) and _ID_LOW <= value < _ID_HIGH:
        return value
    return None


_LEADING_ID = re.compile(
    r'\s*\{(?:\s*"[^"\\]*(?:\\.[^"\\]*)*"\s*:\s*(?:"[^"\\]*(?:\\.[^"\\]*)*"|[-+.\w]+)\s*,)*?'
    r'\s*"id"\s*:\s*("[^"\\]*(?:\\.[^"\\]*)*"|-?\d+)',
    re.DOTALL,
)


def _readable_id(frame: str | bytes) -> RequestId | None:
    """The id of a frame parse refused, when it comes before any nested value."""
    head = frame[:4096]
    text = head if isinstance(head, str) else head.decode(errors="replace")
    found = _LEADING_ID.match(text)
    if found is None:
        return None
    try:
        return _request_id(loads(found.group(1)))
    except ValueError:
        return None


def _invalid(
    message: str,
    request_id: RequestId | None = None,
    kind: type[InvalidRequest] = InvalidRequest,
) -> InvalidRequest:
    exc = kind(message)
    exc.request_id = request_id
    return exc
