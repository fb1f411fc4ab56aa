"""One client connection's requests as the router observes them: the request log's
lines, and each request's span (docs/operations.md, "Request log" and "Trace context").

A request is observed when the request log samples it (``router.request_log``: ``"on"``,
or a fraction of requests) or when it is traced (``router.tracing``: it carries a valid
``params._meta.traceparent``, or the router starts a trace for every request with
``"always"``). :meth:`RequestLog.arrived` decides as the request comes in; a traced
one's span starts there, and a request the router may forward gets the ``traceparent``
of that span spliced into its ``params._meta`` (the rest of the frame byte for byte).
The routing core then tells the shell what became of each observed request
(:class:`~router.core.effects.Forwarded`, :class:`~router.core.effects.Answered`, once
each), and :meth:`RequestLog.note` records it: an event on the span for a forward; for
the answer, the span's end and one line on the ``acp_router.requests`` logger (method,
session, backend, duration, outcome, trace and span ids; never prompt text or tokens).
A request that is observed by neither costs one substring test of its text when
tracing is on, and nothing when both are off (then there is no :class:`RequestLog`).
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from router.core.effects import Answered, Forwarded
from router.core.locate import Located
from router.protocol import acp
from router.protocol.errors import JsonRpcError
from router.protocol.jsonrpc import Request
from router.protocol.splice import put_member, replace_parsed_member
from router.protocol.trace_context import TRACEPARENT_PATH, TraceContext, parse_traceparent
from router.server.config import RouterSection
from router.server.observability.tracing import Attributes, Span, Tracer, TracingMode

#: the request log's logger: its own name, so operators can send it elsewhere
REQUESTS_LOGGER = "acp_router.requests"

logger = logging.getLogger(REQUESTS_LOGGER)

#: requests the router answers itself: never forwarded, so never given a traceparent
#: (an initialize is replayed on each new link long after its span ended)
_ANSWERED_HERE = frozenset({acp.INITIALIZE, acp.SESSION_STATUS, acp.SESSION_LIST})

#: the text a frame that may carry a traceparent holds (tested before anything is read)
_MARK = '"traceparent"'


@dataclass(slots=True)
class _Seen:
    """An observed request in flight."""

    request: Request
    started: float
    span: Span | None
    #: sampled by the request log: a line when it is answered
    logged: bool
    #: its locate's span, while the locate runs
    locate: Span | None = None


class RequestLog:
    """The observed requests of one client connection, from arrival to answer."""

    def __init__(
        self,
        tracer: Tracer,
        tracing: TracingMode,
        fraction: float,
        *,
        bound: int,
        sample: Callable[[], float] = random.random,
    ) -> None:
        self._tracer = tracer
        self._tracing = tracing
        #: the share of requests the log samples (1.0: every one, 0.0: none)
        self._fraction = fraction
        #: at most this many observed at once (the connection's calls in flight, and more)
        self._bound = bound
        self._sample = sample
        self._seen: dict[int, _Seen] = {}
        #: only a request that names a trace is observed (no sampling, nothing always
        #: traced): nearly every request is then told apart by one substring search
        self._only_named = fraction == 0 and tracing == "continue"
        if fraction > 0:
            logger.setLevel(logging.INFO)  # "on" means written, whatever --log-level says

    @classmethod
    def of(cls, settings: RouterSection, tracer: Tracer) -> RequestLog | None:
        """The request log of a connection of a router with ``settings``; None when
        there is nothing to observe (no request log, no tracing)."""
        fraction = settings.request_log_fraction
        if fraction == 0 and settings.tracing == "off":
            return None
        # its calls in flight, and as many refused as they come (each gone at once)
        bound = 2 * settings.max_in_flight_per_connection
        return cls(tracer, settings.tracing, fraction, bound=bound)

    def arrived(self, request: Request) -> Request | None:
        """Observe ``request``, just in from the client, if it is logged or traced:
        the request to route (with the router's ``traceparent`` when it is traced and
        may be forwarded); None when it is not observed."""
        if self._only_named and _MARK not in request.text:
            return None
        logged = self._fraction >= 1.0 or (self._fraction > 0 and self._sample() < self._fraction)
        parent = self._parent(request) if self._tracing != "off" else None
        traced = parent is not None or self._tracing == "always"
        if not (logged or traced) or len(self._seen) >= self._bound:
            return None
        span = None
        if traced:
            span = self._tracer.start(request.method, parent, _attributes(request))
            if request.method not in _ANSWERED_HERE:
                request = request.with_text(_passed_on(request.text, span, parent))
        self._seen[id(request)] = _Seen(request, time.perf_counter(), span, logged)
        return request

    @staticmethod
    def _parent(request: Request) -> TraceContext | None:
        """The client's span the request names, if it names a valid one."""
        if _MARK not in request.text:  # nearly every request, when clients do not trace
            return None
        return parse_traceparent(request.member(*TRACEPARENT_PATH))

    def note(self, effect: Forwarded | Answered) -> None:
        """What the routing core told of an observed request."""
        seen = self._find(effect.request)
        if seen is None:
            return
        if isinstance(effect, Forwarded):
            if seen.span is not None:
                seen.span.event("forward", {"acp.backend": effect.backend})
            return
        del self._seen[id(effect.request)]
        self._answered(seen, effect)

    async def locate(self, request: Request, locating: Awaitable[Located]) -> Located:
        """Await ``locating``, the locate of an observed ``request``, in a child span of
        its own: the probes it sent, what it found."""
        seen = self._find(request)
        if seen is None or seen.span is None:
            return await locating
        span = seen.locate = seen.span.child("locate", {})
        try:
            located = await locating
        except JsonRpcError as exc:
            span.end({}, exc.code)
            raise
        finally:
            seen.locate = None
        for backend, result in located.probes:
            span.event("probe", {"acp.backend": backend, "acp.probe.result": result.value})
        span.end({"acp.backend": located.backend, "acp.locate.outcome": located.outcome.value})
        return located

    def _find(self, request: Request) -> _Seen | None:
        seen = self._seen.get(id(request))
        return seen if seen is not None and seen.request is request else None

    def _answered(self, seen: _Seen, answered: Answered) -> None:
        milliseconds = round((time.perf_counter() - seen.started) * 1000, 3)
        outcome = (
            "client_gone" if answered.gone else "result" if answered.error is None else "error"
        )
        if seen.locate is not None:  # its client left while it was being located
            seen.locate.end({})
        if seen.span is not None:
            attributes: dict[str, str | int] = {"acp.outcome": outcome}
            if answered.session_id is not None:
                attributes["acp.session.id"] = answered.session_id
            if answered.backend is not None:
                attributes["acp.backend"] = answered.backend
            if answered.error is not None:
                attributes["rpc.jsonrpc.error_code"] = answered.error
            seen.span.end(attributes, answered.error)
        if seen.logged:
            _write(seen, answered, outcome, milliseconds)


def _passed_on(text: str, span: Span, parent: TraceContext | None) -> str:
    """``text`` with the ``traceparent`` naming ``span`` in its ``params._meta``: in
    place of the client's (read already: ``parent``, so found there as a string, and
    spliced without a walk in the common frame), else added."""
    child = span.context.traceparent
    if parent is not None:
        return replace_parsed_member(text, TRACEPARENT_PATH, child)
    return put_member(text, TRACEPARENT_PATH, child)


def _attributes(request: Request) -> Attributes:
    """What a request's span says of it from the start: the method (never params)."""
    return {"rpc.system": "jsonrpc", "rpc.method": request.method, "rpc.jsonrpc.version": "2.0"}


def _write(seen: _Seen, answered: Answered, outcome: str, milliseconds: float) -> None:
    """The request's line: text for people, the same fields as JSON members."""
    context = seen.span.context if seen.span is not None else None
    shown = f"error {answered.error}" if outcome == "error" else outcome
    logger.info(
        "%s %s in %.1f ms (session %s, backend %s, trace %s)",
        answered.request.method,
        shown,
        milliseconds,
        answered.session_id or "-",
        answered.backend or "-",
        context.trace_id if context is not None else "-",
        extra={
            "method": answered.request.method,
            "session": answered.session_id,
            "backend": answered.backend,
            "duration_ms": milliseconds,
            "outcome": outcome,
            "error_code": answered.error,
            "trace_id": context.trace_id if context is not None else None,
            "span_id": context.span_id if context is not None else None,
        },
    )
