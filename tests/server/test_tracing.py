"""Trace context and the request log (docs/operations.md: Trace context, Request log).

A real router in this process, a scripted backend and a client on real sockets; the
router's spans go to OpenTelemetry's in-memory exporter. A prompt that names its
client's span in ``params._meta.traceparent`` gets a span of the router's in that
trace, and reaches the backend naming the router's span as its parent, everything else
in the frame as it came; with tracing off the frame arrives byte for byte. The request
log's lines name each request's method, session, backend, outcome and trace
(tests/server/test_request_log.py: sampling, and ids without OpenTelemetry).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from router.server.connection.request_log import REQUESTS_LOGGER
from router.server.observability.otel import OtelTracer
from tests.fleet import RouterUnderTest, ScriptedBackend, active, start_router, start_scripted
from tests.server.support import (
    BAGGAGE,
    CLIENT_SPAN,
    CLIENT_TRACE,
    META,
    SECRET,
    SESSION,
    TRACEPARENT,
    TRACESTATE,
    prompt_text,
)
from tests.support import WAIT, AcpClient, JsonObject


class _Pulse(SpanProcessor):
    """Sets ``ended`` as each span ends (the spans themselves go to the exporter)."""

    def __init__(self, ended: asyncio.Event) -> None:
        self.ended = ended

    def on_end(self, span: ReadableSpan) -> None:
        self.ended.set()


class Spans:
    """The router's spans, kept in OpenTelemetry's in-memory exporter."""

    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.ended = asyncio.Event()
        self.tracer = OtelTracer([SimpleSpanProcessor(self.exporter), _Pulse(self.ended)])

    def finished(self) -> Sequence[ReadableSpan]:
        return self.exporter.get_finished_spans()

    async def named(self, name: str, count: int = 1) -> list[ReadableSpan]:
        """The first ``count`` spans called ``name`` to end, once they have."""
        async with asyncio.timeout(WAIT):
            while len(found := [s for s in self.finished() if s.name == name]) < count:
                self.ended.clear()
                await self.ended.wait()
        return found


@contextlib.asynccontextmanager
async def traced(
    backend: ScriptedBackend, spans: Spans, **router: Any
) -> AsyncIterator[RouterUnderTest]:
    try:
        async with start_router(
            [(backend.backend_id, backend.url)], tracer=spans.tracer, router=router
        ) as running:
            yield running
    finally:
        spans.tracer.close()


async def attached(client: AcpClient, session_id: str = SESSION) -> None:
    await client.initialize()
    resumed = await client.request("session/resume", {"sessionId": session_id, "cwd": "/w"})
    assert resumed.get("result") == {}, resumed


async def prompted(client: AcpClient, backend: ScriptedBackend, text: str) -> str:
    """Send the prompt ``text``: the frame its backend got."""
    request_id = json.loads(text)["id"]
    answer = await client.send_raw(text, expect_id=request_id)
    assert answer.get("result") == {}, answer
    (got,) = [f for f in backend.frames if json.loads(f).get("id") == request_id]
    return got


@dataclass(frozen=True, slots=True)
class Prompted:
    """A prompt sent through a router: as the client sent it, as the backend got it,
    and the router's span of it (None: not traced)."""

    sent: str
    got: str
    span: ReadableSpan | None


async def prompt_through(
    meta: JsonObject | None, spans: Spans, *, traced_as: bool = True, **router: Any
) -> Prompted:
    """A prompt with ``meta`` from a client, through a router with the keys ``router``,
    to a scripted backend, on a session resumed first; its span is waited for when it
    is to be ``traced_as`` one."""
    async with (
        start_scripted("b1", active) as backend,
        traced(backend, spans, **router) as running,
        AcpClient.connect(running.url) as client,
    ):
        await attached(client)
        sent = prompt_text(7, meta)
        got = await prompted(client, backend, sent)
        (span,) = await spans.named("session/prompt") if traced_as else (None,)
    return Prompted(sent, got, span)


def request_lines(records: Sequence[logging.LogRecord], method: str) -> list[logging.LogRecord]:
    return [r for r in records if r.name == REQUESTS_LOGGER and getattr(r, "method", "") == method]


def span_id(span: ReadableSpan) -> str:
    assert span.context is not None
    return f"{span.context.span_id:016x}"


def trace_id(span: ReadableSpan) -> str:
    assert span.context is not None
    return f"{span.context.trace_id:032x}"


# -- a trace continued ------------------------------------------------------------------------


async def test_a_prompt_naming_its_trace_continues_it_through_the_router(
    caplog: pytest.LogCaptureFixture,
) -> None:
    spans = Spans()
    prompt = await prompt_through(META, spans, request_log="on")
    sent, got, span = prompt.sent, prompt.got, prompt.span
    assert span is not None
    # the backend's traceparent: the client's trace, the router's span as its parent
    meta = json.loads(got)["params"]["_meta"]
    assert meta["traceparent"] == f"00-{CLIENT_TRACE}-{span_id(span)}-01"
    assert got == sent.replace(TRACEPARENT, meta["traceparent"])  # all else byte for byte
    assert (meta["tracestate"], meta["baggage"]) == (TRACESTATE, BAGGAGE)
    # the router's span: in the client's trace, a child of the client's span
    assert trace_id(span) == CLIENT_TRACE
    assert span.parent is not None
    assert f"{span.parent.span_id:016x}" == CLIENT_SPAN
    assert span.parent.is_remote
    assert span.kind is SpanKind.SERVER
    assert span.attributes is not None
    assert dict(span.attributes) == {
        "rpc.system": "jsonrpc",
        "rpc.method": "session/prompt",
        "rpc.jsonrpc.version": "2.0",
        "acp.session.id": SESSION,
        "acp.backend": "b1",
        "acp.outcome": "result",
    }
    assert [(e.name, dict(e.attributes or {})) for e in span.events] == [
        ("forward", {"acp.backend": "b1"})
    ]
    assert span.status.status_code is StatusCode.UNSET
    # the request log: the line names the same trace and span
    (line,) = request_lines(caplog.records, "session/prompt")
    assert (line.trace_id, line.span_id) == (CLIENT_TRACE, span_id(span))  # type: ignore[attr-defined]
    assert (line.session, line.backend, line.outcome) == (SESSION, "b1", "result")  # type: ignore[attr-defined]
    assert line.error_code is None  # type: ignore[attr-defined]
    assert line.duration_ms >= 0  # type: ignore[attr-defined]
    assert CLIENT_TRACE in line.getMessage()
    # and never the prompt's text
    assert SECRET not in repr([dict(s.attributes or {}) for s in spans.finished()])
    assert not [r for r in caplog.records if SECRET in r.getMessage()]


async def test_a_resume_naming_its_trace_shows_its_locate_and_probes() -> None:
    spans = Spans()
    async with (
        start_scripted("b1", active) as backend,
        traced(backend, spans) as router,
        AcpClient.connect(router.url) as client,
    ):
        await client.initialize()
        params = {"sessionId": SESSION, "cwd": "/w", "_meta": {"traceparent": TRACEPARENT}}
        assert (await client.request("session/resume", params)).get("result") == {}
        (resume,) = await spans.named("session/resume")
        (locate,) = await spans.named("locate")

    assert locate.parent is not None
    assert locate.parent.span_id == resume.context.span_id
    assert trace_id(locate) == CLIENT_TRACE
    assert dict(locate.attributes or {}) == {"acp.backend": "b1", "acp.locate.outcome": "active"}
    assert [(e.name, dict(e.attributes or {})) for e in locate.events] == [
        ("probe", {"acp.backend": "b1", "acp.probe.result": "active"})
    ]
    assert locate.start_time is not None
    assert resume.start_time is not None
    assert resume.start_time <= locate.start_time
    assert locate.end_time is not None
    assert resume.end_time is not None
    assert locate.end_time <= resume.end_time
    assert [e.name for e in resume.events] == ["forward"]  # after the locate
    resumed = [f for f in backend.frames if json.loads(f).get("method") == "session/resume"]
    assert json.loads(resumed[0])["params"]["_meta"]["traceparent"].split("-")[2] == span_id(resume)


async def test_an_error_answer_ends_the_span_as_an_error(caplog: pytest.LogCaptureFixture) -> None:
    spans = Spans()
    async with (
        start_scripted("b1", active) as backend,
        traced(backend, spans, request_log="on") as router,
        AcpClient.connect(router.url) as client,
    ):
        await client.initialize()
        text = prompt_text(3, {"traceparent": TRACEPARENT}, session_id="not-attached")
        answer = await client.send_raw(text, expect_id=3)
        (span,) = await spans.named("session/prompt")

    code = answer["error"]["code"]
    assert span.status.status_code is StatusCode.ERROR
    assert dict(span.attributes or {})["rpc.jsonrpc.error_code"] == code
    assert dict(span.attributes or {})["acp.outcome"] == "error"
    assert not span.events  # it went nowhere
    (line,) = request_lines(caplog.records, "session/prompt")
    assert (line.outcome, line.error_code, line.backend) == ("error", code, None)  # type: ignore[attr-defined]
    assert f"error {code}" in line.getMessage()


# -- frames left as they came ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("tracing", "meta"),
    [
        ("off", META),  # tracing off: the client's trace goes on past the router untouched
        ("continue", None),  # nothing to continue
        ("continue", {"traceparent": "00-not-a-trace-01", "baggage": BAGGAGE}),
        ("continue", {"traceparent": f"00-{'0' * 32}-{CLIENT_SPAN}-01"}),
    ],
)
async def test_a_frame_the_router_does_not_trace_arrives_byte_for_byte(
    tracing: str, meta: JsonObject | None
) -> None:
    spans = Spans()
    prompt = await prompt_through(meta, spans, traced_as=False, tracing=tracing)
    assert prompt.got == prompt.sent
    assert not spans.finished()


# -- a trace started --------------------------------------------------------------------------


@pytest.mark.parametrize("meta", [None, {"baggage": BAGGAGE}, {"traceparent": "garbage"}])
async def test_always_starts_a_trace_for_a_request_naming_none(meta: JsonObject | None) -> None:
    prompt = await prompt_through(meta, Spans(), tracing="always")
    span = prompt.span
    assert span is not None
    assert span.parent is None  # the root of a new trace
    received = json.loads(prompt.got)
    expected = json.loads(prompt.sent)
    traceparent = received["params"]["_meta"].pop("traceparent")
    assert span.context is not None
    flags = span.context.trace_flags
    assert flags & 0x01  # sampled (and, from OpenTelemetry's ids, random: W3C Level 2)
    assert traceparent == f"00-{trace_id(span)}-{span_id(span)}-{flags:02x}"
    expected["params"]["_meta"] = {k: v for k, v in (meta or {}).items() if k != "traceparent"}
    assert received == expected  # the rest as it was


async def test_always_continues_a_trace_it_is_given() -> None:
    span = (await prompt_through(META, Spans(), tracing="always")).span
    assert span is not None
    assert trace_id(span) == CLIENT_TRACE


# -- the request log --------------------------------------------------------------------------


async def test_the_request_log_has_a_line_for_every_request(
    caplog: pytest.LogCaptureFixture,
) -> None:
    spans = Spans()
    async with (
        start_scripted("b1", active) as backend,
        traced(backend, spans, request_log="on", tracing="off") as router,
        AcpClient.connect(router.url) as client,
    ):
        await attached(client)
        await prompted(client, backend, prompt_text(11, None))
        status = await client.status(SESSION)
        assert status["result"]["status"] == "active"
        unknown = await client.request("session/prompt", {"sessionId": "other", "prompt": []})
        reserved = await client.request("session/list", {}, request_id="acp-router:x")
        codes = (unknown["error"]["code"], reserved["error"]["code"])

    lines = [r for r in caplog.records if r.name == REQUESTS_LOGGER]
    got = [(r.method, r.session, r.backend, r.outcome, r.error_code, r.trace_id) for r in lines]  # type: ignore[attr-defined]
    assert got == [
        ("initialize", None, None, "result", None, None),
        ("session/resume", SESSION, "b1", "result", None, None),
        ("session/prompt", SESSION, "b1", "result", None, None),
        ("session/status", SESSION, None, "result", None, None),
        ("session/prompt", "other", None, "error", codes[0], None),
        ("session/list", None, None, "error", codes[1], None),
    ]
    assert all(line.levelno == logging.INFO for line in lines)
    assert not spans.finished()  # tracing off: no spans, and the log still works


async def test_a_request_whose_client_leaves_is_logged_as_gone(
    caplog: pytest.LogCaptureFixture,
) -> None:
    spans = Spans()
    async with start_scripted("b1", active) as backend:
        backend.scripted["session/prompt"] = []  # a turn that never ends
        async with traced(backend, spans, request_log="on") as router:
            async with AcpClient.connect(router.url) as client:
                await attached(client)
                await client.ws.send(prompt_text(13, {"traceparent": TRACEPARENT}))
                await backend.until(lambda: any('"session/prompt"' in f for f in backend.frames))
            (span,) = await spans.named("session/prompt")

    assert dict(span.attributes or {})["acp.outcome"] == "client_gone"
    (line,) = request_lines(caplog.records, "session/prompt")
    assert (line.outcome, line.backend, line.trace_id) == ("client_gone", "b1", CLIENT_TRACE)  # type: ignore[attr-defined]
