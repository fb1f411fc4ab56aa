"""One client connection's routing state, and the routing of what its client sends, sans-I/O.

The rules it keeps are :mod:`router.core.routes`'s; what the shell found out is
:mod:`router.core.outcomes`, what a backend sends :mod:`router.core.backend_side`, failover :mod:`router.core.failover`, the connection's
end :mod:`router.core.ending`, what observed requests tell :mod:`router.core.observing`,
and which requests cost a locate :mod:`router.core.quotas`.
"""

from __future__ import annotations

from collections.abc import Iterable

from msgspec.structs import replace

from router.core import observing, quotas
from router.core.agent_requests import AgentRequests
from router.core.authentication import Authentication
from router.core.calls import Limits, PendingCall
from router.core.effects import (
    NOTHING,
    AskPool,
    Awaited,
    Dropped,
    Effect,
    Effects,
    Forwarded,
    Initialize,
    Late,
    Limited,
    Locate,
    OpenLink,
    Place,
    Query,
    Send,
    refusal,
)
from router.core.links import Links
from router.core.phases import CLOSED, Connection, Frame, Phase, SessionTable, Waiting
from router.protocol import acp
from router.protocol.errors import (
    InvalidParams,
    InvalidRequest,
    JsonRpcError,
    MethodNotFound,
    RateLimited,
    RouterStopping,
    SessionNotAttached,
    TooManyInFlight,
    TooManySessions,
)
from router.protocol.ids import (
    RESERVED_ID_PREFIX,
    BackendId,
    RoutedId,
    SessionId,
    is_reserved,
)
from router.protocol.jsonrpc import (
    Message,
    Notification,
    Request,
    RequestId,
    Response,
    is_request_id,
)
from router.protocol.splice import replace_id


class ClientSide:
    """Which backend each session of one client connection lives on, who awaits what, and
    where each frame from the client goes."""

    def __init__(self, limits: Limits | None = None, budget: quotas.Budget | None = None) -> None:
        self.limits = limits = limits or Limits()
        #: the client's share of the rate limits (None: unlimited)
        self.budget = budget
        #: the connection's own phase, and its ``initialize`` (replayed on every link)
        self.connection = Connection()
        self.auth = Authentication()
        self.links = Links()
        self.sessions = SessionTable()
        self.calls: dict[RequestId, PendingCall] = {}
        self.last_backend: BackendId | None = None
        self.agent_requests = AgentRequests(limits.max_agent_requests)
        self.held_notifications = 0
        self.failovers = 0
        #: the calls :meth:`abandon` answered, and what each awaited: an answer that
        #: comes for one later is dropped and counted (:class:`~router.core.effects.Late`)
        self.abandoned: dict[RequestId, Awaited] = {}
        #: ``session/new`` requests placed again elsewhere when their first backend left
        #: them unanswered (:func:`router.core.outcomes.replaced`), and that backend: its
        #: late answer makes a session nobody uses, which is closed; until it comes (or
        #: its link ends) the id counts as in flight
        self.unanswered_on: dict[RequestId, BackendId] = {}

    @property
    def initialize(self) -> Request | None:
        """The client's ``initialize``, once routed: replayed on every link opened."""
        return self.connection.initialize

    @property
    def authenticate(self) -> Request | None:
        """The ``authenticate`` every backend it went to accepted (replayed on new links)."""
        return self.auth.accepted

    def attached(self) -> dict[SessionId, BackendId]:
        """Every session attached to this connection, and its backend."""
        return self.sessions.attached()

    # -- its tables, written here only --------------------------------------------------------

    def routed(self, request_id: RequestId, call: PendingCall, backend: BackendId) -> None:
        """``call`` is on its way to ``backend`` (placed or located there)."""
        self.calls[request_id] = replace(call, backend=backend)

    def relocating(
        self, request_id: RequestId, call: PendingCall, tried: tuple[BackendId, ...]
    ) -> None:
        """``call`` (a resume or load) is located again, skipping ``tried``."""
        self.calls[request_id] = replace(call, backend=None, tried=tried)

    def next_failover(self) -> int:
        """The number of this connection's next failover (its resume's id)."""
        self.failovers += 1
        return self.failovers

    def own_call(self, call: PendingCall) -> None:
        """A call the router itself makes on this connection (a failover's resume)."""
        self.calls[call.request.id] = call

    def left_unanswered(self, request_id: RequestId, backend: BackendId) -> None:
        """``request_id`` (a ``session/new``) is placed again: ``backend`` left it
        unanswered, and its late answer is not the client's."""
        self.unanswered_on[request_id] = backend

    def unfollow(self, backend: BackendId) -> None:
        """This connection's link to ``backend`` is gone: unrouted notifications no longer
        follow it."""
        if self.last_backend == backend:
            self.last_backend = None

    def stop(self) -> list[tuple[RequestId, PendingCall]]:
        """The connection is ending: nothing more is taken, nothing waits, and every call
        in flight is let go (those that awaited something are remembered as abandoned,
        so their late answers are told apart); the calls, for their answers."""
        self.connection.stop()
        self.held_notifications = 0
        self.sessions.drop_waiting()
        self.auth.round = None
        calls = list(self.calls.items())
        self.calls.clear()
        for request_id, call in calls:
            if call.awaits is not None:
                self.abandoned[request_id] = call.awaits
        return calls

    # -- from the client ---------------------------------------------------------------------

    def receive_client(
        self,
        message: Message,
        claimed: BackendId | None = None,
        observed: bool = False,
        now: float = 0.0,
    ) -> Effects:
        """Route one message from the client; ``claimed``: the home its hinted session id
        named (:mod:`router.core.hinted_ids`), a guess its locate asks first, if it needs
        one, and nothing remembers; an ``observed`` request's forwards and answer are
        told (:class:`~router.core.effects.Forwarded`, :class:`~router.core.effects.Answered`);
        ``now``: when it came (the shell's monotonic clock), for the :attr:`budget`."""
        # a request first, by its type: most of what a client sends, and an isinstance
        # that fails looks up __class__
        if type(message) is Request:
            return self._client_request(message, claimed, observed, now)
        if isinstance(message, Response):
            return self._client_response(message)
        return self._client_notification(message)

    def _client_request(
        self, request: Request, claimed: BackendId | None, observed: bool, now: float
    ) -> Effects:
        if self.connection.phase in CLOSED:  # connection.closed, read without a call
            return observing.refused(
                request, RouterStopping(), observed, self.limits.max_session_id_chars
            )
        if is_reserved(request.id):
            error = InvalidRequest(f"request ids starting with {RESERVED_ID_PREFIX!r} are reserved")
            return observing.refused(request, error, observed, self.limits.max_session_id_chars)
        if request.id in self.calls or request.id in self.unanswered_on:
            error = InvalidRequest(f"request id {request.id!r} is already in flight")
            return observing.refused(request, error, observed, self.limits.max_session_id_chars)
        if self._in_flight() >= self.limits.max_in_flight:
            return observing.refused(
                request, TooManyInFlight(), observed, self.limits.max_session_id_chars
            )
        return self._route_or_hold(request, claimed, observed, now)

    def _route_or_hold(
        self, request: Request, claimed: BackendId | None, observed: bool, now: float
    ) -> Effects:
        # the session a request names is read once (each read decodes it again)
        session_id = acp.session_id_of(request) if request.method in acp.SESSION_SCOPED else None
        queue_of = self._held_session(request, session_id)
        if queue_of is None:
            return self._route_request(request, session_id, claimed, observed, now)
        call = PendingCall(
            request, queue_of, held=True, claimed=claimed, observed=observed, arrived=now
        )
        self.calls[request.id] = call
        self.sessions.wait(queue_of, request.id)
        return NOTHING

    def _route_request(
        self,
        request: Request,
        session_id: SessionId | None,
        claimed: BackendId | None,
        observed: bool,
        now: float,
    ) -> Effects:
        try:
            call, effects = self._classify(request, session_id, claimed, now)
        except JsonRpcError as exc:
            refused = observing.refused(request, exc, observed, self.limits.max_session_id_chars)
            if isinstance(exc, RateLimited):
                return (Limited(exc.kind, exc.scope), *refused)
            return refused
        if observed:
            call = replace(call, observed=True)
            if call.backend is not None:
                effects = (Forwarded(request, call.backend), *effects)
        self.calls[request.id] = call
        session_id = call.session_id
        if session_id is not None and request.method in acp.ATTACHING:
            self.sessions.resume(session_id, request.id)
        elif session_id is not None and request.method in acp.RELEASING:
            self.sessions.close(session_id, request.id)
        return effects

    def _in_flight(self) -> int:
        return len(self.calls) + self.held_notifications + len(self.unanswered_on)

    def _held_session(self, message: Frame, session_id: SessionId | None) -> SessionId | None:
        """The session ``message`` (naming ``session_id``, when session-scoped) must wait
        behind, if that session is held."""
        if type(message) is Notification and message.method == acp.CANCEL_REQUEST:
            named = _named_request(message)
            call = self.calls.get(named) if named is not None else None
            return call.session_id if call is not None and call.held else None
        if session_id is None or not self.sessions.holding(session_id):
            return None
        if (
            message.method == acp.SESSION_STATUS
            and self.sessions.phase(session_id) is Phase.ORPHANED
        ):
            return None  # read-only, and answered from the pool: it need not wait a failover
        return session_id

    def _classify(
        self, request: Request, session_id: SessionId | None, claimed: BackendId | None, now: float
    ) -> tuple[PendingCall, Effects]:
        method = request.method
        if method == acp.INITIALIZE:
            self.connection.initialized(request)
            return PendingCall(request, None), (Initialize(request),)
        if self.connection.initialize is None:  # self.initialize, read without a call
            raise InvalidRequest(f"send initialize before {method}")
        if method == acp.AUTHENTICATE:
            if any(c.request.method == acp.AUTHENTICATE for c in self.calls.values()):
                raise InvalidRequest("an authenticate is already in flight on this connection")
            linked = self.links.linked()
            if not linked:
                return PendingCall(request, None), (Place(request),)
            return PendingCall(request, None), self.authenticate_on(request, linked)
        if method == acp.SESSION_NEW:
            self._check_room(None)
            self._spend_new_session(now)
            return PendingCall(request, None), (Place(request),)
        if method == acp.SESSION_LIST:
            self._spend_locate(request, False, now)
            return PendingCall(request, None), (AskPool(Query.LIST, request),)
        if method in acp.SESSION_SCOPED:
            return self._session_request(request, session_id, claimed, now)
        if self.last_backend is None:
            raise MethodNotFound(method)
        return self._forwarded(request, None, self.last_backend)

    def _session_request(
        self,
        request: Request,
        session_id: SessionId | None,
        claimed: BackendId | None,
        now: float,
    ) -> tuple[PendingCall, Effects]:
        if session_id is None:
            raise InvalidParams(f"{request.method} needs params.sessionId as a string")
        if len(session_id) > self.limits.max_session_id_chars:
            raise InvalidParams(
                f"{request.method}: params.sessionId is longer than"
                f" {self.limits.max_session_id_chars} characters"
            )
        backend = self.sessions.backend(session_id)
        if request.method == acp.SESSION_STATUS:
            self._spend_locate(request, backend is not None, now)
            call = PendingCall(request, session_id, claimed=claimed)
            return call, (AskPool(Query.STATUS, request, session_id),)
        if backend is not None:
            if request.method in acp.CREATING:  # a fork: a new session, of one attached here
                self._spend_new_session(now)
            return self._forwarded(request, session_id, backend)
        if request.method in acp.ATTACHING:
            self._check_room(session_id)
        elif request.method not in acp.RELEASING:
            raise SessionNotAttached(session_id)
        self._spend_locate(request, False, now)
        call = PendingCall(request, session_id, claimed=claimed)
        return call, (Locate(request, session_id, claimed=claimed),)

    def _spend_locate(self, request: Request, attached: bool, now: float) -> None:
        """Spend one locate of the client's budget, if the request costs one (raises
        :class:`~router.protocol.errors.TooManyLocates` when it is spent)."""
        if self.budget is not None and quotas.costs_a_locate(request.method, attached=attached):
            self.budget.locate(now)

    def _spend_new_session(self, now: float) -> None:
        """Spend one new session of the client's budget (raises
        :class:`~router.protocol.errors.TooManyNewSessions` when it is spent)."""
        if self.budget is not None:
            self.budget.new_session(now)

    def _check_room(self, session_id: SessionId | None) -> None:
        """Room for one more session: the attached ones, and those calls in flight may
        attach, are fewer than the limit."""
        if self.sessions.count_attached() + self._may_attach() >= self.limits.max_sessions:
            raise TooManySessions(None, {"sessionId": session_id} if session_id else None)

    def _may_attach(self) -> int:
        """Calls in flight that attach a session not attached here when they succeed."""
        return sum(1 for call in self.calls.values() if call.may_attach(self.sessions.backend))

    def _forwarded(
        self, request: Request, session_id: SessionId | None, backend: BackendId
    ) -> tuple[PendingCall, Effects]:
        return PendingCall(request, session_id, backend), self.send(backend, request.text)

    def send(self, backend: BackendId, text: str) -> Effects:
        """Route ``text`` to ``backend``, opening the connection's link there first."""
        self.last_backend = backend
        if self.links.used(backend):
            return (Send(backend, text),)
        return (self._open_link(backend), Send(backend, text))

    def _open_link(self, backend: BackendId, ahead_for: RequestId | None = None) -> OpenLink:
        """Open the link to ``backend``: a link that opens during an ``authenticate``
        round joins it."""
        assert self.initialize is not None  # nothing is routed before initialize
        first = self.auth.join(backend)
        return self.links.open(
            backend, self.initialize, self.auth.accepted, first, ahead_for=ahead_for
        )

    def open_ahead(self, request_id: RequestId | None, backend: BackendId) -> Effects:
        """Open the link to ``backend`` now, ahead of need: where the call ``request_id``
        (a resume or load being located; None: no call, a pool of one at ``initialize``)
        will most likely go. Closed again when the call settles elsewhere, if nothing
        was routed on it; nothing happens when the link is open already."""
        if self.initialize is None or backend in self.links:
            return NOTHING
        return (self._open_link(backend, ahead_for=request_id),)

    def _client_notification(self, note: Notification) -> Effects:
        scoped = note.method in acp.SESSION_SCOPED
        queue_of = self._held_session(note, acp.session_id_of(note) if scoped else None)
        if queue_of is None:
            return self._route_notification(note)
        if self._in_flight() >= self.limits.max_in_flight:
            return (Dropped(f"{note.method}: too many frames held on this connection"),)
        self.sessions.wait(queue_of, note)
        self.held_notifications += 1
        return NOTHING

    def _route_notification(self, note: Notification) -> Effects:
        if note.method == acp.CANCEL_REQUEST:
            named = _named_request(note)
            if named is not None and is_reserved(named):
                error = InvalidRequest(
                    f"request ids starting with {RESERVED_ID_PREFIX!r} are reserved"
                )
                return (refusal(None, error),)
            call = self.calls.get(named) if named is not None else None
            if call is None or call.backend is None:
                return (Dropped("$/cancel_request names no request forwarded to a backend"),)
            return self.send(call.backend, note.text)
        if note.method in acp.SESSION_SCOPED:
            session_id = acp.session_id_of(note)
            backend = self.sessions.backend(session_id) if session_id else None
            if backend is None:
                return (Dropped(f"{note.method} for a session not attached to this connection"),)
            return self.send(backend, note.text)
        if self.last_backend is None:
            return (Dropped(f"{note.method} with no backend to send it to"),)
        return self.send(self.last_backend, note.text)

    def _client_response(self, response: Response) -> Effects:
        entry = (
            self.agent_requests.answered(RoutedId(response.id))
            if isinstance(response.id, int)
            else None
        )
        if entry is None:
            return (Dropped("a reply to no agent request"),)
        backend, original_id = entry
        return (Send(backend, replace_id(response.text, original_id)),)

    # -- what the shell found out --------------------------------------------------------------

    def authenticate_on(self, request: Request, targets: list[BackendId]) -> Effects:
        """Send the client's ``authenticate`` to ``targets`` as one round
        (:mod:`router.core.authentication`), opening the links it needs."""
        opened = tuple(self._open_link(b) for b in targets if not self.links.used(b))
        auth_round = self.auth.begin(request, targets)
        return (*opened, *(Send(b, auth_round.text) for b in targets))

    def gone(self, request_id: RequestId, what: str) -> Effects:
        """``what`` came for ``request_id``, which is answered already: late, if
        :meth:`abandon` answered it (counted once), else just dropped."""
        kind = self.abandoned.pop(request_id, None)
        if kind is not None:
            return (Late(kind),)
        return (Dropped(f"{what} for {request_id!r}, answered already"),)

    def conclude(
        self, request_id: RequestId, answered: Effects, attach_to: BackendId | None = None
    ) -> Effects:
        """``request_id`` is answered with ``answered``: forget the call, close a link
        opened ahead for it that nothing used, attach its session to ``attach_to`` (a
        resume or load that succeeded; not past the session limit), and route the
        frames that waited behind it, in that order."""
        call = self.calls.pop(request_id)
        closed = self.links.done(request_id)
        if call.observed:
            answered = (
                *answered,
                observing.answered(call, answered, self.limits.max_session_id_chars),
            )
        session_id = call.session_id
        if session_id is None:
            return (*closed, *answered)
        if attach_to is not None and not self.room_for(session_id):
            attach_to = None  # the backend holds it for us, but nothing more is routed
        changes, waiting = self.sessions.settle(session_id, request_id, attach_to, call.request)
        if waiting:
            return (*closed, *changes, *answered, *self._rerun(waiting))
        if closed or changes:
            return (*closed, *changes, *answered)
        return answered  # nearly every answer: nothing else comes of it

    def room_for(self, session_id: SessionId) -> bool:
        """Whether ``session_id`` may be attached here: it is, or the limit is not reached."""
        return (
            self.sessions.backend(session_id) is not None
            or self.sessions.count_attached() < self.limits.max_sessions
        )

    def release(self, session_id: SessionId, holder: RequestId) -> Effects:
        """If ``holder`` held ``session_id``, it holds it no more: route the frames that
        waited."""
        _, waiting = self.sessions.settle(session_id, holder)
        return self._rerun(waiting)

    def _rerun(self, waiting: Iterable[Waiting] | None) -> Effects:
        """Route frames that waited, in arrival order, as if they had just arrived (one
        may hold the session again: those behind it wait on)."""
        if not waiting:
            return NOTHING
        effects: list[Effect] = []
        for frame in waiting:
            if isinstance(frame, Notification):
                self.held_notifications -= 1
                effects += self._client_notification(frame)
            else:
                waited = self.calls.pop(frame)
                effects += self._route_or_hold(
                    waited.request, waited.claimed, waited.observed, waited.arrived
                )
        return tuple(effects)


def _named_request(note: Notification) -> RequestId | None:
    """The id a ``$/cancel_request`` names, when it is one (not a list, ``true`` or ``1.0``)."""
    named = note.param("requestId")
    return named if is_request_id(named) else None
