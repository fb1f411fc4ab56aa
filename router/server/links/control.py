"""The control connection: one persistent, initialized link from the router to each
backend, used for probes and pool-wide requests (``session/status``,
``session/list``).

It reads the backend's capabilities from ``initialize`` (reported with the link's
coming up, :class:`router.core.health.CameUp`), reconnects with
exponential backoff and jitter (the first attempt included, so a fleet restart
does not hammer a backend in step), never pausing longer than the grace allows
(:mod:`router.core.reconnect`), and reports what it sees to the pool as
:mod:`router.core.health` events: up (with the process that answered), down, or
refused (nothing listens). The pool decides what that means.

The log says what changed, once: the first failure of an outage (or ``is down`` when an
open link breaks), then ``is up`` with how long the link was down and how many attempts
failed. The attempts in between are logged at debug level only, so a backend that stays
down for an hour does not write a line every few seconds.

Requests leave through the link's own outbox and one writer task, so the pool can send
a probe to a thousand links in one loop without a task, a future or a timer per probe
(:mod:`router.server.links.fanout`); an answer is handed to the callback its request was
registered with.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Callable
from typing import Any, cast

import aiohttp

from router import __version__
from router.core.health import CameUp, Event, Instance, LinkDown
from router.core.reconnect import Backoff
from router.outbox import Outbox
from router.protocol import acp
from router.protocol.errors import BackendLinkLost, InvalidRequest, MethodNotFound, ProtocolError
from router.protocol.ids import BackendId
from router.protocol.jsonrpc import (
    Notification,
    Params,
    Request,
    RequestTemplate,
    Response,
    encode_error,
    reader_limit,
)
from router.server.config import BackendSection, ControlSection
from router.server.links.faults import backend_faults, connection_refused, describe
from router.server.links.tls import backend_context
from router.server.links.wire import messages
from router.server.observability import log_context
from router.server.observability.metrics import Metrics
from router.tasks import cancel_all_and_wait

logger = logging.getLogger(__name__)

_DOWN = LinkDown()

#: requests one control link may have unanswered; past it a probe is refused at once (it
#: counts as unknown): a backend that stopped answering cannot grow the router's tables
MAX_PENDING = 8192
#: frames the control link's outbox holds beyond its own requests (answers to requests a
#: backend sends it); a backend that leaves more unread loses the link
OUTBOX_SLACK = 1024

#: what a request's answer is handed to: the response, or None when the link went down
#: (or the request could not be sent) before it came
Answer = Callable[[Response | None], None]

CLIENT_INFO = {"name": "acp-router", "title": "acp-router control link", "version": __version__}
INITIALIZE_PARAMS = {
    "protocolVersion": acp.PROTOCOL_VERSION,
    "clientCapabilities": {},
    "clientInfo": CLIENT_INFO,
}


class ControlLink:
    """The router's own connection to one backend."""

    def __init__(
        self,
        spec: BackendSection,
        settings: ControlSection,
        http: aiohttp.ClientSession,
        on_event: Callable[[ControlLink, Event], None],
        metrics: Metrics,
        *,
        max_message_bytes: int,
        connect_timeout: float,
    ) -> None:
        self.spec = spec
        self._settings = settings
        self._http = http
        self._on_event = on_event
        self._metrics = metrics
        self._max_message_bytes = max_message_bytes
        self._connect_timeout = connect_timeout
        self._ws: aiohttp.ClientWebSocketResponse | None = None
        self._pending: dict[int, Answer] = {}
        self._outbox = Outbox(MAX_PENDING + OUTBOX_SLACK, 2 * max_message_bytes)
        #: a frame did not fit the outbox: the backend does not read, the link is closed
        self._overflowed = False
        self._wake = asyncio.Event()
        self._next_id = 0
        self.up = False
        #: the outage in progress: when the link went down (or the first attempt failed),
        #: and the attempts that failed since; None while up, or before the first attempt
        self._down_since: float | None = None
        self._failed_attempts = 0

    @property
    def id(self) -> BackendId:
        return BackendId(self.spec.id)

    async def run(self) -> None:
        """Keep the link up until cancelled."""
        log_context.backend.set(self.id)
        settings = self._settings
        backoff = Backoff.of(
            settings.reconnect_initial_ms / 1000,
            settings.reconnect_max_ms / 1000,
            settings.down_grace_ms / 1000,
        )
        pause = backoff.first
        while True:
            # jitter, first attempt included
            await asyncio.sleep(backoff.jittered(pause, random.random()))
            down = _DOWN
            try:
                await self._session()
                pause = backoff.first  # it was up until the backend closed it
            except (BackendLinkLost, ProtocolError) as exc:
                self._log_failure(_reason(exc))
                down = LinkDown(refused=connection_refused(exc))
                pause = backoff.after(pause, reached=self.up)  # up, however briefly
            except Exception:  # the link's boundary: a bug here must not stop the router
                logger.exception("backend %s control link crashed; reconnecting", self.id)
                pause = backoff.longest
            except asyncio.CancelledError:
                self._set_down(stopping=True)
                raise
            self._set_down(down)

    async def _session(self) -> None:
        with backend_faults(self.id):
            await self._connected()

    async def _connected(self) -> None:
        # one deadline for the TCP connect, the upgrade and initialize: a backend that
        # accepts and then says nothing (a stalled host, a half-open relay) must not hold
        # the reconnect loop
        opened_by = asyncio.get_running_loop().time() + self._connect_timeout
        async with contextlib.AsyncExitStack() as stack:
            async with asyncio.timeout_at(opened_by):
                ws = await stack.enter_async_context(
                    self._http.ws_connect(
                        self.spec.url,
                        ssl=backend_context(self.spec) or True,
                        heartbeat=self._settings.heartbeat_seconds,
                        max_msg_size=reader_limit(self._max_message_bytes),
                        autoping=True,
                    )
                )
            self._ws = ws
            reader = asyncio.create_task(self._read(ws), name=f"control-read-{self.id}")
            writer = asyncio.create_task(self._write(ws), name=f"control-write-{self.id}")
            try:
                async with asyncio.timeout_at(opened_by):
                    response = await self.call(
                        acp.INITIALIZE, INITIALIZE_PARAMS, timeout=self._connect_timeout
                    )
                if response.error is not None or not isinstance(response.result, dict):
                    raise InvalidRequest(f"initialize failed: {response.text[:200]}")
                self._set_up(response.result)
                # the link ends when the backend closes it (the reader) or a send fails
                done, _ = await asyncio.wait((reader, writer), return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    task.result()
            finally:
                self._ws = None
                await cancel_all_and_wait(reader, writer)

    async def _read(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        async for message in messages(ws, self.id, self._metrics):
            if isinstance(message, Response):
                answer = (
                    self._pending.pop(message.id, None) if isinstance(message.id, int) else None
                )
                if answer is not None:
                    answer(message)
            elif isinstance(message, Request):
                # The control link is not a client: it has no sessions to serve requests for.
                self._post(encode_error(message.id, MethodNotFound(message.method)))
            elif isinstance(message, Notification):
                pass  # updates for sessions nobody attached here; nothing to do

    async def _write(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        """The link's one writer: the outbox, in order, until a send fails or the outbox
        overflowed."""
        while not self._overflowed:
            while (text := self._outbox.take()) is not None:
                await ws.send_str(text)
            self._wake.clear()
            await self._wake.wait()
        reason = "the backend does not read: the control link's outbox is full"
        raise BackendLinkLost(None, {"backend": self.id, "reason": reason})

    def _post(self, text: str) -> bool:
        """Queue ``text`` for the writer; False (and the link is dropped) when the outbox
        would overflow."""
        if self._overflowed:
            return False
        if not self._outbox.put(text):
            self._overflowed = True
            logger.warning(
                "backend %s does not read its control link (its outbox is full): dropping it",
                self.id,
            )
            transport = link_transport(self._ws) if self._ws is not None else None
            if transport is not None:  # the writer may be waiting on the full socket
                transport.abort()
        self._wake.set()
        return not self._overflowed

    def send(self, encode: Callable[[int], str], answer: Answer) -> int | None:
        """Queue one request (``encode`` makes its frame from the id) without waiting;
        ``answer`` gets its response, or None if the link goes down first. The request's
        id, or None when the link cannot take it (down, or too many unanswered): then
        ``answer`` is never called. Whoever stops waiting calls :meth:`withdraw`."""
        ws = self._ws
        if ws is None or ws.closed or len(self._pending) >= MAX_PENDING:
            return None
        request_id = self._next_id
        self._next_id += 1
        if not self._post(encode(request_id)):
            return None
        self._pending[request_id] = answer
        return request_id

    def withdraw(self, request_id: int) -> None:
        """Stop waiting for ``request_id``: its answer, if it comes, is dropped."""
        self._pending.pop(request_id, None)

    async def call(self, method: str, params: Params, *, timeout: float) -> Response:
        """Send one request; raises TimeoutError (past ``timeout``) or BackendLinkLost."""
        future: asyncio.Future[Response | None] = asyncio.get_running_loop().create_future()

        def answer(response: Response | None) -> None:
            if not future.done():
                future.set_result(response)

        request_id = self.send(RequestTemplate.of(method, params).encode, answer)
        if request_id is None:
            raise BackendLinkLost(None, {"backend": self.id})
        try:
            async with asyncio.timeout(timeout):
                response = await future
        finally:
            self.withdraw(request_id)
        if response is None:
            raise BackendLinkLost(None, {"backend": self.id})
        return response

    def _log_failure(self, reason: str) -> None:
        """An open link broke, or an attempt to open one failed: said at info level once
        per outage, at debug level for the attempts after the first."""
        if self.up:  # the link broke: _set_down starts the outage and says "is down"
            logger.info("backend %s control link failed: %s", self.id, reason)
            return
        self._failed_attempts += 1
        if self._down_since is None:  # the first attempt of all failed
            self._down_since = asyncio.get_running_loop().time()
            logger.info(
                "backend %s control link failed: %s; retrying (each retry is logged at debug"
                " level, the recovery at info)",
                self.id,
                reason,
            )
        else:
            logger.debug(
                "backend %s control link failed again (attempt %d): %s",
                self.id,
                self._failed_attempts,
                reason,
            )

    def _set_up(self, initialize_result: dict[str, Any]) -> None:
        self.up = True
        if self._down_since is None:
            logger.info("backend %s is up (%s)", self.id, self.spec.url)
        else:
            down_for = asyncio.get_running_loop().time() - self._down_since
            logger.info(
                "backend %s is up (%s) after %.1f s down, %d failed %s",
                self.id,
                self.spec.url,
                down_for,
                self._failed_attempts,
                "attempt" if self._failed_attempts == 1 else "attempts",
            )
        self._down_since, self._failed_attempts = None, 0
        self._on_event(self, CameUp(Instance.of(initialize_result), initialize_result))

    def _set_down(self, event: LinkDown = _DOWN, *, stopping: bool = False) -> None:
        """The link is down, or a reconnect failed: every failed attempt is reported, so
        the pool hears a refusal, and sees the grace run out, while the backend is down."""
        pending, self._pending = self._pending, {}
        self._outbox = Outbox(MAX_PENDING + OUTBOX_SLACK, 2 * self._max_message_bytes)
        self._overflowed = False
        for answer in pending.values():
            answer(None)
        was_up, self.up = self.up, False
        if stopping:  # the router is shutting down: nothing went wrong, nothing to report
            return
        if was_up:
            logger.warning("backend %s is down", self.id)
            self._down_since = asyncio.get_running_loop().time()
        self._on_event(self, event)


def link_transport(ws: aiohttp.ClientWebSocketResponse) -> asyncio.WriteTransport | None:
    """The transport under ``ws``, or None when aiohttp does not show it where it used
    to (then a full outbox cannot drop the link at once; its writer's failing send does)."""
    connection = getattr(getattr(ws, "_response", None), "connection", None)
    transport = getattr(connection, "transport", None)
    if not callable(getattr(transport, "abort", None)):
        return None
    return cast(asyncio.WriteTransport, transport)  # uvloop's: the same methods, no base


def _reason(exc: BackendLinkLost | ProtocolError) -> str:
    data = exc.data or {}
    return str(data.get("reason") or describe(exc))
