"""Reading JSON-RPC messages off an aiohttp WebSocket (the router's backend side).

Text frames are parsed into envelopes; any legal JSON is read (see
:mod:`router.protocol.jsontext`). A frame no JSON parser accepts, or JSON that is not
a JSON-RPC message, or JSON nested deeper than the router reads, has no request id
to answer, so it is logged, counted in
``acp_router_backend_frames_dropped_total{backend,reason}`` and skipped; so are
binary frames, which ACP's WebSocket transport draft says to ignore.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import aiohttp

from router.protocol.errors import NestingTooDeep, ParseError, ProtocolError
from router.protocol.jsonrpc import Message, parse
from router.server.metrics import Metrics

logger = logging.getLogger(__name__)

_REASONS = {ParseError: "not_json", NestingTooDeep: "too_deep"}


async def messages(
    ws: aiohttp.ClientWebSocketResponse, backend: str, metrics: Metrics
) -> AsyncIterator[Message]:
    """Every JSON-RPC message ``backend`` sends on ``ws``, until it closes."""
    async for frame in ws:
        if frame.type is not aiohttp.WSMsgType.TEXT:
            if frame.type is aiohttp.WSMsgType.BINARY:
                metrics.drop_frame(backend, "binary")
            continue
        try:
            yield parse(frame.data)
        except ProtocolError as exc:
            reason = _REASONS.get(type(exc), "not_jsonrpc")
            metrics.drop_frame(backend, reason)
            logger.warning(
                "backend %s sent a frame that is not JSON-RPC (%s); dropped", backend, exc
            )
