"""One client connection through the router: the I/O shell around
:class:`router.core.routes.ClientRoutes`.

The read loop parses each client frame's envelope, asks the routing core what to
do, and carries it out: replies are written at once, forwards are queued on the
backend's link (which never makes the loop wait: each link has its own outbox and
writer); work that waits on the pool (locates, pool-wide status and list) runs in
tasks this connection owns, so one slow locate or one slow backend never stalls
another session's traffic. Frames the core holds behind their session's
resume/load/close are carried out when it releases them, after every answer
(:meth:`_release_held`). A link that breaks, cannot open within the deadline or
cannot keep up is given up: exactly its requests are answered ``-32013`` and the
agent requests it had sent the client are withdrawn (``$/cancel_request``); the
client connection carries on. The client connection closes only for the client's
own faults (a binary frame: 1003; an oversize frame: 1009, by aiohttp) or on
shutdown (1012). When the client goes, every task and link of the connection is
cancelled and closed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Protocol, assert_never

import aiohttp

from router.core.frontdoor import Principal
from router.core.routes import (
    Action,
    Broadcast,
    ClientRoutes,
    Deliver,
    Drop,
    Duty,
    Handle,
    Held,
    Limits,
    Relocate,
    Reply,
    Send,
    Settled,
    unreadable,
)
from router.protocol import acp
from router.protocol.errors import (
    BackendLinkLost,
    HandshakeRefused,
    InternalError,
    JsonRpcError,
    ProtocolError,
)
from router.protocol.ids import BackendId, SessionId
from router.protocol.jsonrpc import ErrorObject, Message, Request, RequestId, parse
from router.server import log_context
from router.server.backend_link import BackendLink
from router.server.gate import Gate, Refusal
from router.server.metrics import TO_BACKEND, TO_CLIENT, Metrics
from router.server.pool import Pool

logger = logging.getLogger(__name__)


class ClientChannel(Protocol):
    """Where one client connection's frames leave, whatever carries them (a WebSocket,
    or Streamable HTTP's event streams), and how it is closed."""

    async def send(self, text: str) -> None:
        """Write one JSON-RPC message to the client, in call order; a client that is
        gone is not an error (its connection ends on its own)."""

    async def close(self, code: int, reason: str) -> None:
        """End the connection with a WebSocket close ``code`` (or its meaning)."""


class ClientConnection:
    """The router's side of one client connection, on any transport: the transport
    hands it each text frame (:meth:`receive`) and tells it when the client has gone
    (:meth:`ended`); it writes through its :class:`ClientChannel`."""

    def __init__(
        self,
        channel: ClientChannel,
        pool: Pool,
        http: aiohttp.ClientSession,
        gate: Gate,
        *,
        principal: Principal | None = None,
    ) -> None:
        self.channel = channel
        #: who the client came as (its token's principal): a reload that removes the
        #: token closes the connection
        self.principal = principal
        #: where frames enter and leave: session limits, and sealed session ids
        self.gate = gate
        self.pool = pool
        self.metrics: Metrics = pool.metrics
        self.http = http
        settings = pool.settings.router
        self.routes = ClientRoutes(
            Limits(
                max_in_flight=settings.max_in_flight_per_connection,
                max_sessions=settings.max_sessions_per_connection,
                max_session_id_chars=settings.max_session_id_chars,
            )
        )
        self.links: dict[BackendId, BackendLink] = {}
        self.tasks: set[asyncio.Task[None]] = set()
        #: links opened ahead of a locate (:meth:`_open_ahead`) that no frame has used yet
        self._unused: set[BackendId] = set()

    @property
    def initialized(self) -> bool:
        """Whether the client has sent ``initialize``."""
        return self.routes.initialize is not None

    async def shut(self, code: int, reason: str) -> None:
        """Close the client's connection (the router is stopping: 1012)."""
        await self.channel.close(code, reason)

    async def ended(self) -> None:
        """The client has gone: stop every task and link of the connection, and detach
        its sessions."""
        for task in list(self.tasks):
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        self.pool.record(self.routes.close())

    async def _to_client(self, text: str) -> None:
        """Write one frame to the client, from whichever task has it (the channel keeps
        call order and applies the client's backpressure)."""
        await self.channel.send(text)

    def _spawn(self, work: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        task = asyncio.create_task(work, name=name)
        self.tasks.add(task)
        task.add_done_callback(self._reap)
        return task

    def _reap(self, task: asyncio.Task[None]) -> None:
        self.tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            logger.error("connection task %s failed", task.get_name(), exc_info=task.exception())

    # -- client -> router --------------------------------------------------------------------------

    async def receive(self, text: str) -> None:
        """One text frame from the client."""
        try:
            message = parse(text)
        except ProtocolError as exc:
            await self._do(unreadable(exc))
            return
        passed = self.gate.inbound(message)
        if isinstance(passed, Refusal):
            await self._refuse(passed)
            return
        await self._do(self.routes.receive_client(passed))

    async def _refuse(self, refusal: Refusal) -> None:
        if refusal.text is None:
            logger.debug("dropped a notification the gate refused (%d)", refusal.code)
            return
        self.metrics.client_errors.labels(str(refusal.code)).inc()
        await self._to_client(refusal.text)  # as it is: never through gate.reply

    async def _do(self, action: Action) -> None:
        match action:
            case Reply(text, error):
                if error is not None:  # every error the core makes passes here, once
                    self.metrics.client_errors.labels(str(error)).inc()
                await self._to_client(self.gate.reply(text))
            case Send(backend, text):
                await self._send(backend, text)
            case Broadcast(backends, text):
                for backend in backends:
                    await self._send(backend, text)
            case Deliver(text, settled, changes):
                if settled is not None:
                    self._record(settled)
                if changes:
                    self.pool.record(changes)
                self.metrics.count_frame(TO_CLIENT, text)
                await self._to_client(text)
            case Handle(duty, request, session_id):
                await self._handle(duty, request, session_id)
            case Relocate(request, session_id, backend, tried):
                self._relocate(request, session_id, backend, tried)
            case Held(session_id):
                logger.debug("holding a frame behind session %s's resume/load/close", session_id)
            case Drop(reason):
                logger.debug("dropped a frame: %s", reason)
            case _:
                assert_never(action)

    def _relocate(
        self,
        request: Request,
        session_id: SessionId,
        backend: BackendId,
        tried: tuple[BackendId, ...],
    ) -> None:
        """The backend did not know the session after all: forget the hint, locate again
        among the backends not tried yet."""
        self.metrics.resumes.labels(backend, "not_found").inc()
        self.pool.forget(session_id)
        self._spawn(self._locate(request, session_id, tried), "relocate")

    def _record(self, settled: Settled) -> None:
        """Record what a backend's answer changed, as the routing core reported it."""
        if settled.resume is not None:
            self.metrics.resumes.labels(settled.backend, settled.resume).inc()
        if settled.learned is not None:
            created = settled.call.request.method in acp.CREATING
            self.pool.learn(settled.learned, settled.backend, created=created)
        self.pool.record(settled.changes)

    async def _send(self, backend: BackendId, text: str) -> None:
        """Queue ``text`` on the link to ``backend`` (opening it): never waits on the backend."""
        link = self.links.get(backend) or self._open_link(backend)
        self._unused.discard(backend)
        self.metrics.count_frame(TO_BACKEND, text)
        if not link.offer(text):
            await self._lose(link, link.ended or "closed")

    async def _fail(self, request_id: RequestId, error: JsonRpcError) -> None:
        await self._do(self.routes.fail(request_id, error))
        await self._release_held()

    async def _release_held(self) -> None:
        """Carry out the frames the core held behind a resume, load or close that is now
        answered: one at a time, each reaching its backend link's FIFO before the next is
        taken, so the session's frames leave in the order they came."""
        while (action := self.routes.release()) is not None:
            await self._do(action)

    # -- requests the router answers or routes itself ------------------------------------------------

    async def _handle(self, duty: Duty, request: Request, session_id: SessionId | None) -> None:
        if duty is Duty.INITIALIZE:
            capabilities = self.gate.capabilities(self.pool.capabilities())
            await self._do(self.routes.answer(request.id, capabilities))
            only = self.pool.only_backend()
            if only is not None and only not in self.links:
                # a pool of one: whatever this client does next goes there, so its link
                # opens now rather than on its first frame (see _open_ahead)
                self._open_link(only)
        elif duty in (Duty.PLACE, Duty.AUTHENTICATE):  # where a new session would go now
            try:
                backend = self.pool.place_new()
            except JsonRpcError as exc:
                await self._fail(request.id, exc)
                return
            if duty is Duty.PLACE:
                await self._do(self.routes.forward(request.id, backend))
            else:  # no link yet: the one backend the authenticate goes to
                await self._do(self.routes.authenticate_on(request.id, backend))
        elif duty is Duty.STATUS:
            assert session_id is not None
            self._spawn(self._answer(request.id, self.pool.status(session_id)), "status")
        elif duty is Duty.LIST:
            # the two members the listing reads, not the whole params a client sent
            asked = {"cwd": request.param("cwd"), "cursor": request.param("cursor")}
            self._spawn(self._answer(request.id, self.pool.list_sessions(asked)), "list")
        else:  # LOCATE, LOCATE_DETACHED
            assert session_id is not None
            guess = self._open_ahead(session_id)
            self._spawn(self._locate(request, session_id, guess=guess), "locate")

    async def _answer(self, request_id: RequestId, work: Coroutine[Any, Any, Any]) -> None:
        try:
            result = await work
        except JsonRpcError as exc:
            await self._fail(request_id, exc)
            return
        except Exception:  # a request task's boundary: the client still gets one answer
            logger.exception("request %r failed inside the router", request_id)
            await self._fail(request_id, InternalError())
            return
        await self._do(self.routes.answer(request_id, result))
        await self._release_held()

    async def _locate(
        self,
        request: Request,
        session_id: SessionId,
        tried: tuple[BackendId, ...] = (),
        *,
        guess: BackendId | None = None,
    ) -> None:
        log_context.session.set(session_id)
        try:
            try:
                located = await self.pool.locate(session_id, tried)
            except JsonRpcError as exc:
                await self._fail(request.id, exc)
                return
            except Exception:  # a request task's boundary: the client still gets one answer
                logger.exception("locating %s failed inside the router", session_id)
                await self._fail(request.id, InternalError())
                return
            if request.id in self.routes.calls:  # still wanted
                if request.method in acp.ATTACHING:
                    self.metrics.resume_attempts.labels("retry" if tried else "first").inc()
                await self._do(self.routes.forward(request.id, located.backend))
        finally:
            if guess is not None:
                self._drop_unused(guess)

    # -- backend links -------------------------------------------------------------------------------

    def _open_ahead(self, session_id: SessionId) -> BackendId | None:
        """Start opening the link a resume of ``session_id`` will most likely need
        (:meth:`Pool.likely`) while the locate runs, instead of after it: a resume from a
        fresh connection then costs max(locate, link opening) plus the forward, not their
        sum (bench locate: the opening is ~60 % of such a resume at one backend).

        Nothing is shared: the link is this connection's own, as if opened by its first
        frame, and carries nothing until the core routes a frame there, so isolation
        (no other client's frame on it) and order (its outbox is FIFO from the first
        frame) are what they were. A wrong guess costs one link opened and closed
        (:meth:`_drop_unused`). The backend it goes to, or None (no guess, or the link
        is open already).
        """
        if self.routes.initialize is None:
            return None
        backend = self.pool.likely(session_id)
        if backend is None or backend in self.links:
            return None
        self._open_link(backend)
        self._unused.add(backend)
        return backend

    def _drop_unused(self, backend: BackendId) -> None:
        """Close a link opened ahead that the locate did not need, quietly (nothing was
        ever routed on it, so nothing is answered or withdrawn)."""
        if backend not in self._unused:
            return
        self._unused.discard(backend)
        link = self.links.pop(backend, None)
        if link is not None:
            link.close("opened ahead, not needed")

    def _open_link(self, backend: BackendId) -> BackendLink:
        settings = self.pool.settings.router
        link = BackendLink(
            backend,
            self.pool.url(backend),
            self.http,
            self.metrics,
            max_message_bytes=settings.max_message_bytes,
            connect_timeout=settings.connect_timeout_ms / 1000,
            tls=self.pool.tls(backend),
        )
        self.links[backend] = link
        task = self._spawn(self._run_link(link), f"link-{backend}")
        # the task's end, however it ends (even cancelled before it ran), unpins
        self.pool.pin(backend, 1)
        task.add_done_callback(lambda _: self.pool.pin(backend, -1))
        return link

    async def _run_link(self, link: BackendLink) -> None:
        log_context.backend.set(link.backend)
        assert self.routes.initialize is not None
        refused: ErrorObject | None = None
        try:
            reason = await link.run(
                self.routes.initialize, self.routes.authenticate, self._from_link(link)
            )
        except BackendLinkLost as exc:
            reason = str((exc.data or {}).get("reason", exc.message))
            refused = exc.refusal if isinstance(exc, HandshakeRefused) else None
        except Exception:  # the link task's boundary: its calls must still be answered
            logger.exception("link to backend %s failed", link.backend)
            reason = "router error"
        await self._lose(link, reason, refused)

    def _from_link(self, link: BackendLink) -> Callable[[Message], Awaitable[None]]:
        async def route(message: Message) -> None:
            if self.links.get(link.backend) is link:  # a link given up says nothing more
                await self._from_backend(link.backend, message)

        return route

    async def _lose(
        self, link: BackendLink, reason: str, refused: ErrorObject | None = None
    ) -> None:
        """Give ``link`` up (once): withdraw its agent requests, answer its calls."""
        if self.links.get(link.backend) is not link:
            return
        del self.links[link.backend]
        link.close(reason)
        logger.warning(
            "link to backend %s ended: %s", link.backend, reason, extra={"outcome": reason}
        )
        lost = self.routes.backend_lost(link.backend, refused, reason)
        self.pool.record(lost.detached)
        for cancel in lost.withdrawn:
            await self._to_client(cancel.text)
        for reply in lost.replies:
            await self._do(reply)
        await self._release_held()

    async def _from_backend(self, backend: BackendId, message: Message) -> None:
        await self._do(self.routes.receive_backend(backend, self.gate.outbound(message)))
        await self._release_held()
