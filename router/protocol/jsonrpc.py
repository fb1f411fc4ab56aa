"""JSON-RPC 2.0 envelopes, sans-I/O.

:func:`parse` turns one text frame into a :class:`Request`, :class:`Notification` or
:class:`Response`, or raises a :class:`~router.protocol.errors.ProtocolError`; it never raises
anything else (a Hypothesis test holds it to that). Every parsed message keeps the
frame it came from in ``text``: the router forwards that text, never a re-encoding,
so ``_meta`` and fields it does not know survive the hop byte for byte.

Every legal JSON text parses, odd ones included (lone surrogate escapes, ``1e400``,
deep nesting: see :mod:`router.protocol.jsontext`); only text no JSON parser accepts
is a :class:`~router.protocol.errors.ParseError`.

The only edits the router makes to a forwarded frame are its top-level ``id`` (agent
requests get router-assigned ids so two agents never collide) and, rarely, one member
of ``params``: :func:`replace_id` and :func:`replace_param` splice the new value into
the original text without touching the rest of it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from router.protocol.errors import InvalidRequest, JsonRpcError, ParseError, ProtocolError
from router.protocol.jsontext import dumps, loads

RequestId = int | str
Params = dict[str, Any] | list[Any] | None

#: The default bound on one frame, on both sides of every hop: the router's
#: ``router.max_message_bytes`` and the reference agent's ``--max-message-bytes``. Equal,
#: so a frame the router accepts from a client is never one its agents refuse.
DEFAULT_MAX_MESSAGE_BYTES = 16 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class Request:
    id: RequestId
    method: str
    params: Params
    text: str

    def param(self, name: str) -> Any:
        return _param(self.params, name)


@dataclass(frozen=True, slots=True)
class Notification:
    method: str
    params: Params
    text: str

    def param(self, name: str) -> Any:
        return _param(self.params, name)


@dataclass(frozen=True, slots=True)
class ErrorObject:
    code: int
    message: str
    data: Any = None


@dataclass(frozen=True, slots=True)
class Response:
    id: RequestId | None
    result: Any
    error: ErrorObject | None
    text: str

    @property
    def ok(self) -> bool:
        return self.error is None


Message = Request | Notification | Response


def _param(params: Params, name: str) -> Any:
    return params.get(name) if isinstance(params, dict) else None


def is_request_id(value: object) -> bool:
    """True for the ids JSON-RPC requests may carry here: integers and strings.

    ``bool`` is excluded (it is an ``int`` in Python, not in JSON); so are null and
    fractional numbers, which JSON-RPC discourages and ACP clients never send.
    """
    return isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool))


def parse(frame: str | bytes) -> Message:
    """Parse one frame. Raises :class:`ParseError` or :class:`InvalidRequest` only."""
    try:
        obj = loads(frame)
    except ValueError as exc:
        raise ParseError(f"Parse error: {exc}") from None
    if isinstance(obj, list):
        raise _invalid("Batches are not supported: send one JSON-RPC message per frame")
    if not isinstance(obj, dict):
        raise _invalid("A JSON-RPC message must be a JSON object")
    text = frame if isinstance(frame, str) else frame.decode()
    raw_id = obj.get("id")
    known_id = raw_id if is_request_id(raw_id) else None
    if obj.get("jsonrpc") != "2.0":
        raise _invalid('"jsonrpc" must be exactly "2.0"', known_id)
    if "method" in obj:
        return _parse_call(obj, text, known_id)
    return _parse_response(obj, text, known_id)


def _parse_call(obj: dict[str, Any], text: str, known_id: RequestId | None) -> Message:
    method = obj["method"]
    if not isinstance(method, str):
        raise _invalid('"method" must be a string', known_id)
    params = obj.get("params")
    if params is not None and not isinstance(params, dict | list):
        raise _invalid('"params" must be an object or an array', known_id)
    if "id" not in obj:
        return Notification(method, params, text)
    if known_id is None:
        raise _invalid('"id" must be a string or an integer')
    return Request(known_id, method, params, text)


def _parse_response(obj: dict[str, Any], text: str, known_id: RequestId | None) -> Response:
    if "id" not in obj or (obj["id"] is not None and known_id is None):
        raise _invalid('a message without "method" is a response and needs a valid "id"')
    if ("result" in obj) == ("error" in obj):
        raise _invalid('a response has exactly one of "result" and "error"', known_id)
    if "result" in obj:
        return Response(known_id, obj["result"], None, text)
    error = obj["error"]
    if (
        not isinstance(error, dict)
        or not isinstance(error.get("code"), int)
        or isinstance(error.get("code"), bool)
        or not isinstance(error.get("message"), str)
    ):
        raise _invalid('"error" must be an object with an integer code and a string message')
    return Response(
        known_id, None, ErrorObject(error["code"], error["message"], error.get("data")), text
    )


def _invalid(message: str, request_id: RequestId | None = None) -> InvalidRequest:
    exc = InvalidRequest(message)
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


# -- splicing values into original text----------------------------------------------------------

# A JSON string, "unrolled" so the regex engine eats runs of plain characters at once;
# and one token (a string or a bracket): enough to walk valid JSON without decoding it.
_STRING_BODY = r'"[^"\\]*(?:\\.[^"\\]*)*"'
_STRING = re.compile(_STRING_BODY, re.DOTALL)
_TOKEN = re.compile(_STRING_BODY + r"|[{}\[\]]", re.DOTALL)
_SCALAR_END = re.compile(r"[\s,}\]]")
_SPACE = re.compile(r"\s*")
# Where another key could start: the plain key (a str.find), or any \u escape (which could
# spell it). Two literal searches: an alternation in one pattern scans ten times slower.
_ESCAPE_U = re.compile(r"\\u")


def replace_id(text: str, new_id: RequestId) -> str:
    """Return ``text`` with the value of its top-level ``"id"`` member(s) replaced.

    ``text`` must be a JSON object that :func:`parse` accepted. Everything else in the
    frame (spacing, key order, ``_meta``, unknown fields) stays exactly as it was.

    Senders put ``"id"`` near the front, so the walk usually stops there and the cost
    does not grow with the payload: it goes on only when the rest of the frame could
    hold the key again (a plain ``"id"`` or an escape), so a frame repeating the key
    cannot keep an id of its own past the router.
    """
    return _splice(text, _top_level_ids(text), dumps(new_id))


def replace_param(text: str, name: str, value: Any) -> str:
    """Return ``text`` with ``params[name]`` set to ``value``, the rest byte for byte.

    For the rare rewrite inside ``params`` (a ``$/cancel_request`` naming an agent
    request). ``text`` must be a JSON object that :func:`parse` accepted; a member
    ``params`` lacks is added first in it, and a ``params`` that is not an object (or
    is missing) becomes ``{name: value}``. Repeated keys are all rewritten, as in
    :func:`replace_id`.
    """
    member = f"{dumps(name)}:{dumps(value)}"
    top = _skip_space(text, 0)
    params = [
        (start, _value_end(text, start))
        for key, start in _members(text, top)
        if _key_is(key, "params")
    ]
    if not params:
        return _insert_member(text, top, f'"params":{{{member}}}')
    out: list[str] = []
    last = 0
    for start, end in params:
        out += (text[last:start], _with_member(text[start:end], name, value, member))
        last = end
    out.append(text[last:])
    return "".join(out)


def _with_member(obj: str, name: str, value: Any, member: str) -> str:
    """The JSON value ``obj`` made an object whose ``name`` member is ``value``."""
    if not obj.startswith("{"):
        return "{" + member + "}"
    spans = [
        (start, _value_end(obj, start)) for key, start in _members(obj, 0) if _key_is(key, name)
    ]
    if not spans:
        return _insert_member(obj, 0, member)
    return _splice(obj, spans, dumps(value))


def _insert_member(text: str, brace: int, member: str) -> str:
    """``text`` with ``member`` first in the object opening at ``brace``."""
    empty = text[_skip_space(text, brace + 1)] == "}"
    return text[: brace + 1] + member + ("" if empty else ",") + text[brace + 1 :]


def _splice(text: str, spans: Iterable[tuple[int, int]], encoded: str) -> str:
    out: list[str] = []
    last = 0
    for start, end in spans:
        out += (text[last:start], encoded)
        last = end
    out.append(text[last:])
    return "".join(out)


def _top_level_ids(text: str) -> Iterator[tuple[int, int]]:
    """Spans of the values of the object's top-level ``"id"`` members."""
    return _path_spans(text, _skip_space(text, 0), ("id",))


def replace_member(text: str, path: tuple[str, ...], value: Any) -> str:
    """Return ``text`` with the value at ``path`` (e.g. ``("params", "sessionId")``)
    replaced wherever the path leads, repeated keys included; the rest byte for byte.

    ``text`` must be a frame :func:`parse` accepted; a path that leads nowhere (or
    through something that is not an object) leaves it as it was. As in
    :func:`replace_id`, the walk stops after a match unless the key could come again,
    so a large value after the match (a prompt, a tool call's output) is never walked.
    """
    return _splice(text, _path_spans(text, _skip_space(text, 0), path), dumps(value))


def replace_parsed_member(text: str, path: tuple[str, ...], value: Any) -> str:
    """:func:`replace_member` for a path the caller has parsed and found in the frame.

    The common frame spells the path's last key once, plainly, with no ``\\u`` escape
    anywhere: then that one spelling is the member (a value or an escaped quote cannot
    spell ``"key"`` followed by ``:`` without a second, real spelling), and its value is
    spliced without walking the frame. Any other frame takes the full walk.
    """
    quoted = f'"{path[-1]}"'
    at = text.find(quoted)
    if at < 0 or text.find(quoted, at + 1) >= 0 or _ESCAPE_U.search(text) is not None:
        return replace_member(text, path, value)
    colon = _skip_space(text, at + len(quoted))
    if text[colon] != ":":
        return replace_member(text, path, value)
    start = _skip_space(text, colon + 1)
    return _splice(text, [(start, _value_end(text, start))], dumps(value))


def _path_spans(text: str, brace: int, path: tuple[str, ...]) -> Iterator[tuple[int, int]]:
    name, rest = path[0], path[1:]
    for key, start in _members(text, brace):
        if _key_is(key, name):
            if not rest:
                yield start, _value_end(text, start)
            elif text[start] == "{":
                yield from _path_spans(text, start, rest)
            if not _may_repeat(text, start + 1, name):
                return


def _members(text: str, brace: int) -> Iterator[tuple[str, int]]:
    """Key token and value start of each member of the object at ``brace``; a value is
    measured only when the caller asks for the next member."""
    i = brace + 1
    while True:
        i = _skip_space(text, i)
        if text[i] == "}":
            return
        if text[i] == ",":
            i = _skip_space(text, i + 1)
        key_match = _STRING.match(text, i)
        assert key_match is not None, "splicing needs a frame parse() accepted"
        i = _skip_space(text, key_match.end()) + 1  # past ":"
        start = _skip_space(text, i)
        yield key_match.group(), start
        i = _value_end(text, start)


def _key_is(token: str, name: str) -> bool:
    """Whether the JSON string ``token`` spells ``name`` (escapes included)."""
    return token[1:-1] == name or ("\\" in token and loads(token) == name)


def _may_repeat(text: str, start: int, name: str) -> bool:
    """Whether a ``name`` key could come after ``start``: spelled plainly, or behind any
    ``\\u`` escape (which could spell it)."""
    if text.find(f'"{name}"', start) >= 0:
        return True
    return text.find("\\", start) >= 0 and _ESCAPE_U.search(text, start) is not None


def _skip_space(text: str, i: int) -> int:
    if text[i] not in " \t\r\n":  # compact JSON: no regex call at all
        return i
    match = _SPACE.match(text, i)
    return match.end() if match else i


def _value_end(text: str, start: int) -> int:
    first = text[start]
    if first == '"':
        match = _STRING.match(text, start)
        assert match is not None
        return match.end()
    if first not in "{[":
        match = _SCALAR_END.search(text, start)
        return match.start() if match else len(text)
    depth = 0
    for token in _TOKEN.finditer(text, start):
        kind = token.group()
        if kind in ("{", "["):
            depth += 1
        elif kind in ("}", "]"):
            depth -= 1
            if depth == 0:
                return token.end()
    raise AssertionError("unbalanced JSON value")  # parse() accepted it, so this cannot happen
