"""Which tracer a router runs with (``router.tracing``; docs/operations.md, "Trace
context"): OpenTelemetry's (:mod:`router.server.observability.otel`, with the ``otel`` extra) or the
W3C ids alone (:class:`router.server.observability.tracing.IdTracer`). Apart from both, so that the
spans' protocol (:mod:`router.server.observability.tracing`) never imports the optional side that
implements it."""

from __future__ import annotations

import logging
import os

from router.server.observability.tracing import IdTracer, Tracer, TracingMode, export_wanted

logger = logging.getLogger(__name__)


def tracer_for(mode: TracingMode) -> Tracer:
    """The tracer of a router whose ``router.tracing`` is ``mode``: OpenTelemetry's,
    exporting as the ``OTEL_*`` environment says, when it is installed and enabled; else
    ids alone (and why, logged once)."""
    if mode == "off":
        return IdTracer()
    if os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        logger.info("tracing: OTEL_SDK_DISABLED is true: trace ids reach the request log only")
        return IdTracer()
    try:
        from router.server.observability import otel
    except ImportError:
        logger.log(
            export_wanted(),
            "tracing: the OpenTelemetry SDK is not installed (pip install 'acp-router[otel]'):"
            " spans are not exported; trace ids reach the request log only",
        )
        return IdTracer()
    return otel.from_environment() or IdTracer()
