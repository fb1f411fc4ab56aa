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
own faults (an oversize frame: 1009, by its WebSocket; binary frames are ignored) or on
shutdown (1012). When the client goes, every task and link of the connection is
cancelled and closed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any, Protocol, assert_never

from router.core.actions import (
    Absorbed,
    Action,
    Broadcast,
    CloseLink,
    Deliver,
    Drop,
    Duty,
    Handle,
    Held,
    OpenLink,
    Relocate,
    Reply,
    Send,
    Settled,
    refusal,
    unreadable,
)
from router.core.frontdoor import Principal
from router.core.health import Health
from router.core.routes import ClientRoutes, Limits
from router.protocol import acp
from router.protocol.errors import (
    BackendLinkLost,
    BackendRefused,
    HandshakeRefused,
    InternalError,
    JsonRpcError,
    ProtocolError,
    RouterStopping,
    TooManyLocates,
)
from router.protocol.ids import BackendId, SessionId
from router.protocol.jsonrpc import ErrorObject, Message, Request, RequestId, parse
from router.server import log_context
from router.server.backend_link import BackendLink
from router.server.gate import Gate, Refusal
from router.server.metrics import TO_BACKEND, TO_CLIENT, Metrics
from router.server.pool import Pool

logger = logging.getLogger(__name__)

#: the duties that may ask every backend: each costs the client one locate of its budget
_LOCATING = frozenset({Duty.LOCATE, Duty.LOCATE_DETACHED, Duty.STATUS})


class ClientChannel(Protocol):
    """Where one client connection's frames leave, whatever carries them (a WebSocket,
    or Streamable HTTP's event streams), and how it is closed."""

    #: whether :meth:`send` may run outside a task (inline, from a backend link's socket
    #: callback: :mod:`router.server.inline`): it uses no ``asyncio.timeout`` then
    inline: bool

    def write(self, text: str) -> bool:
        """Write ``text`` now if that needs no waiting (True); else write nothing (False:
        :meth:`send` it)."""

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
        settings = pool.settings.router
        self.routes = ClientRoutes(
            Limits(
                max_in_flight=settings.max_in_flight_per_connection,
                max_sessions=settings.max_sessions_per_connection,
                max_session_id_chars=settings.max_session_id_chars,
                failover=pool.settings.failover.enabled,
            )
        )
        self.links: dict[BackendId, BackendLink] = {}
        self.tasks: set[asyncio.Task[None]] = set()
        #: closing for a router stop: every request gets RouterStopping
        self._stopping = False

    @property
    def initialized(self) -> bool:
        """Whether the client has sent ``initialize``."""
        return self.routes.initialize is not None

    async def shut(self, code: int, reason: str) -> None:
        """Close the client's connection (the router is stopping: 1012), after answering
        every request still in flight with the retryable -32013 (:class:`RouterStopping`),
        so the client waits on nothing; a request that comes meanwhile gets the same."""
        self._stopping = True
        for reply in self.routes.abandon(RouterStopping()):
            await self._do(reply)
        await self.channel.close(code, reason)

    async def ended(self) -> None:
        """The client has gone: stop every task and link of the connection, and detach
        its sessions."""
        for task in list(self.tasks):
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        links, self.links = self.links, {}
        for link in links.values():  # an open link lives on its socket, not in a task
            link.close("the client connection has ended")
        self.pool.directory.record(self.routes.close())

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
        if self._stopping and isinstance(message, Request):
            await self._do(refusal(message.id, RouterStopping()))
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
        await self.channel.send(refusal.text)  # as it is: never through gate.reply

    async def _do(self, action: Action) -> None:
        """Carry out one action of the core, after the links it needs opened or closed."""
        for command in self.routes.link_commands():
            if isinstance(command, OpenLink):
                self._open_link(command)
            else:
                self._close_unused(command)
        match action:  # the per-frame cases first
            case Deliver(text, settled, changes):
                if settled is not None:
                    self._record(settled)
                if changes:
                    self.pool.directory.record(changes)
                self.metrics.count_frame(TO_CLIENT, text)
                await self.channel.send(text)
            case Send(backend, text):
                await self._send(backend, text)
            case Reply(text, error):
                if error is not None:  # every error the core makes passes here, once
                    self.metrics.client_errors.labels(str(error)).inc()
                await self.channel.send(self.gate.reply(text))
            case Broadcast(backends, text):
                for backend in backends:
                    await self._send(backend, text)
            case Absorbed(settled):
                self._record(settled)
                self.metrics.failovers.labels("ok" if settled.resume == "ok" else "failed").inc()
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
        self.pool.directory.forget(session_id)
        self.pool.directory.absences.add(session_id, resumed=[backend])
        self._spawn(self._locate(request, session_id, tried), "relocate")

    def _record(self, settled: Settled) -> None:
        """Record what a backend's answer changed, as the routing core reported it."""
        if settled.resume is not None:
            self.metrics.resumes.labels(settled.backend, settled.resume).inc()
        directory = self.pool.directory
        if settled.learned is not None:
            created = settled.call.request.method in acp.CREATING
            self.pool.learn(settled.learned, settled.backend, created=created)
            if created and settled.changes:
                directory.created(settled.backend)
        if settled.changes:  # most answers change nothing (a prompt's): no pulse then
            directory.record(settled.changes)
        if settled.released is not None:
            directory.released(settled.released)

    async def _send(self, backend: BackendId, text: str) -> None:
        """Queue ``text`` on the link to ``backend`` (the core opened it): never waits on
        the backend."""
        link = self.links.get(backend)
        if link is None:  # given up since the core routed there: its calls are answered
            logger.debug("dropped a frame for backend %s: its link has ended", backend)
            return
        self.metrics.count_frame(TO_BACKEND, text)
        if not await link.forward(text):
            await self._lose(link, link.ended or "closed")

    async def _fail(self, request_id: RequestId, error: JsonRpcError | ErrorObject) -> None:
        reply = self.routes.end(request_id, error)
        if reply is None:  # a failover's resume: nowhere to resume the session
            self.metrics.failovers.labels("failed").inc()
            logger.warning("failover found no home: %s", getattr(error, "message", error))
        else:
            await self._do(reply)
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
            only = self.pool.only_backend()
            if only is not None:
                # a pool of one: whatever this client does next goes there, so its link
                # opens now rather than on its first frame
                self.routes.open_ahead(None, only)
            await self._do(self.routes.answer(request.id, capabilities))
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
        elif duty in _LOCATING and (over := self._over_locate_budget(request)) is not None:
            await self._fail(request.id, over)
        elif duty is Duty.STATUS:
            assert session_id is not None
            status = self.pool.queries.status(session_id)
            self._spawn(self._answer(request.id, status), "status")
        elif duty is Duty.LIST:
            # the two members the listing reads, not the whole params a client sent
            asked = {"cwd": request.param("cwd"), "cursor": request.param("cursor")}
            listed = self.pool.queries.list_sessions(asked)
            self._spawn(self._answer(request.id, listed), "list")
        else:  # LOCATE, LOCATE_DETACHED
            assert session_id is not None
            self._open_ahead(request, session_id)
            self._spawn(self._locate(request, session_id), "locate")

    def _over_locate_budget(self, request: Request) -> TooManyLocates | None:
        """Why a request the core sends to be located (or to the pool's status) may not
        be, if the client is over its budget; a failover's resume is the router's own."""
        call = self.routes.calls.get(request.id)
        if call is not None and call.internal:
            return None
        try:
            self.gate.count_locate()
        except TooManyLocates as exc:
            return exc
        return None

    async def _answer(self, request_id: RequestId, work: Coroutine[Any, Any, Any]) -> None:
        try:
            result = await work
        except JsonRpcError as exc:
            await self._fail(request_id, exc)
            return
        except BackendRefused as exc:
            await self._fail(request_id, exc.error)
            return
        except Exception:  # a request task's boundary: the client still gets one answer
            logger.exception("request %r failed inside the router", request_id)
            await self._fail(request_id, InternalError())
            return
        await self._do(self.routes.answer(request_id, result))
        await self._release_held()

    async def _locate(
        self, request: Request, session_id: SessionId, tried: tuple[BackendId, ...] = ()
    ) -> None:
        log_context.session.set(session_id)
        try:
            located = await self.pool.locator.locate(session_id, tried)
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

    async def _fail_over(self, backend: BackendId, sessions: tuple[SessionId, ...]) -> None:
        """Resume ``sessions`` (their link to ``backend`` was lost) where they live, once
        ``backend`` is known to be back (then there) or gone (then where the pool knows
        them); their frames wait until then ([failover])."""
        wait = self.pool.settings.failover.wait_ms / 1000
        health = await self.pool.settled(backend, wait)
        for session_id in sessions:
            if health is Health.UNKNOWN:
                self.metrics.failovers.labels("timeout").inc()
                self.routes.give_up_failover(session_id)
                await self._release_held()
                continue
            handle = self.routes.fail_over(session_id)
            if handle is not None:
                logger.info("failing over session %s from backend %s", session_id, backend)
                self._spawn(self._locate(handle.request, session_id), "failover-locate")

    # -- backend links -------------------------------------------------------------------------------

    def _open_ahead(self, request: Request, session_id: SessionId) -> None:
        """Have the core open the link a resume of ``session_id`` will most likely need
        (:meth:`Pool.likely`) while the locate runs, instead of after it: a resume from a
        fresh connection then costs max(locate, link opening) plus the forward, not their
        sum (bench locate: the opening is ~60 % of such a resume at one backend).

        Nothing is shared: the link is this connection's own, as if opened by its first
        frame, and carries nothing until the core routes a frame there, so isolation
        (no other client's frame on it) and order (its outbox is FIFO from the first
        frame) are what they were. A wrong guess costs one link opened and closed (the
        core closes it when the call settles elsewhere).
        """
        backend = self.pool.likely(session_id)
        if backend is not None:
            self.routes.open_ahead(request.id, backend)

    def _close_unused(self, command: CloseLink) -> None:
        """Close a link the core opened ahead and did not need, quietly (nothing was
        ever routed on it, so nothing is answered or withdrawn)."""
        link = self.links.pop(command.backend, None)
        if link is not None:
            link.close(command.reason)

    def _open_link(self, command: OpenLink) -> BackendLink:
        backend = command.backend
        settings = self.pool.settings.router
        link = BackendLink(
            backend,
            self.pool.url(backend),
            self.metrics,
            max_message_bytes=settings.max_message_bytes,
            connect_timeout=settings.connect_timeout_ms / 1000,
            tls=self.pool.tls(backend),
            inline=self.channel.inline,
        )
        self.links[backend] = link
        for text in command.first:
            self.metrics.count_frame(TO_BACKEND, text)
            link.offer(text)  # an empty outbox takes any frame a client may send
        self.pool.pin(backend, 1)  # until the link has ended (_run_link or _link_ended)
        self._spawn(self._run_link(link, command), f"link-{backend}")
        return link

    async def _run_link(self, link: BackendLink, command: OpenLink) -> None:
        """Open ``link``: from then on it lives on its socket's callbacks, without a task,
        until :meth:`_link_ended`. A link that cannot open is given up here."""
        log_context.backend.set(link.backend)
        refused: ErrorObject | None = None
        opened = running = False

        def on_open(result: Any) -> None:
            nonlocal opened
            opened = True
            self.pool.client_link_up(link.backend, result)

        try:
            await link.open(
                command.initialize,
                command.authenticate,
                self._from_link(link),
                self._link_ended,
                on_open,
            )
            running = True
            return
        except BackendLinkLost as exc:
            reason = str((exc.data or {}).get("reason", exc.message))
            refused = exc.refusal if isinstance(exc, HandshakeRefused) else None
        except Exception:  # the link task's boundary: its calls must still be answered
            logger.exception("link to backend %s failed", link.backend)
            link.close("router error")
            reason = "router error"
        finally:  # it did not open (cancelled too): the link has ended here
            if not running:
                if opened:
                    self.pool.client_link_down(link.backend)
                self.pool.pin(link.backend, -1)
        await self._lose(link, reason, refused)

    def _link_ended(self, link: BackendLink, reason: str) -> None:
        """An open link's socket is gone (closed by either side, or broken): give it up
        in a task (its calls are answered, which may wait on the client)."""
        self.pool.client_link_down(link.backend)
        self.pool.pin(link.backend, -1)
        if self.links.get(link.backend) is link:
            self._spawn(self._lose(link, reason), f"link-lost-{link.backend}")

    def _from_link(
        self, link: BackendLink
    ) -> Callable[[Message], Coroutine[Any, Any, None] | None]:
        """What ``link`` hands each message from its backend to: nothing is left to run
        when it was delivered at once (an update, written without waiting); else the
        coroutine that carries it out."""
        backend, routes, metrics, channel = link.backend, self.routes, self.metrics, self.channel

        def route(message: Message) -> Coroutine[Any, Any, None] | None:
            if self.links.get(backend) is not link:  # a link given up says nothing more
                return None
            message = self.gate.outbound(message, backend)
            if routes.relays(message) and not routes.links_changed():
                # nearly every frame from a backend (an update): delivered as it came,
                # what _do would do with receive_backend's Deliver, with nothing built
                metrics.count_frame(TO_CLIENT, message.text)
                if channel.write(message.text):
                    return self._relayed(None) if routes.any_released() else None
                return self._relayed(message.text)
            return self._routed(backend, message)

        return route

    async def _relayed(self, text: str | None) -> None:
        """The rest of relaying ``text`` (None: it was written already)."""
        if text is not None:
            await self.channel.send(text)
        if self.routes.any_released():
            await self._release_held()

    async def _routed(self, backend: BackendId, message: Message) -> None:
        await self._do(self.routes.receive_backend(backend, message))
        if self.routes.any_released():
            await self._release_held()

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
        self.pool.directory.record(lost.detached)
        for call in lost.calls:
            if call.request.method in acp.ATTACHING:
                self.metrics.resumes.labels(link.backend, "link_lost").inc()
            if call.internal:
                self.metrics.failovers.labels("failed").inc()
        if lost.orphaned:
            self._spawn(self._fail_over(link.backend, lost.orphaned), "failover")
        for cancel in lost.withdrawn:
            await self.channel.send(cancel.text)
        for reply in lost.replies:
            await self._do(reply)
        await self._release_held()
