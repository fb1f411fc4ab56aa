"""JSON-RPC 2.0 messages, sans-I/O: :class:`Request`, :class:`Notification` and
:class:`Response`, each with the text of the frame it came in (the router forwards that
text, never a re-encoding, so ``_meta`` and fields it does not know survive the hop byte
for byte), and the encoders of the frames the router makes itself.

:func:`router.protocol.reading.parse` makes the messages from text, reading only what the
router routes on; the rest of a message is decoded when asked (:meth:`Request.member`,
:attr:`Request.params`). :mod:`router.protocol.splice` edits a frame's text in place.
docs/architecture.md, "Frames", says why.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final, Protocol, final

import msgspec

from router.protocol.errors import ErrorObject, JsonRpcError, ProtocolError
from router.protocol.jsontext import dumps
from router.protocol.splice import replace_parsed_member

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


class Unread:
    """A value the parser left in the frame's text, decoded on first use."""

    def __repr__(self) -> str:
        return "<unread>"


UNREAD: Final = Unread()

#: where a ``session/update`` names what it is (``params.update.sessionUpdate``)
UPDATE_KIND: Final = ("params", "update", "sessionUpdate")


class Members(Protocol):
    """What a parser kept of a frame (:class:`router.protocol.reading.Frame`), to read
    members from on demand."""

    def member(self, path: tuple[str, ...]) -> Any:
        """The value at ``path``; None when absent."""

    def whole(self, name: str) -> Any:
        """The top-level member ``name`` decoded in full."""

    def member_is(self, path: tuple[str, ...], value: str) -> bool:
        """Whether the value at ``path`` is the string ``value``."""

    def overriding(self, path: tuple[str, ...], value: Any) -> Members:
        """The same frame, with the member at ``path`` read as ``value``."""


def walk_values(value: Any, path: tuple[str, ...]) -> Any:
    for name in path:
        value = value.get(name) if isinstance(value, dict) else None
    return value


@final  # nothing subclasses it: the router may ask type(m) is Request
class Request(msgspec.Struct):
    """A call that wants an answer: ``Request(id, method, params, text, frame)``, params
    unread when ``frame`` (what parse kept) has them (a struct: made in C, once for
    every request a client sends)."""

    id: RequestId
    method: str
    _params: Params | Unread
    text: str
    _frame: Members | None = None

    @property
    def params(self) -> Params:
        """The params, decoded in full (on first use)."""
        return _params_of(self)

    def param(self, name: str) -> Any:
        """``params[name]``; None when absent (or params is not an object)."""
        return _member_of(self, ("params", name))

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
        return Request(self.id, self.method, params, text, frame)

    def with_text(self, text: str) -> Request:
        """This request, as parsed, sent as ``text`` (the caller's edit of it)."""
        return Request(self.id, self.method, self._params, text, self._frame)

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


@final
class Notification(msgspec.Struct):
    """A call that wants no answer: ``Notification(method, params, text, frame)`` (a
    struct, as :class:`Request` is: one for every update an agent streams)."""

    method: str
    _params: Params | Unread
    text: str
    _frame: Members | None = None

    @property
    def params(self) -> Params:
        """The params, decoded in full (on first use)."""
        return _params_of(self)

    def param(self, name: str) -> Any:
        """``params[name]``; None when absent (or params is not an object)."""
        return _member_of(self, ("params", name))

    def member(self, *path: str) -> Any:
        """The value at ``path``, decoding only that member; None when absent."""
        return _member_of(self, path)

    def member_is(self, path: tuple[str, ...], value: str) -> bool:
        """Whether the value at ``path`` is the string ``value`` (its text compared as it
        came where it can be: nothing decoded for a frame's most read member)."""
        if self._frame is not None and isinstance(self._params, Unread):
            return self._frame.member_is(path, value)
        return bool(_member_of(self, path) == value)

    def with_param(self, name: str, value: Any) -> Notification:
        """This notification with ``params[name]`` spliced to ``value`` (as
        :meth:`Request.with_param`: not parsed again)."""
        text = replace_parsed_member(self.text, ("params", name), value)
        params, frame = _with_param(self, name, value)
        return Notification(self.method, params, text, frame)

    def with_text(self, text: str) -> Notification:
        """This notification, as parsed, sent as ``text`` (the caller's edit of it)."""
        return Notification(self.method, self._params, text, self._frame)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Notification):
            return NotImplemented
        return (self.method, self.text, self.params) == (other.method, other.text, other.params)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Notification(method={self.method!r}, text={_short(self.text)})"


@final
class Response:
    """An answer: a result, or an error."""

    __slots__ = ("_error", "_frame", "_result", "id", "ok", "text")

    def __init__(
        self,
        id: RequestId | None,
        result: Any,
        error: ErrorObject | tuple[int, str] | None,
        text: str,
        frame: Members | None = None,
    ) -> None:
        self.id = id
        self._result = result
        #: an error read by parse is (code, message) until its data is asked for
        self._error = error
        #: a result, not an error (an attribute: the router asks it of every answer)
        self.ok = error is None
        self.text = text
        self._frame = frame

    @property
    def result(self) -> Any:
        """The result, decoded in full (on first use); None for an error."""
        if isinstance(self._result, Unread):
            assert self._frame is not None
            self._result = self._frame.whole("result")
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
        return walk_values(top, path)

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
    if isinstance(call._params, Unread):
        assert call._frame is not None
        value = call._frame.whole("params")
        call._params = value if isinstance(value, dict | list) else None
    return call._params


def _with_param(
    call: Request | Notification, name: str, value: Any
) -> tuple[Params | Unread, Members | None]:
    """The parsed params of ``call`` with ``params[name]`` set to ``value``: the decoded
    params with it set, or the frame with that member read as ``value``."""
    if isinstance(call._params, dict):
        return {**call._params, name: value}, call._frame
    if call._frame is not None and isinstance(call._params, Unread):
        return call._params, call._frame.overriding(("params", name), value)
    return call._params, call._frame


def _member_of(call: Request | Notification, path: tuple[str, ...]) -> Any:
    if call._frame is not None and isinstance(call._params, Unread):
        return call._frame.member(path)
    return walk_values({"params": call.params}, path)


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
    """The reply to a frame :func:`~router.protocol.reading.parse` rejected (id null unless it could be read)."""
    return encode_error(error.request_id, error)
