"""W3C Trace Context, sans-I/O: reading and writing a ``traceparent``.

A client may send a request inside a trace by putting the W3C Trace Context of its own
span in the request's ``params._meta`` (``traceparent``, and ``tracestate`` and
``baggage`` beside it), as ACP's meta propagation and MCP do. The router continues that
trace: it reads the client's ``traceparent`` here (:func:`parse_traceparent`), starts
its own span as its child, and passes the backend a ``traceparent`` naming that span
(:attr:`TraceContext.traceparent`), spliced into the frame in place; ``tracestate`` and
``baggage`` travel as they came (docs/operations.md, "Trace context").

:func:`parse_traceparent` is total: any value in, a :class:`TraceContext` or None out (a
Hypothesis test holds it to that). It keeps the W3C rules: lowercase hex only, trace
and parent ids not all zeros, version ``ff`` refused, a version ``00`` value exactly 55
characters, a later version read by its first four fields (anything after them must
follow a ``-``). The ids are made by the shell; nothing here is random.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

#: where the W3C members travel in a JSON-RPC request
META: Final = "_meta"
TRACEPARENT: Final = "traceparent"
TRACEPARENT_PATH: Final = ("params", META, TRACEPARENT)

#: the flag a trace's sender sets when it records the trace (W3C: ``sampled``)
SAMPLED: Final = 0x01
#: the flags this version of the format defines (``sampled``, and Level 2's ``random``);
#: the rest are sent as zeros
KNOWN_FLAGS: Final = 0x03

_VERSION_00_LENGTH: Final = 55
_FIELDS = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?", re.DOTALL)
_ZERO_TRACE: Final = "0" * 32
_ZERO_SPAN: Final = "0" * 16


@dataclass(frozen=True, slots=True)
class TraceContext:
    """One span's place in a trace: its trace id (32 lowercase hex digits), its own id
    (16), and the trace flags. Made by :func:`parse_traceparent` or :meth:`of`."""

    trace_id: str
    span_id: str
    flags: int

    @classmethod
    def of(cls, trace_id: int, span_id: int, flags: int) -> TraceContext:
        """The context of a span the router made (ids as integers, neither zero)."""
        if not (0 < trace_id < 1 << 128 and 0 < span_id < 1 << 64):
            raise ValueError("trace ids are 128 bits, span ids 64, and neither is zero")
        return cls(f"{trace_id:032x}", f"{span_id:016x}", flags & KNOWN_FLAGS)

    @property
    def traceparent(self) -> str:
        """This context as a version ``00`` ``traceparent``: a child of this span names
        it as its parent so."""
        return f"00-{self.trace_id}-{self.span_id}-{self.flags & KNOWN_FLAGS:02x}"


def parse_traceparent(value: object) -> TraceContext | None:
    """The context a ``traceparent`` value names; None when it is not a valid one (not
    a string, malformed, or naming no trace), as the W3C rules say."""
    if not isinstance(value, str) or len(value) < _VERSION_00_LENGTH:
        return None
    fields = _FIELDS.fullmatch(value)
    if fields is None:
        return None
    version, trace_id, span_id, flags, rest = fields.groups()
    if version == "ff" or (version == "00" and rest is not None):
        return None
    if trace_id == _ZERO_TRACE or span_id == _ZERO_SPAN:
        return None
    return TraceContext(trace_id, span_id, int(flags, 16))
