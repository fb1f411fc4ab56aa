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

import functools
import re
from typing import Any, Final

import msgspec

from router.protocol import jsontext
from router.protocol.errors import InvalidRequest, NestingTooDeep, ParseError, ProtocolError
from router.protocol.jsonrpc import (
    UNREAD,
    UPDATE_KIND,
    Message,
    Notification,
    Params,
    Request,
    RequestId,
    Response,
    Unread,
)
from router.protocol.jsontext import loads

# -- what parse reads --------------------------------------------------------------------------

_UNSET: Final = msgspec.UNSET
_Member = msgspec.Raw | msgspec.UnsetType


class _Update(msgspec.Struct):
    """An update, as parse reads it in its one pass: its kind (asked of every update an
    agent streams) as the string it must be, or null; any other value of it is left to
    :class:`_FlatUpdate`."""

    sessionUpdate: str | msgspec.UnsetType | None = _UNSET
    sessionId: _Member = _UNSET


class _FlatUpdate(msgspec.Struct):
    """:class:`_Update` with every member unread."""

    sessionUpdate: _Member = _UNSET
    sessionId: _Member = _UNSET


class _Params(msgspec.Struct):
    """The params parse reads in its one pass: ``sessionId`` (asked of nearly every
    request) as the string it must be, or null; any other value of it is left to
    :class:`_FlatParams`."""

    sessionId: str | msgspec.UnsetType | None = _UNSET
    requestId: _Member = _UNSET
    update: _Update | msgspec.UnsetType | None = _UNSET


class _FlatParams(msgspec.Struct):
    """:class:`_Params` with every member unread (a frame :class:`_Envelope` does not fit)."""

    sessionId: _Member = _UNSET
    requestId: _Member = _UNSET
    update: _FlatUpdate | msgspec.UnsetType | None = _UNSET


class _PlainParams(msgspec.Struct):
    """:class:`_FlatParams` when ``update`` is not an object."""

    sessionId: _Member = _UNSET
    requestId: _Member = _UNSET


class _Result(msgspec.Struct):
    sessionId: _Member = _UNSET


class _Error(msgspec.Struct):
    code: _Member = _UNSET
    message: _Member = _UNSET
    data: _Member = _UNSET


class _TypedError(msgspec.Struct):
    code: int | msgspec.UnsetType = _UNSET
    message: str | msgspec.UnsetType = _UNSET
    data: _Member = _UNSET


class _Envelope(msgspec.Struct):
    """Everything parse reads, typed, in one pass: what the common frame is (params and
    result objects or null, an integer or string id, a well-formed error)."""

    jsonrpc: str | msgspec.UnsetType = _UNSET
    id: int | str | msgspec.UnsetType | None = _UNSET
    method: str | msgspec.UnsetType = _UNSET
    params: _Params | msgspec.UnsetType | None = _UNSET
    result: _Result | msgspec.UnsetType | None = _UNSET
    error: _TypedError | msgspec.UnsetType | None = _UNSET


class _FlatEnvelope(msgspec.Struct):
    """The envelope with every member unread, for frames :class:`_Envelope` does not fit
    (or cannot read: lone surrogate escapes, deep nesting); then each is read on its own."""

    jsonrpc: _Member = _UNSET
    id: _Member = _UNSET
    method: _Member = _UNSET
    params: _Member = _UNSET
    result: _Member = _UNSET
    error: _Member = _UNSET


#: the params that may hold an update (a tuple built once: ``A | B`` builds a union per call)
_WITH_UPDATE: Final = (_Params, _FlatParams)

_ENVELOPE = msgspec.json.Decoder(_Envelope)
_FLAT_ENVELOPE = msgspec.json.Decoder(_FlatEnvelope)
_FLAT_PARAMS = msgspec.json.Decoder(_FlatParams)
_PLAIN_PARAMS = msgspec.json.Decoder(_PlainParams)
_RESULT = msgspec.json.Decoder(_Result)
_ERROR = msgspec.json.Decoder(_Error)
_ANY = msgspec.json.Decoder(msgspec.Raw)

#: request ids are integers that fit 64 bits (as orjson reads them) or strings
_ID_LOW, _ID_HIGH = -(2**63), 2**64


class Frame(msgspec.Struct, gc=False):
    """What :func:`parse` read of one frame: the routed members, still as text (a struct:
    made once per frame, in C)."""

    text: str
    #: what msgspec reads: the text, or its shifted copy (jsontext.shift)
    _readable: str | bytes
    shifted: bool
    params: _Params | _FlatParams | _PlainParams | None
    result: _Result | None
    data: _Member
    #: members spliced since the frame was read (:meth:`Request.with_param`)
    overrides: dict[tuple[str, ...], Any] | None = None

    def overriding(self, path: tuple[str, ...], value: Any) -> Frame:
        """This frame, with the member at ``path`` read as ``value`` from now on."""
        frame = Frame(self.text, self._readable, self.shifted, self.params, self.result, self.data)
        frame.overrides = {**(self.overrides or {}), path: value}
        return frame

    def whole(self, name: str) -> Any:
        """The top-level member ``name`` (``params``, ``result``) decoded in full, with
        the members spliced since (:meth:`overriding`) set in it."""
        value = self.value(self.lookup((name,)))
        if isinstance(value, dict) and self.overrides:
            value.update({p[1]: v for p, v in self.overrides.items() if p[0] == name})
        return value

    def value(self, raw: str | _Member | _Update | None) -> Any:
        """A member's value (what parse read: a string, or the member's text); None when
        it is absent or cannot be decoded."""
        if type(raw) is str:
            return raw
        if not isinstance(raw, msgspec.Raw):
            return None
        try:
            return jsontext.decode(raw, self.shifted)
        except ValueError:
            return None

    def member(self, path: tuple[str, ...]) -> Any:
        """The value at ``path``: from what parse read, or one more pass for that member."""
        if self.overrides is not None and path in self.overrides:
            return self.overrides[path]
        match path:
            case ("params", "sessionId" | "requestId" as name):
                return self.value(getattr(self.params, name, None))
            case ("params", "update", "sessionUpdate" | "sessionId" as name) if isinstance(
                self.params, _WITH_UPDATE
            ):
                return self.value(getattr(self.params.update, name, None))
            case ("result", "sessionId"):
                return self.value(getattr(self.result, "sessionId", None))
            case ("error", "data"):
                return self.value(self.data)
        return self.value(self.lookup(path))

    def member_is(self, path: tuple[str, ...], value: str) -> bool:
        """Whether the value at ``path`` is the string ``value``. An update's
        ``sessionUpdate`` (asked of every frame an agent streams) is the string parse
        read, compared at once; any other member as :meth:`member` reads it. (Sharing
        :meth:`member`'s lookup of what parse kept cost 4 % of the router's CPU per
        streamed update in the hop bench.)"""
        params = self.params
        if path == UPDATE_KIND and self.overrides is None and type(params) is _Params:
            update = params.update  # _Params is what parse's one pass read: a str or none
            return type(update) is _Update and update.sessionUpdate == value
        return bool(self.member(path) == value)

    def lookup(self, path: tuple[str, ...]) -> msgspec.Raw | None:
        """The text of the member at ``path``, read in one pass that builds nothing else."""
        try:
            found = _path_decoder(path).decode(self._readable)
        except (msgspec.ValidationError, msgspec.DecodeError, RecursionError):
            return None  # something on the path is not an object
        for _ in path:
            if not isinstance(found, msgspec.Struct):
                return None
            found = getattr(found, "member", None)
        return found if isinstance(found, msgspec.Raw) else None


@functools.lru_cache(maxsize=64)
def _path_decoder(path: tuple[str, ...]) -> msgspec.json.Decoder[Any]:
    """A decoder that keeps only the member at ``path`` (the code asks for a few fixed
    paths, so the cache holds them all)."""
    kind: Any = _Member
    for name in reversed(path):
        kind = msgspec.defstruct("Path", [("member", kind, _UNSET)], rename={"member": name})
        kind = kind | msgspec.UnsetType | None
    return msgspec.json.Decoder(kind)


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
            _ENVELOPE.decode(text) if len(text) < 4096 else jsontext.read_plain(_ENVELOPE, text)
        )
    except (msgspec.DecodeError, UnicodeEncodeError, RecursionError):
        return _parse_flat(text)  # odd, invalid or too deep: the slow path says which
    params, result, error = envelope.params, envelope.result, envelope.error
    typed_error = error if type(error) is _TypedError else None
    frame_read = Frame(
        text,
        text,
        False,
        params if type(params) is _Params else None,
        result if type(result) is _Result else None,
        typed_error.data if typed_error is not None else _UNSET,
    )
    method = envelope.method
    request_id = envelope.id
    if type(method) is str and envelope.jsonrpc == "2.0":
        unread = None if params is None or params is _UNSET else UNREAD
        if request_id is _UNSET:
            # a notification (what _classify would make of it): most frames an agent sends
            return Notification(method, unread, text, frame_read)
        known_id = _request_id(request_id)
        if known_id is not None:  # a request (what _classify would make of it)
            return Request(known_id, method, unread, text, frame_read)
    elif method is _UNSET and error is _UNSET and result is not _UNSET:
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
        None if params is None or params is _UNSET else UNREAD,
        result is not _UNSET,
        error is not _UNSET,
        code,
        message,
    )


def _parse_flat(text: str) -> Message:
    """A frame :class:`_Envelope` does not fit: read flat, then each member on its own."""
    try:
        flat, shifted = jsontext.read(_FLAT_ENVELOPE, text)
    except msgspec.ValidationError:
        raise _not_an_object(text) from None
    except ValueError as exc:
        raise _read_error(exc, text) from None
    frame = Frame(text, shifted or text, shifted is not None, None, None, _UNSET)
    frame.params = _object(_FLAT_PARAMS, flat.params) or _object(_PLAIN_PARAMS, flat.params)
    frame.result = _object(_RESULT, flat.result)
    error = _object(_ERROR, flat.error)
    if isinstance(error, _Error):
        frame.data = error.data
    return _classify(
        frame,
        _value_or_unset(frame, flat.jsonrpc),
        _value_or_unset(frame, flat.id),
        _value_or_unset(frame, flat.method),
        _params_kind(flat.params),
        flat.result is not _UNSET,
        flat.error is not _UNSET,
        frame.value(error.code) if error else None,
        frame.value(error.message) if error else None,
    )


def _value_or_unset(frame: Frame, raw: _Member) -> Any:
    return _UNSET if raw is _UNSET else frame.value(raw)


def _params_kind(raw: _Member) -> Params | Unread | msgspec.Raw:
    if not isinstance(raw, msgspec.Raw):
        return None
    first = bytes(memoryview(raw)[:1])
    if first in (b"{", b"["):
        return UNREAD
    return None if bytes(raw) == b"null" else raw


def _object(decoder: msgspec.json.Decoder[Any], raw: _Member) -> Any:
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
        jsontext.read(_ANY, text)
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
    """The message the envelope read (values decoded, ``_UNSET`` where absent; params
    None when absent or null, unread when a container, else its text) is."""
    known_id = _request_id(request_id)
    if jsonrpc != "2.0":
        raise _invalid('"jsonrpc" must be exactly "2.0"', known_id)
    if method is not _UNSET:
        if not isinstance(method, str):
            raise _invalid('"method" must be a string', known_id)
        if isinstance(params, msgspec.Raw):
            raise _invalid('"params" must be an object or an array', known_id)
        if request_id is _UNSET:
            return Notification(method, params, frame.text, frame)
        if known_id is None:
            raise _invalid('"id" must be a string or an integer')
        return Request(known_id, method, params, frame.text, frame)
    if request_id is _UNSET or (known_id is None and request_id is not None):
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
