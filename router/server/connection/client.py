"""One client connection through the router: the I/O shell around
:class:`router.core.routes.ClientRoutes`.

Each client frame's envelope is parsed, passed through the connection's gate, and
handed to the routing core; the core answers with an ordered tuple of effects, which
:meth:`ClientConnection.carry_out` carries out in that order and nothing else: frames
are written to the client at once and queued on backend links (which never make the
loop wait: each link has its own outbox and writer), links are opened and closed, and
work that waits on the pool (locates, pool-wide status and list, a failover's wait)
runs in tasks this connection owns, so one slow locate or one slow backend never stalls
another session's traffic; their outcomes go back to the core, whose effects are
carried out in turn. It makes no routing decision of its own: every rule is the core's.
Its links to backends are :class:`router.server.connection.client_links.ClientLinks`.
The client connection closes only for the client's own faults (an oversize frame:
1009, by its WebSocket; binary frames are ignored) or on shutdown (1012). When the client goes, every
task and link of the connection is cancelled and closed; a prompt turn it leaves running
is cancelled first (``session/cancel``, sent before its link closes), unless another
client connection of this router has the session attached there
(``router.cancel_abandoned_turns``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any, assert_never

from router.core.effects import (
    Abandoned,
    Answered,
    AskPool,
    Attach,
    AwaitBackend,
    CancelTurn,
    CloseLink,
    Deliver,
    Detach,
    Dropped,
    Effects,
    FailedOver,
    Forwarded,
    Initialize,
    Late,
    Learned,
    Limited,
    Locate,
    MovedAway,
    Notify,
    NotThere,
    OpenLink,
    Place,
    Query,
    Released,
    Reply,
    Resumed,
    ResumeSent,
    Send,
    refusal,
)
from router.core.ending import Ending
from router.core.frontdoor import Principal
from router.core.gate import Gate, Refusal
from router.core.placement import Asked
from router.core.routes import ClientRoutes, Limits
from router.core.split_brain import How, resume_epoch
from router.protocol import acp
from router.protocol.errors import (
    BackendRefused,
    InternalError,
    JsonRpcError,
    ProtocolError,
    RouterStopping,
)
from router.protocol.ids import BackendId, SessionId
from router.protocol.jsonrpc import Request, RequestId
from router.protocol.reading import parse
from router.server.config import Settings
from router.server.connection.client_links import ClientChannel, ClientLinks
from router.server.connection.request_log import RequestLog
from router.server.observability import log_context
from router.server.observability.metrics import TO_CLIENT, Metrics, error_code_label
from router.server.pool import waits
from router.server.pool.upstream import Upstream

logger = logging.getLogger(__name__)

#: what the core learned, for the shell to record
Noted = (
    Learned
    | MovedAway
    | Released
    | NotThere
    | ResumeSent
    | Resumed
    | FailedOver
    | Abandoned
    | Dropped
    | Late
    | Limited
)


def limits_of(settings: Settings) -> Limits:
    """A connection's bounds, as the config sets them."""
    router = settings.router
    return Limits(
        max_in_flight=router.max_in_flight_per_connection,
        max_sessions=router.max_sessions_per_connection,
        max_session_id_chars=router.max_session_id_chars,
        failover=settings.failover.enabled,
        cancel_abandoned_turns=router.cancel_abandoned_turns,
    )


class ClientConnection:
    """The router's side of one client connection, on any transport: the transport
    hands it each text frame (:meth:`receive`) and tells it when the client has gone
    (:meth:`ended`); it writes through its :class:`ClientChannel`."""

    def __init__(
        self,
        channel: ClientChannel,
        upstream: Upstream,
        gate: Gate,
        *,
        clock: Callable[[], float],
        principal: Principal | None = None,
    ) -> None:
        self.channel = channel
        #: the clock the rate limits run on (the application's)
        self.clock = clock
        #: who the client came as (its token's principal): a reload that removes the
        #: token closes the connection
        self.principal = principal
        #: where frames enter and leave: session limits, and sealed session ids
        self.gate = gate
        self.upstream = upstream
        self.pool = pool = upstream.pool
        self.metrics: Metrics = pool.metrics
        settings = pool.settings.router
        self.routes = ClientRoutes(limits_of(pool.settings), gate.budget)
        self.tasks: set[asyncio.Task[None]] = set()
        self.links = ClientLinks(pool, channel, gate, self.routes, self._spawn, self.carried)
        #: the request log and trace context (None: both off, nothing observed)
        self.requests = RequestLog.of(settings, upstream.tracer)

    @property
    def initialized(self) -> bool:
        """Whether the client has sent ``initialize``."""
        return self.routes.initialize is not None

    async def shut(self, ending: Ending) -> None:
        """Close the client's connection for ``ending``'s reason, after answering every
        request still in flight with the retryable -32013 (:class:`RouterStopping`), so
        the client waits on nothing; a request that comes meanwhile gets the same. The
        turns it leaves running are cancelled (:func:`router.core.ending.abandon`), and
        the cancels leave its links before the close."""
        attached_count = self.pool.directory.attached_count
        await self.carry_out(self.routes.abandon(RouterStopping(), attached_count, ending.why))
        await self.links.sent()
        await self.channel.close(ending.code, ending.reason)

    async def ended(self) -> None:
        """The client has gone: cancel the turns it leaves running, stop every task and
        link of the connection (a link sends what was queued on it first, the cancels
        among them), and detach its sessions."""
        # carrying these out never waits (a cancel is queued, a detach recorded): no
        # task routes anything between the core seeing the client go and its cancellation
        await self.carry_out(self.routes.client_gone(self.pool.directory.attached_count))
        for task in list(self.tasks):
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        await self.links.close_all("the client connection has ended")

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
        finishing = self.received(text)
        if finishing is not None:
            await finishing

    def received(self, text: str) -> Coroutine[Any, Any, None] | None:
        """One text frame from the client, carried out at once as far as that needs no
        waiting (:meth:`carried`); the coroutine that carries out the rest, if any."""
        try:
            message = parse(text)
        except ProtocolError as exc:
            return self.carry_out((refusal(exc.request_id, exc),))
        passed = self.gate.inbound(message)
        if type(passed) is Refusal:  # not isinstance: a tuple would look up __class__
            return self._refuse(passed)
        message, claimed = passed
        if self.requests is not None and type(message) is Request:
            observed = self.requests.arrived(message)
            if observed is not None:
                return self.carried(
                    self.routes.receive_client(observed, claimed, True, self.clock())
                )
        return self.carried(self.routes.receive_client(message, claimed, now=self.clock()))

    async def _refuse(self, refusal: Refusal) -> None:
        if refusal.text is None:
            logger.debug("dropped a notification the gate refused (%d)", refusal.code)
            return
        self.metrics.client_errors.labels(error_code_label(refusal.code)).inc()
        await self.channel.send(refusal.text, answers=refusal.answers)  # never gate.reply

    def carried(self, effects: Effects) -> Coroutine[Any, Any, None] | None:
        """Carry out the core's effects, in order, here and now while they are frames
        that need no waiting (a prompt and its answer: nearly every frame); the coroutine
        that carries out the rest (:meth:`carry_out`), None when none is left."""
        for index, effect in enumerate(effects):
            if type(effect) is Send:
                losing = self.links.send(effect.backend, effect.text)
                if losing is not None:
                    return self._after(losing, effects[index + 1 :])
            elif type(effect) is Deliver:
                if not self.channel.write(effect.text):  # it has to wait: the rest too
                    return self.carry_out(effects[index:])
                self.metrics.count_frame(TO_CLIENT, effect.text)
            else:
                return self.carry_out(effects[index:])
        return None

    async def _after(self, first: Coroutine[Any, Any, None], effects: Effects) -> None:
        await first
        await self.carry_out(effects)

    async def carry_out(self, effects: Effects) -> None:
        """Carry out the core's effects, in order (docs/architecture.md, "The effects
        channel"): the frames, then what they opened, then what was learned."""
        for effect in effects:
            match effect:  # the per-frame cases first
                case Send(backend, text):
                    losing = self.links.send(backend, text)
                    if losing is not None:
                        await losing
                case Deliver(text, message):
                    self.metrics.count_frame(TO_CLIENT, text)
                    await self.channel.send(text, message)
                case Reply(_, answers, error):
                    if error is not None:  # every error the core makes passes here, once
                        self.metrics.client_errors.labels(error_code_label(error)).inc()
                    await self.channel.send(self.gate.reply(effect), answers=answers)
                case Notify(text):
                    await self.channel.send(text)
                case CancelTurn():
                    self.links.cancel_turn(effect)
                case OpenLink():
                    self.links.start(effect)
                case CloseLink():
                    self.links.close_unused(effect)
                case Attach() | Detach():
                    self.pool.record((effect,))
                case Initialize() | Place() | Locate() | AskPool() | AwaitBackend():
                    await self._start(effect)
                case Forwarded() | Answered():
                    assert self.requests is not None  # told only of the requests it observes
                    self.requests.note(effect)
                case _:
                    self._note(effect)

    def _note(self, effect: Noted) -> None:
        """Record what the core learned: the replica's directory, metrics, the log."""
        directory = self.pool.directory
        match effect:
            case Learned(session_id, backend, created):
                self.upstream.where.learn(session_id, backend, created=created)
                if created:
                    directory.created(backend)
            case Released(session_id):
                directory.released(session_id)
            case MovedAway(backend, sessions):
                directory.moved_away(backend, sessions)
            case NotThere(session_id, backend):
                directory.not_there(session_id, backend)
            case ResumeSent(retry):
                self.metrics.resume_attempts.labels("retry" if retry else "first").inc()
            case Resumed(backend, result):
                self.metrics.resumes.labels(backend, result).inc()
            case FailedOver(result, session_id):
                self.metrics.failovers.labels(result).inc()
                if result != "ok":
                    logger.warning("failover of session %s: %s", session_id, result)
            case Abandoned(backend, session_id):
                logger.info(
                    "backend %s made session %s for a session/new placed elsewhere since:"
                    " closing it",
                    backend,
                    session_id,
                )
                self.upstream.healer.close_stale(session_id, backend, How.UNANSWERED)
            case Dropped(reason):
                logger.debug("dropped a frame: %s", reason)
            case Limited(kind, scope):
                self.metrics.rate_limited(kind, scope)
            case Late(kind):
                self.metrics.late_answers.labels(kind).inc()
                logger.debug("dropped a %s answer that came after the connection was closed", kind)
            case _:
                assert_never(effect)

    async def _start(self, work: Initialize | Place | Locate | AskPool | AwaitBackend) -> None:
        """Start what waits on the pool; its outcome goes back to the core."""
        match work:
            case Initialize(request):
                if self.pool.fleet.introduced():
                    await self._initialized(request)
                else:  # a router just started: its backends' answers are on their way
                    self._spawn(self._initialize(request), "initialize")
            case Place(request):
                try:
                    backend = self.upstream.where.place_new(Asked.of(request))
                except JsonRpcError as exc:
                    await self.carry_out(self.routes.fail(request.id, exc))
                    return
                await self.carry_out(self.routes.placed(request.id, backend))
                if request.method == acp.SESSION_NEW and self.pool.can_probe(backend):
                    self._spawn(self._watch_new(request, backend), "new-session-probe")
            case Locate(request, session_id, tried, internal, claimed):
                if internal:
                    logger.info("failing over session %s", session_id)
                elif not tried:  # the link it will most likely need opens while it runs
                    likely = self.upstream.where.likely(session_id, claimed)
                    if likely is not None:
                        await self.carry_out(self.routes.open_ahead(request.id, likely))
                locating = self._locate(request, session_id, tried, claimed, ask_all=internal)
                self._spawn(locating, "locate")
            case AskPool(Query.STATUS, request, session_id):
                assert session_id is not None
                self._spawn(
                    self._answer(request.id, self.upstream.queries.status(session_id)), "status"
                )
            case AskPool(_, request, _):  # Query.LIST
                # the two members the listing reads, not the whole params a client sent
                asked = {"cwd": request.param("cwd"), "cursor": request.param("cursor")}
                self._spawn(
                    self._answer(request.id, self.upstream.queries.list_sessions(asked)), "list"
                )
            case AwaitBackend(backend, sessions):
                self._spawn(self._await_backend(backend, sessions), "failover")
            case _:
                assert_never(work)

    # -- work that waits on the pool -----------------------------------------------------------------

    async def _initialize(self, request: Request) -> None:
        """Answer ``initialize`` once a backend has said what it offers, or its first
        answer is no longer waited for (then with what the router answers itself): a
        client told of no ``resume`` would not try to resume."""
        await waits.first_contact(self.pool, "initialize", any_one=True)
        if not self.pool.fleet.introduced():
            logger.debug("answered initialize before any backend said what it offers")
        await self._initialized(request)

    async def _initialized(self, request: Request) -> None:
        capabilities = self.gate.capabilities(self.pool.capabilities())
        only = self.pool.only_backend()
        await self.carry_out(self.routes.initialized(request.id, capabilities, only))

    async def _answer(self, request_id: RequestId, work: Coroutine[Any, Any, Any]) -> None:
        try:
            result = await work
        except JsonRpcError as exc:
            await self.carry_out(self.routes.fail(request_id, exc))
            return
        except BackendRefused as exc:
            await self.carry_out(self.routes.fail(request_id, exc.error))
            return
        except Exception:  # a request task's boundary: the client still gets one answer
            logger.exception("request %r failed inside the router", request_id)
            await self.carry_out(self.routes.fail(request_id, InternalError()))
            return
        await self.carry_out(self.routes.answer(request_id, result))

    async def _locate(
        self,
        request: Request,
        session_id: SessionId,
        tried: tuple[BackendId, ...] = (),
        claimed: BackendId | None = None,
        *,
        ask_all: bool = False,
    ) -> None:
        log_context.session.set(session_id)
        locating = self.upstream.locator.locate(session_id, tried, claimed, ask_all=ask_all)
        try:
            if self.requests is not None:
                locating = self.requests.locate(request, locating)
            located = await locating
        except JsonRpcError as exc:
            await self.carry_out(self.routes.fail(request.id, exc))
            return
        except Exception:  # a request task's boundary: the client still gets one answer
            logger.exception("locating %s failed inside the router", session_id)
            await self.carry_out(self.routes.fail(request.id, InternalError()))
            return
        epoch = resume_epoch(located.highest_epoch, self.pool.wall_ms(), alone=located.alone)
        await self.carry_out(self.routes.located(request.id, located.backend, epoch))

    async def _watch_new(self, request: Request, backend: BackendId) -> None:
        """A probe beside a ``session/new`` placed on ``backend``: a backend that leaves it
        unanswered within ``probe.timeout_ms`` is silent (a frozen process), and the
        ``session/new``, still unanswered, is placed once more elsewhere (where there is
        an elsewhere: otherwise it waits on)."""
        request_id = request.id
        if await self.pool.alive(backend) or not self.routes.waits_on(request_id, backend):
            return
        try:
            elsewhere = self.upstream.where.place_new(Asked.of(request))
        except JsonRpcError:
            return
        if elsewhere == backend:
            return
        logger.warning(
            "a session/new placed on backend %s got no answer, nor did a probe beside it:"
            " placed on %s instead",
            backend,
            elsewhere,
        )
        self.metrics.new_sessions_replaced.labels(backend).inc()
        await self.carry_out(self.routes.replaced(request_id, backend, elsewhere))

    def stale_copies(self, session_id: SessionId, backends: frozenset[BackendId]) -> None:
        """Copies of ``session_id`` on ``backends`` were found stale: where it is attached
        to one of them here, the core detaches it (:meth:`ClientRoutes.stale_copies`)."""
        changes = self.routes.stale_copies(session_id, backends)
        if changes:
            self.pool.record(changes)

    async def _await_backend(self, backend: BackendId, sessions: tuple[SessionId, ...]) -> None:
        """Wait until ``backend`` is known to be back or gone, up to ``failover.wait_ms``,
        and tell the core (its failover decides: [failover])."""
        wait = self.pool.settings.failover.wait_ms / 1000
        health = await waits.decided(self.pool, backend, wait)
        await self.carry_out(self.routes.backend_known(backend, sessions, health))
