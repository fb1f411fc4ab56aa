"""A client connection's link to one backend.

A link is opened on first use: it connects, replays the client's ``initialize``
(with the negotiated protocol version) and ``authenticate``, then forwards frames.
Senders take turns on a FIFO lock: the first ones wait there while the link opens,
so frames leave in the order they were sent. aiohttp writes a frame when
``send_str`` is called and makes the caller wait while the transport is full, so a
slow backend holds its senders back (backpressure) rather than anything piling up.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import Awaitable, Callable

import aiohttp

from router.protocol import acp
from router.protocol.errors import BackendLinkLost, HandshakeRefused
from router.protocol.ids import BackendId
from router.protocol.jsonrpc import Message, Request, Response, replace_id, replace_param
from router.server.faults import backend_faults
from router.server.metrics import Metrics
from router.server.wire import messages

logger = logging.getLogger(__name__)

HANDSHAKE_INITIALIZE = "acp-router:initialize"
HANDSHAKE_AUTHENTICATE = "acp-router:authenticate"


def replayed_initialize(client_initialize: Request) -> str:
    """The client's ``initialize`` as it came (``_meta`` and all), for one new link: the
    router's id, and the protocol version the router negotiated."""
    text = replace_param(client_initialize.text, "protocolVersion", acp.PROTOCOL_VERSION)
    return replace_id(text, HANDSHAKE_INITIALIZE)


def replayed_authenticate(client_authenticate: Request) -> str:
    """The ``authenticate`` the backends accepted, as the client sent it, for one new link."""
    return replace_id(client_authenticate.text, HANDSHAKE_AUTHENTICATE)


class BackendLink:
    """One client connection's WebSocket to one backend."""

    def __init__(
        self,
        backend: BackendId,
        url: str,
        http: aiohttp.ClientSession,
        metrics: Metrics,
        *,
        max_message_bytes: int,
        connect_timeout: float,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self.backend = backend
        self._metrics = metrics
        self.url = url
        self._tls = tls
        self._http = http
        self._max_message_bytes = max_message_bytes
        self._connect_timeout = connect_timeout
        self._ws: aiohttp.ClientWebSocketResponse | None = None
        self._opened = asyncio.Event()  # the handshake is over, one way or the other
        self._turn = asyncio.Lock()  # FIFO: senders that waited for the opening go first

    async def send(self, text: str) -> None:
        """Send one frame to the backend, in call order; before the link is open, wait.

        A frame for a link that failed to open is dropped: its request is answered by
        the connection when the link is reported lost.
        """
        async with self._turn:
            await self._opened.wait()
            if self._ws is not None:
                with contextlib.suppress(ConnectionResetError):
                    await self._ws.send_str(text)

    async def run(
        self,
        initialize: Request,
        authenticate: Request | None,
        on_message: Callable[[Message], Awaitable[None]],
    ) -> None:
        """Open the link, then pump frames both ways until either side closes.

        Returns when the backend closes; raises :class:`BackendLinkLost` when the link
        cannot be opened or breaks. The HTTP session bounds the connect; the handshake is
        bounded here.
        """
        try:
            with backend_faults(self.backend):
                async with self._http.ws_connect(
                    self.url,
                    ssl=self._tls or True,
                    max_msg_size=self._max_message_bytes,
                    autoping=True,
                    heartbeat=30.0,
                ) as ws:
                    async with asyncio.timeout(self._connect_timeout):
                        await self._handshake(ws, initialize, authenticate)
                    self._ws = ws
                    self._opened.set()
                    async for message in messages(ws, self.backend, self._metrics):
                        await on_message(message)
        finally:
            self._ws = None
            self._opened.set()  # release waiting senders: there is nothing to send to

    async def _handshake(
        self, ws: aiohttp.ClientWebSocketResponse, initialize: Request, authenticate: Request | None
    ) -> None:
        await ws.send_str(replayed_initialize(initialize))
        await self._expect_ok(ws, HANDSHAKE_INITIALIZE, acp.INITIALIZE)
        if authenticate is not None:
            await ws.send_str(replayed_authenticate(authenticate))
            await self._expect_ok(ws, HANDSHAKE_AUTHENTICATE, acp.AUTHENTICATE)

    async def _expect_ok(
        self, ws: aiohttp.ClientWebSocketResponse, request_id: str, step: str
    ) -> None:
        async for message in messages(ws, self.backend, self._metrics):
            if isinstance(message, Response) and message.id == request_id:
                if message.error is not None:
                    raise HandshakeRefused(self.backend, step, message.error)
                return
        raise BackendLinkLost(None, {"backend": self.backend, "reason": "closed during handshake"})
