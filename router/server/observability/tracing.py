"""The router's spans: one per client request it traces, exported with OpenTelemetry
when the ``otel`` extra is installed, or made of W3C ids alone when it is not.

A :class:`Tracer` starts the span of one request (:meth:`Tracer.start`), as a child of
the client's span when the request carried a ``traceparent`` (``router.tracing =
"continue"`` or ``"always"``), else as the root of a new trace (``"always"``). The span
gives the ``traceparent`` the backend gets (its :attr:`Span.context`), takes events
(the forward) and children (the locate, with its probes), and ends with the request's
outcome (docs/operations.md, "Trace context").

Without the extra (or with ``OTEL_SDK_DISABLED=true``, or ``OTEL_TRACES_EXPORTER=none``)
:class:`IdTracer` makes the ids alone: the backend still gets a ``traceparent`` naming
the router's span, and the request log still names the trace, but nothing is exported.
:func:`router.server.observability.tracers.tracer_for` chooses; :mod:`router.server.observability.otel` holds the
OpenTelemetry side, configured by the standard ``OTEL_*`` environment variables.
"""

from __future__ import annotations

import logging
import os
import random
from collections.abc import Mapping
from typing import Literal, Protocol

from router.protocol.trace_context import SAMPLED, TraceContext

logger = logging.getLogger(__name__)

#: ``router.tracing``: never trace; continue a client's trace; continue it or start one
TracingMode = Literal["off", "continue", "always"]

#: what a span may carry: never prompt text, never a token
Attributes = Mapping[str, str | int]


class Span(Protocol):
    """The router's span of one client request (or a child of it: the locate)."""

    @property
    def context(self) -> TraceContext:
        """Its trace id, its own id, its flags: the parent a backend's span names."""

    def event(self, name: str, attributes: Attributes) -> None:
        """Something that happened in it, now."""

    def child(self, name: str, attributes: Attributes) -> Span:
        """A span inside this one, starting now."""

    def end(self, attributes: Attributes, error: int | None = None) -> None:
        """It is over: with these attributes, and ``error`` the JSON-RPC error code of
        the answer (None: a result, or no answer)."""


class Tracer(Protocol):
    """Where spans are made, and sent."""

    def start(self, name: str, parent: TraceContext | None, attributes: Attributes) -> Span:
        """The span of a request: a child of ``parent`` (the client's span), or the root
        of a new trace."""

    def close(self) -> None:
        """Send what is left (the router is stopping); blocks, so run it off the loop."""


class IdSpan:
    """A span that is only its ids: nothing records it (no OpenTelemetry SDK)."""

    __slots__ = ("context",)

    def __init__(self, context: TraceContext) -> None:
        self.context = context

    def event(self, name: str, attributes: Attributes) -> None:
        pass

    def child(self, name: str, attributes: Attributes) -> Span:
        return self

    def end(self, attributes: Attributes, error: int | None = None) -> None:
        pass


class IdTracer:
    """W3C ids and nothing more: a continued trace keeps the client's id and flags, a
    new one is sampled (it reaches the request log)."""

    def start(self, name: str, parent: TraceContext | None, attributes: Attributes) -> Span:
        span_id = _nonzero(64)
        if parent is None:
            return IdSpan(TraceContext.of(_nonzero(128), span_id, SAMPLED))
        return IdSpan(TraceContext(parent.trace_id, f"{span_id:016x}", parent.flags))

    def close(self) -> None:
        pass


def _nonzero(bits: int) -> int:
    """A random id of ``bits`` bits that is not zero (zero names no trace and no span)."""
    while True:
        value = random.getrandbits(bits)
        if value:
            return value


def export_wanted() -> int:
    """How loudly to say spans cannot be exported: a warning when the environment names
    where to send them, else at debug level (a router installed without the extra, as
    most are: the request log still names the traces)."""
    named = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    return logging.WARNING if any(os.environ.get(name) for name in named) else logging.DEBUG
