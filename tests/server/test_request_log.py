"""The request log's sampling and a trace continued in ids alone, without OpenTelemetry
(tests/server/test_tracing.py: trace context and the request log through a real router)."""

from __future__ import annotations

import json

from router.protocol.jsonrpc import Request
from router.protocol.reading import parse
from router.server.connection.request_log import RequestLog
from router.server.observability.tracing import IdTracer
from tests.server.support import (
    CLIENT_SPAN,
    CLIENT_TRACE,
    META,
    prompt_text,
)


def as_request(text: str) -> Request:
    message = parse(text)
    assert isinstance(message, Request)
    return message


# -- sampling, and ids without OpenTelemetry ------------------------------------------------


def test_the_request_log_samples_the_fraction_it_is_given() -> None:
    draws = iter([0.09, 0.1, 0.5])
    requests = RequestLog(IdTracer(), "off", 0.1, bound=8, sample=lambda: next(draws))
    texts = [prompt_text(n, None) for n in range(3)]
    observed = [requests.arrived(as_request(text)) for text in texts]
    assert [r is not None for r in observed] == [True, False, False]


def test_without_opentelemetry_a_trace_is_continued_in_ids_alone() -> None:
    requests = RequestLog(IdTracer(), "continue", 0.0, bound=8)
    observed = requests.arrived(as_request(prompt_text(1, META)))
    assert observed is not None
    traceparent = json.loads(observed.text)["params"]["_meta"]["traceparent"]
    version, trace, span, flags = traceparent.split("-")
    assert (version, trace, flags) == ("00", CLIENT_TRACE, "01")
    assert span not in (CLIENT_SPAN, "0" * 16)
    assert requests.arrived(as_request(prompt_text(2, None))) is None  # nothing to continue
    started = RequestLog(IdTracer(), "always", 0.0, bound=8).arrived(
        as_request(prompt_text(3, None))
    )
    assert started is not None
    _, trace, _, flags = json.loads(started.text)["params"]["_meta"]["traceparent"].split("-")
    assert trace != CLIENT_TRACE
    assert flags == "01"  # a trace the router starts is logged: sampled


def test_an_observed_request_past_the_bound_is_not_observed() -> None:
    requests = RequestLog(IdTracer(), "always", 1.0, bound=2)
    held = [requests.arrived(as_request(prompt_text(n, None))) for n in range(3)]
    assert [r is not None for r in held] == [True, True, False]
