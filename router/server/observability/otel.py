"""The router's spans with OpenTelemetry's SDK (the ``otel`` extra:
``pip install 'acp-router[otel]'``), configured by the standard environment.

:func:`from_environment` reads ``OTEL_TRACES_EXPORTER`` (``otlp``, the default;
``console``; ``none``; a comma-separated list) and, for OTLP,
``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL`` or ``OTEL_EXPORTER_OTLP_PROTOCOL``
(``http/protobuf``, the default, or ``grpc``); the SDK and the exporters read the rest
themselves (``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_TRACES_SAMPLER``,
``OTEL_EXPORTER_OTLP_ENDPOINT`` and its headers, ``OTEL_BSP_*``). The service is
``acp-router`` unless the environment names it. The tracer provider is the router's
own: nothing global is set, so an application that embeds the router keeps its own.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence

from opentelemetry import trace
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, Status, StatusCode

from router import __version__
from router.protocol.trace_context import TraceContext
from router.server.observability.tracing import Attributes, Span, export_wanted

logger = logging.getLogger(__name__)

#: the service name spans carry when the environment names none
SERVICE = "acp-router"


class OtelSpan:
    """One OpenTelemetry span, as the router's :class:`~router.server.observability.tracing.Span`."""

    __slots__ = ("_span", "_tracer", "context")

    def __init__(self, tracer: trace.Tracer, span: trace.Span) -> None:
        self._tracer = tracer
        self._span = span
        ids = span.get_span_context()
        self.context = TraceContext.of(ids.trace_id, ids.span_id, ids.trace_flags)

    def event(self, name: str, attributes: Attributes) -> None:
        self._span.add_event(name, attributes)

    def child(self, name: str, attributes: Attributes) -> Span:
        inside = trace.set_span_in_context(self._span)
        child = self._tracer.start_span(name, inside, SpanKind.INTERNAL, attributes)
        return OtelSpan(self._tracer, child)

    def end(self, attributes: Attributes, error: int | None = None) -> None:
        self._span.set_attributes(attributes)
        if error is not None:
            self._span.set_status(Status(StatusCode.ERROR, f"JSON-RPC error {error}"))
        self._span.end()


class OtelTracer:
    """Spans made by a tracer provider of the router's own, sent by ``processors``."""

    def __init__(
        self, processors: Sequence[SpanProcessor], resource: Resource | None = None
    ) -> None:
        resource = resource or Resource.create()
        if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
            resource = resource.merge(Resource({SERVICE_NAME: SERVICE}))
        self._provider = TracerProvider(resource=resource, shutdown_on_exit=False)
        for processor in processors:
            self._provider.add_span_processor(processor)
        self._tracer = self._provider.get_tracer("acp-router", __version__)

    def start(self, name: str, parent: TraceContext | None, attributes: Attributes) -> Span:
        context = None
        if parent is not None:
            remote = SpanContext(
                int(parent.trace_id, 16),
                int(parent.span_id, 16),
                is_remote=True,
                trace_flags=trace.TraceFlags(parent.flags),
            )
            context = trace.set_span_in_context(NonRecordingSpan(remote))
        span = self._tracer.start_span(name, context, SpanKind.SERVER, attributes)
        return OtelSpan(self._tracer, span)

    def close(self) -> None:
        self._provider.shutdown()


def from_environment() -> OtelTracer | None:
    """A tracer exporting as ``OTEL_TRACES_EXPORTER`` says; None when it says ``none``
    (or names nothing this router can send to)."""
    names = os.environ.get("OTEL_TRACES_EXPORTER", "otlp")
    processors: list[SpanProcessor] = []
    for name in (part.strip().lower() for part in names.split(",")):
        exporter = _exporter(name)
        if exporter is not None:
            processors.append(BatchSpanProcessor(exporter))
    return OtelTracer(processors) if processors else None


def _exporter(name: str) -> SpanExporter | None:
    if name in ("", "none"):
        logger.debug("tracing: OTEL_TRACES_EXPORTER=none: trace ids reach the request log only")
        return None
    if name == "console":
        return ConsoleSpanExporter()
    if name != "otlp":
        logger.warning("tracing: OTEL_TRACES_EXPORTER names %r, which this router lacks", name)
        return None
    protocol = (
        os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
        or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
        or "http/protobuf"
    )
    exporter: SpanExporter
    try:
        if protocol.strip() == "grpc":
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
                OTLPSpanExporter as GrpcExporter,
            )

            exporter = GrpcExporter()
        else:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
                OTLPSpanExporter as HttpExporter,
            )

            exporter = HttpExporter()
    except ImportError:
        logger.log(
            export_wanted(),
            "tracing: the OTLP exporter (%s) is not installed (pip install 'acp-router[otel]'):"
            " spans are not exported; trace ids reach the request log only",
            protocol,
        )
        return None
    return exporter
