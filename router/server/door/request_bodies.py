"""The bodies of Streamable HTTP's POSTs (:mod:`router.server.door.streamable_http`): read
within a deadline and within the bytes every connection may hold together, or answered
with why not (docs/architecture.md, "Every rule and its file").
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from aiohttp import hdrs, web

from router.core.quotas import ByteBudget
from router.server.config import RouterSection
from router.server.door.http_answers import text_response
from router.server.observability.metrics import Metrics

#: what a POST refused for ``router.max_held_bytes`` is told to wait
RETRY_AFTER_SECONDS = 1


async def read_body(request: web.Request, timeout: float, most: int) -> bytearray | web.Response:
    """A request's body, read within ``timeout`` seconds (a client that trickles it is
    answered 408, as one that trickles its headers) and ``most`` bytes, else the refusal."""
    try:
        async with asyncio.timeout(timeout):
            return await _read(request, most)
    except TimeoutError:
        refusal = text_response(408, f"the body did not arrive within {round(timeout * 1000)} ms")
        return await _sent_and_closed(request, refusal)
    except web.HTTPRequestEntityTooLarge:
        return _too_large()
    except ConnectionError:  # the client went before its body was whole: no one to answer
        return text_response(400, "the connection ended before the body did")


async def _read(request: web.Request, most: int) -> bytearray:
    """The body, read into one buffer of its ``Content-Length`` where it has one: what a
    held body costs is its length, whatever the size of the reads (``request.read()``
    grows a buffer as chunks come, and the loop's allocator may hold twice the body)."""
    size = request.content_length
    if size is None:
        grown = bytearray()
        async for chunk in request.content.iter_any():
            grown += chunk
            if len(grown) > most:
                raise web.HTTPRequestEntityTooLarge(max_size=most, actual_size=len(grown))
        return grown
    body = bytearray(size)
    view, filled = memoryview(body), 0
    async for chunk in request.content.iter_any():  # aiohttp reads no more than the length
        view[filled : filled + len(chunk)] = chunk
        filled += len(chunk)
    view.release()
    if filled < size:
        raise ConnectionResetError("the body ended before its Content-Length")
    return body


def _too_large() -> web.Response:
    return text_response(413, "the body is larger than router.max_message_bytes")


async def _sent_and_closed(request: web.Request, refusal: web.Response) -> web.Response:
    """Send ``refusal`` now and close the connection after it, the body left unread:
    aiohttp would otherwise linger, reading what is left of it, for seconds more."""
    refusal.force_close()
    await refusal.prepare(request)
    await refusal.write_eof()
    if request.transport is not None:
        request.transport.close()
    return refusal


class Bodies:
    """Request bodies, read only within the bytes every connection may hold together
    (``router.max_held_bytes``, shared with the frames held for event streams): a body
    that would pass it is answered 503 with ``Retry-After``, unread. A body counts from
    before its first byte is read (its ``Content-Length``, or ``router.max_message_bytes``
    when it has none) until its frame is handed on."""

    def __init__(self, budget: ByteBudget, settings: RouterSection, metrics: Metrics) -> None:
        self.budget = budget
        self._most = settings.max_message_bytes
        self._timeout = settings.handshake_timeout_ms / 1000
        self._metrics = metrics

    @contextlib.asynccontextmanager
    async def read(self, request: web.Request) -> AsyncIterator[bytes | bytearray | web.Response]:
        """The body (held for the block), or the refusal to answer."""
        if not request.body_exists:
            yield b""
            return
        size = request.content_length
        if size is not None and size > self._most:
            yield _too_large()
            return
        size = self._most if size is None else size
        if not self.budget.take(size):
            self._metrics.limited.labels("held_bytes").inc()
            full = text_response(
                503, "the router holds as many request bytes as it may: retry soon"
            )
            full.headers[hdrs.RETRY_AFTER] = str(RETRY_AFTER_SECONDS)
            yield full  # the body unread (aiohttp reads what comes of it, and drops it)
            return
        try:
            yield await read_body(request, self._timeout, self._most)
        finally:
            self.budget.give(size)
