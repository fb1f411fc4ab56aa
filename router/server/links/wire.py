"""Reading JSON-RPC messages a backend sends (its control link's aiohttp WebSocket, or a
client connection's link).

Text frames are parsed into envelopes; any legal JSON is read (see
:mod:`router.protocol.jsontext`). A frame no JSON parser accepts, or JSON that is not
a JSON-RPC message, or JSON nested deeper than the router reads, has no request id
to answer, so it is logged, counted in
``acp_router_backend_frames_dropped_total{backend,reason}`` and skipped; so are
binary frames, which ACP's WebSocket transport draft says to ignore.

A frame larger than ``router.max_message_bytes`` is refused by the router's reader,
which closes the link (1009); that is reported as what it was (the router refused the
backend's frame), counted (reason ``too_big``) and ends the link with
:class:`~router.protocol.errors.BackendLinkLost`.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import aiohttp
from aiohttp.http_websocket import WebSocketError

from router.protocol.errors import BackendLinkLost, NestingTooDeep, ParseError, ProtocolError
from router.protocol.jsonrpc import Message
from router.protocol.reading import parse
from router.server.observability.metrics import Metrics

logger = logging.getLogger(__name__)

_REASONS = {ParseError: "not_json", NestingTooDeep: "too_deep"}


def _too_big(error: object) -> bool:
    return isinstance(error, WebSocketError) and error.code == aiohttp.WSCloseCode.MESSAGE_TOO_BIG


async def messages(
    ws: aiohttp.ClientWebSocketResponse, backend: str, metrics: Metrics
) -> AsyncIterator[Message]:
    """Every JSON-RPC message ``backend`` sends on ``ws``, until it closes."""
    async for frame in ws:
        message = read(frame, backend, metrics)
        if message is not None:
            yield message


#: what a link says when it refused a frame larger than ``router.max_message_bytes``
TOO_BIG = "the router refused a frame from the backend larger than router.max_message_bytes"


def read(frame: aiohttp.WSMessage, backend: str, metrics: Metrics) -> Message | None:
    """The JSON-RPC message in one frame ``backend`` sent, or None (dropped, counted);
    :class:`BackendLinkLost` for a frame larger than the router reads."""
    if frame.type is not aiohttp.WSMsgType.TEXT:
        if frame.type is aiohttp.WSMsgType.BINARY:
            metrics.drop_frame(backend, "binary")
        elif frame.type is aiohttp.WSMsgType.ERROR and _too_big(frame.data):
            metrics.drop_frame(backend, "too_big")
            reason = f"{TOO_BIG} ({frame.data}); link closed with 1009"
            raise BackendLinkLost(None, {"backend": backend, "reason": reason})
        return None
    return read_text(frame.data, backend, metrics)


def read_text(text: str, backend: str, metrics: Metrics) -> Message | None:
    """The JSON-RPC message in one text frame ``backend`` sent, or None (dropped, counted)."""
    try:
        return parse(text)
    except ProtocolError as exc:
        dropped(exc, backend, metrics)
        return None


def dropped(exc: ProtocolError, backend: str, metrics: Metrics) -> None:
    """Count and log a frame from ``backend`` that :func:`parse` refused with ``exc``."""
    reason = _REASONS.get(type(exc), "not_jsonrpc")
    metrics.drop_frame(backend, reason)
    logger.warning("backend %s sent a frame that is not JSON-RPC (%s); dropped", backend, exc)
