"""Reading JSON-RPC messages off an aiohttp WebSocket (the router's backend side).

Text frames are parsed into envelopes; binary frames are ignored (as ACP's WebSocket
transport draft says); a frame that is not JSON-RPC is logged and skipped, since
there is no request id to answer it with.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import aiohttp

from router.protocol.errors import ProtocolError
from router.protocol.jsonrpc import Message, parse

logger = logging.getLogger(__name__)


async def messages(ws: aiohttp.ClientWebSocketResponse, peer: str) -> AsyncIterator[Message]:
    """Every JSON-RPC message ``peer`` sends on ``ws``, until it closes."""
    async for frame in ws:
        if frame.type is not aiohttp.WSMsgType.TEXT:
            continue
        try:
            yield parse(frame.data)
        except ProtocolError as exc:
            logger.warning("backend %s sent a frame that is not JSON-RPC (%s); dropped", peer, exc)
