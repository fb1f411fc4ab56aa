"""JSON-RPC 2.0 envelopes, sans-I/O.

:func:`parse` turns one text frame into a :class:`Request`, :class:`Notification` or
:class:`Response`, or raises a :class:`~router.protocol.errors.ProtocolError`; it never raises
anything else (a Hypothesis test holds it to that). Every parsed message keeps the
frame it came from in ``text``: the router forwards that text, never a re-encoding,
so ``_meta`` and fields it does not know survive the hop byte for byte.

A frame costs what its size says, whatever its shape. :func:`parse` reads the envelope
(``jsonrpc``, ``id``, ``method``) and the few members the router routes on
(``params.sessionId``, ``params.requestId``, ``params.update.sessionUpdate`` and
``.sessionId``, ``result.sessionId``, the error's code and message) in one msgspec pass
that checks the whole frame and builds nothing else (:func:`router.protocol.jsontext.read`).
The rest is decoded only when asked: ``params``, ``result`` and ``error.data`` in full
(the router asks only for the few methods it answers or reads), any other member by its
path (:meth:`Request.member`) in one more pass that again builds only that member.

Every legal JSON text parses, odd ones included (lone surrogate escapes, ``1e400``,
400-digit integers), except JSON nested deeper than about a thousand levels:
:class:`~router.protocol.errors.NestingTooDeep` (-32600, naming the id when it comes
before the nesting). Text no JSON parser accepts is a
:class:`~router.protocol.errors.ParseError`.

The only edits the router makes to a forwarded frame are its top-level ``id`` (agent
requests get router-assigned ids so two agents never collide) and, rarely, one member
of ``params`` (or, sealing session ids, of ``result`` and ``error.data``):
:func:`replace_id`, :func:`replace_param` and :func:`replace_member` splice the new
value into the original text without touching the rest of it. They walk the members
of the objects they change, measuring each value in place at C speed
(:func:`router.protocol.jsontext.value_end`); past :data:`MAX_WALKED_MEMBERS` members
in one object they stop with :class:`~router.protocol.errors.InvalidRequest` rather
than walk on.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Final

import msgspec

from router.protocol import jsontext
from router.protocol.errors import (
    ErrorObject,
    InvalidRequest,
    JsonRpcError,
    NestingTooDeep,
    ParseError,
    ProtocolError,
)
from router.protocol.jsontext import dumps, loads

RequestId = int | str
Params = dict[str, Any] | list[Any] | None

#: The default bound on one frame, on both sides of every hop: the router's
#: ``router.max_message_bytes`` and the reference agent's ``--max-message-bytes``. Equal,
#: so a frame the router accepts from a client is never one its agents refuse.
DEFAULT_MAX_MESSAGE_BYTES = 16 * 1024 * 1024


def reader_limit(max_message_bytes: int) -> int:
    """The ``max_msg_size`` a WebSocket reader gets so that frames of up to
    ``max_message_bytes`` are taken, a frame of exactly the limit included (aiohttp
    refuses a frame of ``max_msg_size`` bytes itself; only larger ones close 1009)."""
    return max_message_bytes + 1


#: Members a splice walks in one object before it gives up (a JSON-RPC envelope has
#: six at most; ACP's params a dozen).
MAX_WALKED_MEMBERS = 4096

# -- what parse reads --------------------------------------------------------------------------

_UNSET: Final = msgspec.UNSET
_Member = msgspec.Raw | msgspec.UnsetType


class _Update(msgspec.Struct):
    sessionUpdate: _Member = _UNSET
    sessionId: _Member = _UNSET


class _Params(msgspec.Struct):
    sessionId: _Member = _UNSET
    requestId: _Member = _UNSET
    update: _Update | msgspec.UnsetType | None = _UNSET


class _PlainParams(msgspec.Struct):
    """:class:`_Params` when ``update`` is not an object."""

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


_ENVELOPE = msgspec.json.Decoder(_Envelope)
_FLAT_ENVELOPE = msgspec.json.Decoder(_FlatEnvelope)
_PARAMS = msgspec.json.Decoder(_Params)
_PLAIN_PARAMS = msgspec.json.Decoder(_PlainParams)
_RESULT = msgspec.json.Decoder(_Result)
_ERROR = msgspec.json.Decoder(_Error)
_ANY = msgspec.json.Decoder(msgspec.Raw)

#: request ids are integers that fit 64 bits (as orjson reads them) or strings
_ID_RANGE = range(-(2**63), 2**64)


class _Unread:
    """A value parse left in the frame's text, decoded on first use."""

    def __repr__(self) -> str:
        return "<unread>"


_UNREAD: Final = _Unread()


class _Frame:
    """What :func:`parse` read of one frame: the routed members, still as text."""

    __slots__ = ("_readable", "data", "overrides", "params", "result", "shifted", "text")

    def __init__(
        self,
        text: str,
        readable: str | bytes,
        shifted: bool,
        params: _Params | _PlainParams | None,
        result: _Result | None,
        data: _Member,
    ) -> None:
        self.text = text
        #: what msgspec reads: the text, or its shifted copy (jsontext.shift)
        self._readable = readable
        self.shifted = shifted
        self.params = params
        self.result = result
        self.data = data
        #: members spliced since the frame was read (:meth:`Request.with_param`)
        self.overrides: dict[tuple[str, ...], Any] | None = None

    def overriding(self, path: tuple[str, ...], value: Any) -> _Frame:
        """This frame, with the member at ``path`` read as ``value`` from now on."""
        frame = _Frame(self.text, self._readable, self.shifted, self.params, self.result, self.data)
        frame.overrides = {**(self.overrides or {}), path: value}
        return frame

    def params_overridden(self) -> dict[str, Any]:
        """The members of ``params`` spliced since the frame was read."""
        return {p[1]: v for p, v in (self.overrides or {}).items() if len(p) == 2}

    def value(self, raw: _Member | _Update | None) -> Any:
        """A member's value; None when it is absent or cannot be decoded."""
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
                self.params, _Params
            ):
                return self.value(getattr(self.params.update, name, None))
            case ("result", "sessionId"):
                return self.value(getattr(self.result, "sessionId", None))
            case ("error", "data"):
                return self.value(self.data)
        return self.value(self.lookup(path))

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


def _walk_values(value: Any, path: tuple[str, ...]) -> Any:
    for name in path:
        value = value.get(name) if isinstance(value, dict) else None
    return value


class Request:
    """A call that wants an answer."""

    __slots__ = ("_frame", "_params", "id", "method", "text")

    def __init__(
        self,
        id: RequestId,
        method: str,
        params: Params | _Unread,
        text: str,
        *,
        frame: _Frame | None = None,
    ) -> None:
        self.id = id
        self.method = method
        self._params = params
        self.text = text
        self._frame = frame

    @property
    def params(self) -> Params:
        """The params, decoded in full (on first use)."""
        return _params_of(self)

    def param(self, name: str) -> Any:
        """``params[name]``; None when absent (or params is not an object)."""
        return self.member("params", name)

    def member(self, *path: str) -> Any:
        """The value at ``path`` (e.g. ``"params", "update", "sessionUpdate"``), decoding
        only that member; None when absent."""
        return _member_of(self, path)

    def with_param(self, name: str, value: Any) -> Request:
        """This request with ``params[name]`` (a member parse found in it) spliced to
        ``value``, the rest byte for byte; not parsed again: the parsed fields are the
        old ones, that member the new value."""
        text = replace_parsed_member(self.text, ("params", name), value)
        params, frame = _with_param(self, name, value)
        return Request(self.id, self.method, params, text, frame=frame)

    def with_text(self, text: str) -> Request:
        """This request, as parsed, sent as ``text`` (the caller's edit of it)."""
        return Request(self.id, self.method, self._params, text, frame=self._frame)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Request):
            return NotImplemented
        return (self.id, self.method, self.text, self.params) == (
            other.id,
            other.method,
            other.text,
            other.params,
        )

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Request(id={self.id!r}, method={self.method!r}, text={_short(self.text)})"


class Notification:
    """A call that wants no answer."""

    __slots__ = ("_frame", "_params", "method", "text")

    def __init__(
        self, method: str, params: Params | _Unread, text: str, *, frame: _Frame | None = None
    ) -> None:
        self.method = method
        self._params = params
        self.text = text
        self._frame = frame

    @property
    def params(self) -> Params:
        """The params, decoded in full (on first use)."""
        return _params_of(self)

    def param(self, name: str) -> Any:
        """``params[name]``; None when absent (or params is not an object)."""
        return self.member("params", name)

    def member(self, *path: str) -> Any:
        """The value at ``path``, decoding only that member; None when absent."""
        return _member_of(self, path)

    def with_param(self, name: str, value: Any) -> Notification:
        """This notification with ``params[name]`` spliced to ``value`` (as
        :meth:`Request.with_param`: not parsed again)."""
        text = replace_parsed_member(self.text, ("params", name), value)
        params, frame = _with_param(self, name, value)
        return Notification(self.method, params, text, frame=frame)

    def with_text(self, text: str) -> Notification:
        """This notification, as parsed, sent as ``text`` (the caller's edit of it)."""
        return Notification(self.method, self._params, text, frame=self._frame)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Notification):
            return NotImplemented
        return (self.method, self.text, self.params) == (other.method, other.text, other.params)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Notification(method={self.method!r}, text={_short(self.text)})"


class Response:
    """An answer: a result, or an error."""

    __slots__ = ("_error", "_frame", "_result", "id", "text")

    def __init__(
        self,
        id: RequestId | None,
        result: Any,
        error: ErrorObject | tuple[int, str] | None,
        text: str,
        *,
        frame: _Frame | None = None,
    ) -> None:
        self.id = id
        self._result = result
        #: an error read by parse is (code, message) until its data is asked for
        self._error = error
        self.text = text
        self._frame = frame

    @property
    def ok(self) -> bool:
        return self._error is None

    @property
    def result(self) -> Any:
        """The result, decoded in full (on first use); None for an error."""
        if isinstance(self._result, _Unread):
            assert self._frame is not None
            self._result = self._frame.value(self._frame.lookup(("result",)))
        return self._result

    @property
    def error(self) -> ErrorObject | None:
        if isinstance(self._error, tuple):
            assert self._frame is not None
            code, message = self._error
            self._error = ErrorObject(code, message, self._frame.member(("error", "data")))
        return self._error

    def with_text(self, text: str) -> Response:
        """This response, as parsed, sent as ``text`` (the caller's edit of it)."""
        return Response(self.id, self._result, self._error, text, frame=self._frame)

    def member(self, *path: str) -> Any:
        """The value at ``path`` (e.g. ``"result", "sessionId"``), decoding only that
        member; None when absent."""
        if self._frame is not None:
            return self._frame.member(path)
        top = {"result": self.result, "error": _error_dict(self.error)}
        return _walk_values(top, path)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Response):
            return NotImplemented
        return (self.id, self.text, self.result, self.error) == (
            other.id,
            other.text,
            other.result,
            other.error,
        )

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Response(id={self.id!r}, ok={self.ok}, text={_short(self.text)})"


Message = Request | Notification | Response


def _params_of(call: Request | Notification) -> Params:
    if isinstance(call._params, _Unread):
        assert call._frame is not None
        value = call._frame.value(call._frame.lookup(("params",)))
        if isinstance(value, dict):
            value.update(call._frame.params_overridden())
        call._params = value if isinstance(value, dict | list) else None
    return call._params


def _with_param(
    call: Request | Notification, name: str, value: Any
) -> tuple[Params | _Unread, _Frame | None]:
    """The parsed params of ``call`` with ``params[name]`` set to ``value``: the decoded
    params with it set, or the frame with that member read as ``value``."""
    if isinstance(call._params, dict):
        return {**call._params, name: value}, call._frame
    if call._frame is not None and isinstance(call._params, _Unread):
        return call._params, call._frame.overriding(("params", name), value)
    return call._params, call._frame


def _member_of(call: Request | Notification, path: tuple[str, ...]) -> Any:
    if call._frame is not None and isinstance(call._params, _Unread):
        return call._frame.member(path)
    return _walk_values({"params": call.params}, path)


def _error_dict(error: ErrorObject | None) -> dict[str, Any] | None:
    if error is None:
        return None
    return {"code": error.code, "message": error.message, "data": error.data}


def _short(text: str) -> str:
    return repr(text if len(text) <= 80 else text[:77] + "...")


def is_request_id(value: object) -> bool:
    """True for the ids JSON-RPC requests may carry here: integers and strings.

    ``bool`` is excluded (it is an ``int`` in Python, not in JSON); so are null and
    fractional numbers, which JSON-RPC discourages and ACP clients never send.
    """
    return isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool))


# -- parse ---------------------------------------------------------------------------------------


def parse(frame: str | bytes) -> Message:
    """Parse one frame. Raises :class:`ParseError` or :class:`InvalidRequest` only."""
    try:
        text = frame if isinstance(frame, str) else frame.decode()
    except UnicodeDecodeError as exc:
        raise ParseError(f"Parse error: {exc}") from None
    try:
        envelope = (
            _ENVELOPE.decode(text) if len(text) < 4096 else jsontext.read_plain(_ENVELOPE, text)
        )
    except (msgspec.DecodeError, UnicodeEncodeError, RecursionError):
        return _parse_flat(text)  # odd, invalid or too deep: the slow path says which
    params, result, error = envelope.params, envelope.result, envelope.error
    frame_read = _Frame(
        text,
        text,
        False,
        params if isinstance(params, _Params) else None,
        result if isinstance(result, _Result) else None,
        error.data if isinstance(error, _TypedError) else _UNSET,
    )
    method = envelope.method
    if envelope.id is _UNSET and type(method) is str and envelope.jsonrpc == "2.0":
        # a notification (what _classify would make of it): most frames an agent sends
        unread = None if params is None or params is _UNSET else _UNREAD
        return Notification(method, unread, text, frame=frame_read)
    code: Any = None
    message: Any = None
    if isinstance(error, _TypedError):
        code, message = error.code, error.message
    return _classify(
        frame_read,
        envelope.jsonrpc,
        envelope.id,
        envelope.method,
        None if params is None or params is _UNSET else _UNREAD,
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
        raise _refusal(exc, text) from None
    frame = _Frame(text, shifted or text, shifted is not None, None, None, _UNSET)
    frame.params = _object(_PARAMS, flat.params) or _object(_PLAIN_PARAMS, flat.params)
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


def _value_or_unset(frame: _Frame, raw: _Member) -> Any:
    return _UNSET if raw is _UNSET else frame.value(raw)


def _params_kind(raw: _Member) -> Params | _Unread | msgspec.Raw:
    if not isinstance(raw, msgspec.Raw):
        return None
    first = bytes(memoryview(raw)[:1])
    if first in (b"{", b"["):
        return _UNREAD
    return None if bytes(raw) == b"null" else raw


def _object(decoder: msgspec.json.Decoder[Any], raw: _Member) -> Any:
    """``raw`` read by ``decoder``; None when it is not an object of that shape."""
    if not isinstance(raw, msgspec.Raw):
        return None
    try:
        return decoder.decode(raw)
    except (msgspec.ValidationError, msgspec.DecodeError, RecursionError):
        return None


def _refusal(exc: ValueError, text: str) -> ProtocolError:
    """The error for a frame :func:`jsontext.read` refused."""
    if isinstance(exc, jsontext.TooDeep):
        return _invalid(f"{exc}: not read", _readable_id(text), NestingTooDeep)
    if isinstance(exc, jsontext.NotReadable):
        return _invalid(str(exc), _readable_id(text))
    return ParseError(f"Parse error: {exc}")


def _not_an_object(text: str) -> ProtocolError:
    """Why a frame that is JSON but not an object is refused (or not JSON at all)."""
    try:
        jsontext.read(_ANY, text)
    except ValueError as exc:
        return _refusal(exc, text)
    if text.lstrip(" \t\r\n").startswith("["):
        return _invalid("Batches are not supported: send one JSON-RPC message per frame")
    return _invalid("A JSON-RPC message must be a JSON object")


def _classify(
    frame: _Frame,
    jsonrpc: Any,
    request_id: Any,
    method: Any,
    params: Params | _Unread | msgspec.Raw,
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
            return Notification(method, params, frame.text, frame=frame)
        if known_id is None:
            raise _invalid('"id" must be a string or an integer')
        return Request(known_id, method, params, frame.text, frame=frame)
    if request_id is _UNSET or (known_id is None and request_id is not None):
        raise _invalid('a message without "method" is a response and needs a valid "id"')
    if has_result == has_error:
        raise _invalid('a response has exactly one of "result" and "error"', known_id)
    if has_result:
        return Response(known_id, _UNREAD, None, frame.text, frame=frame)
    if not isinstance(code, int) or isinstance(code, bool) or not isinstance(message, str):
        raise _invalid('"error" must be an object with an integer code and a string message')
    return Response(known_id, None, (code, message), frame.text, frame=frame)


def _request_id(value: Any) -> RequestId | None:
    if isinstance(value, str):
        return value
    if isinstance(value, int) and not isinstance(value, bool) and value in _ID_RANGE:
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


# -- building frames ---------------------------------------------------------------------------


def encode_request(request_id: RequestId, method: str, params: Params = None) -> str:
    obj: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": method}
    if params is not None:
        obj["params"] = params
    return dumps(obj)


@dataclass(frozen=True, slots=True)
class RequestTemplate:
    """One request encoded once for many integer ids (a probe fan-out sends the same
    request to every backend): :meth:`encode` splices the id in, byte for byte what
    :func:`encode_request` would make."""

    head: str
    tail: str

    @classmethod
    def of(cls, method: str, params: Params = None) -> RequestTemplate:
        body = dumps({"method": method} if params is None else {"method": method, "params": params})
        return cls('{"jsonrpc":"2.0","id":', "," + body[1:])

    def encode(self, request_id: int) -> str:
        return f"{self.head}{request_id}{self.tail}"


def encode_notification(method: str, params: Params = None) -> str:
    obj: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
    if params is not None:
        obj["params"] = params
    return dumps(obj)


def encode_result(request_id: RequestId, result: Any) -> str:
    return dumps({"jsonrpc": "2.0", "id": request_id, "result": result})


def encode_error(request_id: RequestId | None, error: JsonRpcError | ErrorObject) -> str:
    """An error response; ``error`` is the router's, or one a peer answered."""
    body = error.to_error() if isinstance(error, JsonRpcError) else _error_object(error)
    return dumps({"jsonrpc": "2.0", "id": request_id, "error": body})


def _error_object(error: ErrorObject) -> dict[str, Any]:
    body: dict[str, Any] = {"code": error.code, "message": error.message}
    if error.data is not None:
        body["data"] = error.data
    return body


def encode_protocol_error(error: ProtocolError) -> str:
    """The reply to a frame :func:`parse` rejected (id null unless it could be read)."""
    return encode_error(error.request_id, error)


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
        raise _invalid(f"more than {MAX_WALKED_MEMBERS} members in one object: not spliced")

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


def replace_id(text: str, new_id: RequestId) -> str:
    """Return ``text`` with the value of its top-level ``"id"`` member(s) replaced.

    ``text`` must be a JSON object that :func:`parse` accepted. Everything else in the
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
    request). ``text`` must be a JSON object that :func:`parse` accepted; a member
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

    ``text`` must be a frame :func:`parse` accepted; a path that leads nowhere (or
    through something that is not an object) leaves it as it was. As in
    :func:`replace_id`, the walk stops after a match unless the key could come again,
    so a large value after the match (a prompt, a tool call's output) is never walked.
    """
    walk = _Walk(text)
    encoded = dumps(value).encode()
    return walk.edited((s, e, encoded) for s, e in walk.path_spans(walk.top(), path))


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
