"""What :func:`router.protocol.reading.parse` reads of one frame, and reads of it later: the
typed shapes msgspec decodes the envelope into in its one pass, and :class:`Frame`, the
routed members kept as text, each decoded only when asked.

These are msgspec structs, in a module of their own: :mod:`router.protocol.reading` is
compiled with mypyc (:mod:`router.native`), which cannot compile a msgspec struct (it
would give msgspec its own annotations, not these).
"""

from __future__ import annotations

import functools
from typing import Any, Final

import msgspec

from router.protocol import jsontext
from router.protocol.jsonrpc import UPDATE_KIND

UNSET: Final = msgspec.UNSET
Member = msgspec.Raw | msgspec.UnsetType


class ReadUpdate(msgspec.Struct):
    """An update, as parse reads it in its one pass: its kind (asked of every update an
    agent streams) as the string it must be, or null; any other value of it is left to
    :class:`FlatUpdate`."""

    sessionUpdate: str | msgspec.UnsetType | None = UNSET
    sessionId: Member = UNSET


class FlatUpdate(msgspec.Struct):
    """:class:`ReadUpdate` with every member unread."""

    sessionUpdate: Member = UNSET
    sessionId: Member = UNSET


class ReadParams(msgspec.Struct):
    """The params parse reads in its one pass: ``sessionId`` (asked of nearly every
    request) as the string it must be, or null; any other value of it is left to
    :class:`FlatParams`."""

    sessionId: str | msgspec.UnsetType | None = UNSET
    requestId: Member = UNSET
    update: ReadUpdate | msgspec.UnsetType | None = UNSET


class FlatParams(msgspec.Struct):
    """:class:`ReadParams` with every member unread (a frame :class:`Envelope` does not fit)."""

    sessionId: Member = UNSET
    requestId: Member = UNSET
    update: FlatUpdate | msgspec.UnsetType | None = UNSET


class PlainParams(msgspec.Struct):
    """:class:`FlatParams` when ``update`` is not an object."""

    sessionId: Member = UNSET
    requestId: Member = UNSET


class ReadResult(msgspec.Struct):
    sessionId: Member = UNSET


class FlatError(msgspec.Struct):
    code: Member = UNSET
    message: Member = UNSET
    data: Member = UNSET


class ReadError(msgspec.Struct):
    code: int | msgspec.UnsetType = UNSET
    message: str | msgspec.UnsetType = UNSET
    data: Member = UNSET


class Envelope(msgspec.Struct):
    """Everything parse reads, typed, in one pass: what the common frame is (params and
    result objects or null, an integer or string id, a well-formed error)."""

    jsonrpc: str | msgspec.UnsetType = UNSET
    id: int | str | msgspec.UnsetType | None = UNSET
    method: str | msgspec.UnsetType = UNSET
    params: ReadParams | msgspec.UnsetType | None = UNSET
    result: ReadResult | msgspec.UnsetType | None = UNSET
    error: ReadError | msgspec.UnsetType | None = UNSET


class FlatEnvelope(msgspec.Struct):
    """The envelope with every member unread, for frames :class:`Envelope` does not fit
    (or cannot read: lone surrogate escapes, deep nesting); then each is read on its own."""

    jsonrpc: Member = UNSET
    id: Member = UNSET
    method: Member = UNSET
    params: Member = UNSET
    result: Member = UNSET
    error: Member = UNSET


#: the params that may hold an update (a tuple built once: ``A | B`` builds a union per call)
_WITH_UPDATE: Final = (ReadParams, FlatParams)

ENVELOPE = msgspec.json.Decoder(Envelope)
FLAT_ENVELOPE = msgspec.json.Decoder(FlatEnvelope)
FLAT_PARAMS = msgspec.json.Decoder(FlatParams)
PLAIN_PARAMS = msgspec.json.Decoder(PlainParams)
RESULT = msgspec.json.Decoder(ReadResult)
ERROR = msgspec.json.Decoder(FlatError)
ANY = msgspec.json.Decoder(msgspec.Raw)


class Frame(msgspec.Struct, gc=False):
    """What :func:`parse` read of one frame: the routed members, still as text (a struct:
    made once per frame, in C)."""

    text: str
    #: what msgspec reads: the text, or its shifted copy (jsontext.shift)
    _readable: str | bytes
    shifted: bool
    params: ReadParams | FlatParams | PlainParams | None
    result: ReadResult | None
    data: Member
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

    def value(self, raw: str | Member | ReadUpdate | None) -> Any:
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
        if path == UPDATE_KIND and self.overrides is None and type(params) is ReadParams:
            update = params.update  # ReadParams is what parse's one pass read: a str or none
            return type(update) is ReadUpdate and update.sessionUpdate == value
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
    kind: Any = Member
    for name in reversed(path):
        kind = msgspec.defstruct("Path", [("member", kind, UNSET)], rename={"member": name})
        kind = kind | msgspec.UnsetType | None
    return msgspec.json.Decoder(kind)
