"""The routing state of one client connection, sans-I/O.

Rules this module keeps:

1. Every client request is recorded in ``calls`` when it arrives and leaves it when
   exactly one answer goes back: the backend's response, or an error the router
   makes (:meth:`ClientRoutes.answer`, :meth:`ClientRoutes.fail`,
   :meth:`ClientRoutes.backend_lost`). A request id already in flight is refused.
2. Client request ids travel to backends unchanged: each backend link belongs to
   one client connection, so they cannot collide there. Agent→client request ids
   are rewritten to router-assigned integers, so two backends never collide at the
   client, and the client's replies get the original ids back.
3. Frames are forwarded as the text they arrived in; only ids are spliced.
   ``authenticate`` is forwarded truthfully (:class:`AuthRound`): the router never
   answers it itself.
4. Per-session order: while a ``session/resume`` or ``session/load`` of a session, or a
   ``session/close`` of a session not attached here, is in flight, every later request
   and notification for that session waits in the session's queue (:class:`Held`), so a
   pipelined resume + prompt does not get ``-32010``. When the call settles, whatever
   answered it, :meth:`ClientRoutes.release` hands the waiting frames out one at a time,
   in arrival order, routed as if they had just arrived; frames that arrive meanwhile
   queue behind them. Other sessions are never held. Held frames count against
   ``max_in_flight`` (held requests are in ``calls``), so the queues are bounded.
5. Nothing here does I/O or reads a clock: methods take messages and return
   :data:`Action` values that the shell carries out. Every decision is made here
   and handed out as data (which sessions attached or detached, what a resume
   came to, where a session was learned to live); the shell records it and never
   works it out again.
"""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from router.protocol import acp
from router.protocol.errors import (
    BackendLinkLost,
    InvalidParams,
    InvalidRequest,
    JsonRpcError,
    MethodNotFound,
    ProtocolError,
    SessionNotAttached,
    TooManyInFlight,
    TooManySessions,
)
from router.protocol.ids import BackendId, RoutedId, SessionId
from router.protocol.jsonrpc import (
    ErrorObject,
    Message,
    Notification,
    Request,
    RequestId,
    Response,
    encode_error,
    encode_notification,
    encode_result,
    is_request_id,
    replace_id,
    replace_param,
)


class Duty(enum.Enum):
    """Requests the router answers or routes itself."""

    INITIALIZE = "initialize"
    AUTHENTICATE = "authenticate"
    PLACE = "place"  # session/new: choose a backend
    LOCATE = "locate"  # session/resume, session/load: locate, forward, attach
    #: session/close, session/archive or session/delete of a session not attached here
    LOCATE_DETACHED = "locate_detached"
    STATUS = "status"  # session/status: answered from the pool
    LIST = "list"  # session/list: merged over the pool


@dataclass(frozen=True, slots=True)
class PendingCall:
    """A client request awaiting its one answer, and where it was sent."""

    request: Request
    session_id: SessionId | None
    backend: BackendId | None = None
    #: backends that answered this resume/load with ``-32002``, in the order tried
    tried: tuple[BackendId, ...] = ()
    #: waiting behind its session's resume/load/close (not yet routed anywhere)
    held: bool = False


@dataclass(frozen=True, slots=True)
class Attach:
    """``session_id`` is now routed to ``backend`` on this connection."""

    session_id: SessionId
    backend: BackendId


@dataclass(frozen=True, slots=True)
class Detach:
    """``session_id`` is no longer routed to ``backend`` on this connection."""

    session_id: SessionId
    backend: BackendId


Change = Attach | Detach

#: What a forwarded ``session/resume`` or ``session/load`` came to (a metric label).
ResumeResult = Literal["ok", "not_found", "error"]


@dataclass(frozen=True, slots=True)
class Settled:
    """A backend answered a forwarded call: what that changed, for the shell to record."""

    call: PendingCall
    backend: BackendId
    #: set for ``session/resume`` and ``session/load``
    resume: ResumeResult | None = None
    #: a session the answer shows living on ``backend`` (a location worth remembering)
    learned: SessionId | None = None
    changes: tuple[Change, ...] = ()


@dataclass(frozen=True, slots=True)
class Reply:
    """Send ``text`` to the client (an answer the router made).

    ``error`` is the JSON-RPC code when the answer is an error the router made
    itself (the shell counts it in ``acp_router_client_errors_total{code}``).
    """

    text: str
    error: int | None = None


def refusal(request_id: RequestId | None, error: JsonRpcError | ErrorObject) -> Reply:
    """The router's own error answer to ``request_id``: the one way such answers are made.

    ``error`` is the router's, or a backend's that the router answers in its name (a
    replayed handshake step the backend refused, so the request never reached it).
    """
    return Reply(encode_error(request_id, error), error.code)


def unreadable(error: ProtocolError) -> Reply:
    """The answer to a client frame :func:`~router.protocol.jsonrpc.parse` rejected."""
    return refusal(error.request_id, error)


@dataclass(frozen=True, slots=True)
class Send:
    """Send ``text`` to ``backend`` on this connection's link to it."""

    backend: BackendId
    text: str


@dataclass(frozen=True, slots=True)
class Broadcast:
    """Send ``text`` to each of ``backends`` (opening links as needed)."""

    backends: tuple[BackendId, ...]
    text: str


@dataclass(frozen=True, slots=True)
class Deliver:
    """Send a backend's ``text`` to the client; ``settled`` says what it answered."""

    text: str
    settled: Settled | None = None
    #: sessions the message itself attached (a ``subagent_update`` announcing a child)
    changes: tuple[Change, ...] = ()


@dataclass(frozen=True, slots=True)
class Handle:
    """The shell must carry out ``duty`` for ``request``, then answer or forward it."""

    duty: Duty
    request: Request
    session_id: SessionId | None = None


@dataclass(frozen=True, slots=True)
class Relocate:
    """``backend`` did not know the session a forwarded resume/load named after all.

    The call is back in flight, with ``backend`` added to the backends it tried: the
    shell forgets the location hint, locates again among the backends not tried yet
    and forwards (:meth:`ClientRoutes.forward`), or answers ``-32002`` when none is left.
    At most :attr:`Limits.max_resume_attempts` backends are tried per call.
    """

    request: Request
    session_id: SessionId
    backend: BackendId
    tried: tuple[BackendId, ...] = ()


@dataclass(frozen=True, slots=True)
class Lost:
    """A backend link closed: what the client is owed, and the sessions detached.

    ``withdrawn`` holds a ``$/cancel_request`` for each agent request the client was
    still answering (``requestId`` is the id the client saw); ``replies`` answer the
    client's own requests on that link.
    """

    replies: tuple[Reply, ...]
    detached: tuple[Detach, ...]
    withdrawn: tuple[Reply, ...] = ()


@dataclass(frozen=True, slots=True)
class Held:
    """Nothing to send yet: the frame waits behind ``session_id``'s resume, load or
    close; :meth:`ClientRoutes.release` hands it out once that call has settled."""

    session_id: SessionId


@dataclass(frozen=True, slots=True)
class Drop:
    """Nothing to send: the frame is ignored, for ``reason`` (logged at debug)."""

    reason: str


Action = Reply | Send | Broadcast | Deliver | Handle | Relocate | Held | Drop

#: ids the router gives a forwarded ``authenticate`` (a counter follows), so that no
#: answer to an earlier round can pass for the answer to a later request
AUTHENTICATE_ID = "acp-router:authenticate:"


@dataclass(frozen=True, slots=True)
class AuthRound:
    """The client's ``authenticate`` on its way to backends, forwarded truthfully.

    It goes to every backend the connection has a link to, or, with none yet, to the
    one the shell picks (where a ``session/new`` would go now), under a router id. The
    first refusal ends the round: the client gets that backend's own error, which says
    nothing of retrying; so backends that disagree fail closed. When every target has
    accepted, the client gets the last acceptance and the request is kept, to be
    replayed on links opened later. A target lost before it answered ends the round
    with -32013 (retryable). One round at a time.
    """

    request: Request
    routed_id: str
    waiting: frozenset[BackendId]


@dataclass(slots=True)
class _Queue:
    """One session's frames waiting behind ``holder``, its resume/load/close in flight
    (None once that call settled and the frames are being released)."""

    holder: RequestId | None
    frames: deque[Request | Notification] = field(default_factory=deque)


@dataclass(frozen=True, slots=True)
class Limits:
    """Bounds on one connection's tables: calls in flight, sessions, agent requests."""

    max_in_flight: int = 1024
    max_sessions: int = 1024
    max_agent_requests: int = 1024
    #: longest ``sessionId`` routed: longer ones are -32602 here, never a probe that an
    #: agent's frame limit could turn into a dropped control link
    max_session_id_chars: int = 1024
    #: backends one resume/load may be forwarded to before the ``-32002`` stands: the
    #: first, then the ones that cannot be probed, in rank order (:mod:`router.core.locate`)
    max_resume_attempts: int = 8


class ClientRoutes:
    """Which backend each session of one client connection lives on, and who awaits what."""

    def __init__(self, limits: Limits = Limits()) -> None:
        self.limits = limits
        #: the client's ``initialize``, and the last ``authenticate`` that every backend it
        #: went to accepted: both are replayed on every link opened later
        self.initialize: Request | None = None
        self.authenticate: Request | None = None
        self.auth_round: AuthRound | None = None
        self._auth_rounds = 0
        #: backends this connection has a link to, or is opening one to
        self.linked: set[BackendId] = set()
        self.sessions: dict[SessionId, BackendId] = {}
        self.calls: dict[RequestId, PendingCall] = {}
        self.last_backend: BackendId | None = None
        self._agent_calls: dict[RoutedId, tuple[BackendId, RequestId]] = {}
        self._next_agent_id = 0
        #: sessions held behind an attaching call, and those whose frames can go now
        self._queues: dict[SessionId, _Queue] = {}
        self._releasable: dict[SessionId, None] = {}  # an ordered set
        self._held_notifications = 0

    # -- from the client ---------------------------------------------------------------------

    def receive_client(self, message: Message) -> Action:
        """Route one message from the client."""
        if isinstance(message, Response):
            return self._client_response(message)
        if isinstance(message, Notification):
            return self._client_notification(message)
        return self._client_request(message)

    def _client_request(self, request: Request) -> Action:
        if request.id in self.calls:
            error = InvalidRequest(f"request id {request.id!r} is already in flight")
            return refusal(request.id, error)
        if self._in_flight() >= self.limits.max_in_flight:
            return refusal(request.id, TooManyInFlight())
        queue_of = self._held_session(request)
        if queue_of is not None:
            self.calls[request.id] = PendingCall(request, queue_of, held=True)
            self._queues[queue_of].frames.append(request)
            return Held(queue_of)
        return self._route_request(request)

    def _route_request(self, request: Request) -> Action:
        try:
            call, action = self._classify(request)
        except JsonRpcError as exc:
            return refusal(request.id, exc)
        self.calls[request.id] = call
        if call.session_id is not None and _holds_its_session(call, action):
            queue = self._queues.setdefault(call.session_id, _Queue(request.id))
            queue.holder = request.id
            self._releasable.pop(call.session_id, None)
        return action

    def _in_flight(self) -> int:
        return len(self.calls) + self._held_notifications

    def _held_session(self, message: Request | Notification) -> SessionId | None:
        """The session ``message`` must wait behind, if that session is held."""
        if isinstance(message, Notification) and message.method == acp.CANCEL_REQUEST:
            named = _named_request(message)
            call = self.calls.get(named) if named is not None else None
            return call.session_id if call is not None and call.held else None
        if message.method not in acp.SESSION_SCOPED:
            return None
        session_id = acp.session_id_of(message)
        return session_id if session_id in self._queues else None

    def release(self) -> Action | None:
        """The next frame that waited behind a settled resume/load/close, routed now as if
        it had just arrived; None when no frame can go.

        The shell calls this until None after every call that can answer a request
        (:meth:`receive_backend`, :meth:`answer`, :meth:`fail`, :meth:`backend_lost`), and
        carries each action out before asking for the next: that keeps the session's order.
        A released resume/load holds its session again; the frames behind it wait on.
        """
        session_id = next(iter(self._releasable), None)
        if session_id is None:
            return None
        queue = self._queues[session_id]
        frame = queue.frames.popleft()
        if not queue.frames:
            del self._queues[session_id]
            del self._releasable[session_id]
        if isinstance(frame, Notification):
            self._held_notifications -= 1
            return self._route_notification(frame)
        del self.calls[frame.id]
        return self._route_request(frame)

    def _settle(self, request_id: RequestId) -> PendingCall:
        """``request_id`` is answered: forget it; if it held its session, free the queue."""
        call = self.calls.pop(request_id)
        queue = self._queues.get(call.session_id) if call.session_id is not None else None
        if queue is not None and queue.holder == request_id and call.session_id is not None:
            queue.holder = None
            if queue.frames:
                self._releasable[call.session_id] = None
            else:
                del self._queues[call.session_id]
        return call

    def _classify(self, request: Request) -> tuple[PendingCall, Action]:
        method = request.method
        if method == acp.INITIALIZE:
            self.initialize = request
            return PendingCall(request, None), Handle(Duty.INITIALIZE, request)
        if self.initialize is None:
            raise InvalidRequest(f"send initialize before {method}")
        if method == acp.AUTHENTICATE:
            if self.auth_round is not None:
                raise InvalidRequest("an authenticate is already in flight on this connection")
            if not self.linked:
                return PendingCall(request, None), Handle(Duty.AUTHENTICATE, request)
            return PendingCall(request, None), self._authenticate(request, sorted(self.linked))
        if method == acp.SESSION_NEW:
            self._check_room(None)
            return PendingCall(request, None), Handle(Duty.PLACE, request)
        if method == acp.SESSION_LIST:
            return PendingCall(request, None), Handle(Duty.LIST, request)
        if method in acp.SESSION_SCOPED:
            return self._session_request(request)
        if self.last_backend is None:
            raise MethodNotFound(method)
        return self._forwarded(request, None, self.last_backend)

    def _session_request(self, request: Request) -> tuple[PendingCall, Action]:
        session_id = acp.session_id_of(request)
        if session_id is None:
            raise InvalidParams(f"{request.method} needs params.sessionId as a string")
        if len(session_id) > self.limits.max_session_id_chars:
            raise InvalidParams(
                f"{request.method}: params.sessionId is longer than"
                f" {self.limits.max_session_id_chars} characters"
            )
        if request.method == acp.SESSION_STATUS:
            return PendingCall(request, session_id), Handle(Duty.STATUS, request, session_id)
        backend = self.sessions.get(session_id)
        if backend is not None:
            return self._forwarded(request, session_id, backend)
        if request.method in acp.ATTACHING:
            self._check_room(session_id)
            return PendingCall(request, session_id), Handle(Duty.LOCATE, request, session_id)
        if request.method in acp.RELEASING:
            call = PendingCall(request, session_id)
            return call, Handle(Duty.LOCATE_DETACHED, request, session_id)
        raise SessionNotAttached(session_id)

    def _check_room(self, session_id: SessionId | None) -> None:
        if len(self.sessions) >= self.limits.max_sessions:
            raise TooManySessions(None, {"sessionId": session_id} if session_id else None)

    def _forwarded(
        self, request: Request, session_id: SessionId | None, backend: BackendId
    ) -> tuple[PendingCall, Send]:
        self.last_backend = backend
        self.linked.add(backend)
        return PendingCall(request, session_id, backend), Send(backend, request.text)

    def _client_notification(self, note: Notification) -> Action:
        queue_of = self._held_session(note)
        if queue_of is None:
            return self._route_notification(note)
        if self._in_flight() >= self.limits.max_in_flight:
            return Drop(f"{note.method}: too many frames held on this connection")
        self._queues[queue_of].frames.append(note)
        self._held_notifications += 1
        return Held(queue_of)

    def _route_notification(self, note: Notification) -> Action:
        if note.method == acp.CANCEL_REQUEST:
            named = _named_request(note)
            call = self.calls.get(named) if named is not None else None
            if call is None or call.backend is None:
                return Drop("$/cancel_request names no request forwarded to a backend")
            return Send(call.backend, note.text)
        if note.method in acp.SESSION_SCOPED:
            session_id = acp.session_id_of(note)
            backend = self.sessions.get(session_id) if session_id else None
            if backend is None:
                return Drop(f"{note.method} for a session not attached to this connection")
            return Send(backend, note.text)
        if self.last_backend is None:
            return Drop(f"{note.method} with no backend to send it to")
        return Send(self.last_backend, note.text)

    def _client_response(self, response: Response) -> Action:
        entry = (
            self._agent_calls.pop(RoutedId(response.id), None)
            if isinstance(response.id, int)
            else None
        )
        if entry is None:
            return Drop("a reply to no agent request")
        backend, original_id = entry
        return Send(backend, replace_id(response.text, original_id))

    # -- decisions the shell made --------------------------------------------------------------

    def forward(self, request_id: RequestId, backend: BackendId) -> Send:
        """Send a located or placed request to ``backend``."""
        call = replace(self.calls[request_id], backend=backend)
        self.calls[request_id] = call
        self.last_backend = backend
        self.linked.add(backend)
        return Send(backend, call.request.text)

    def authenticate_on(self, request_id: RequestId, backend: BackendId) -> Broadcast:
        """Send the client's ``authenticate`` to ``backend``, picked by the shell because
        the connection had no link yet (see :class:`AuthRound`)."""
        return self._authenticate(self.calls[request_id].request, [backend])

    def _authenticate(self, request: Request, targets: list[BackendId]) -> Broadcast:
        self._auth_rounds += 1
        routed_id = f"{AUTHENTICATE_ID}{self._auth_rounds}"
        self.auth_round = AuthRound(request, routed_id, frozenset(targets))
        self.linked.update(targets)
        return Broadcast(tuple(targets), replace_id(request.text, routed_id))

    def answer(self, request_id: RequestId, result: Any) -> Reply:
        """The router's own answer to a call in flight (KeyError if it was answered)."""
        self._settle(request_id)
        return Reply(encode_result(request_id, result))

    def fail(self, request_id: RequestId, error: JsonRpcError | ErrorObject) -> Reply:
        """The router's error answer to a call in flight (KeyError if it was answered)."""
        self._settle(request_id)
        return refusal(request_id, error)

    def close(self) -> tuple[Detach, ...]:
        """The client connection is gone: detach every session."""
        return tuple(self._drop_session(session_id) for session_id in list(self.sessions))

    # -- from a backend ------------------------------------------------------------------------

    def receive_backend(self, backend: BackendId, message: Message) -> Action:
        """Route one message from ``backend``."""
        if isinstance(message, Response):
            return self._backend_response(backend, message)
        if isinstance(message, Request):
            return self._agent_request(backend, message)
        if message.method == acp.CANCEL_REQUEST:
            return self._agent_cancel(backend, message)
        return Deliver(message.text, changes=self._adopt_child(backend, message))

    def _adopt_child(self, backend: BackendId, note: Notification) -> tuple[Change, ...]:
        """A ``subagent_update`` announcing a child session of a session attached here to
        ``backend``: route the child there too (its cancels and prompts follow)."""
        child = acp.announced_child(note)
        parent = acp.session_id_of(note)
        if (
            child is None
            or parent is None
            or not self._lives_on(parent, backend)
            or child in self.sessions
            or len(child) > self.limits.max_session_id_chars
        ):
            return ()
        return self._attach_quietly(child, backend)

    def _lives_on(self, session_id: SessionId, backend: BackendId) -> bool:
        """Attached to ``backend`` here, or being resumed there (its answer not yet in)."""
        if self.sessions.get(session_id) == backend:
            return True
        return any(
            call.session_id == session_id
            and call.backend == backend
            and call.request.method in acp.ATTACHING
            for call in self.calls.values()
        )

    def _backend_response(self, backend: BackendId, response: Response) -> Action:
        auth = self.auth_round
        if auth is not None and response.id == auth.routed_id and backend in auth.waiting:
            return self._authenticated(auth, backend, response)
        request_id = response.id
        call = self.calls.get(request_id) if request_id is not None else None
        if request_id is None or call is None or call.backend != backend:
            return Drop(f"a response from {backend} to no request in flight there")
        method, session_id = call.request.method, call.session_id
        if method in acp.ATTACHING and session_id is not None:
            if _not_found(response) and len(call.tried) + 1 < self.limits.max_resume_attempts:
                tried = (*call.tried, backend)
                self.calls[request_id] = replace(call, backend=None, tried=tried)
                return Relocate(call.request, session_id, backend, tried)
            self._settle(request_id)
            return Deliver(response.text, self._settle_attach(call, backend, session_id, response))
        self._settle(request_id)
        if not response.ok:
            return Deliver(response.text, self._settle_failed(call, backend, response))
        if method in acp.CREATING:
            return Deliver(response.text, self._settle_created(call, backend, response))
        if method in acp.RELEASING and session_id is not None:
            return Deliver(response.text, self._settle_close(call, backend, session_id))
        return Deliver(response.text, Settled(call, backend))

    def _authenticated(self, auth: AuthRound, backend: BackendId, response: Response) -> Action:
        waiting = auth.waiting - {backend}
        if response.ok and waiting:
            self.auth_round = replace(auth, waiting=waiting)
            return Drop(f"{backend} accepted authenticate; {len(waiting)} backend(s) to go")
        self.auth_round = None
        call = self.calls.pop(auth.request.id)
        if response.ok:
            self.authenticate = auth.request
        return Deliver(replace_id(response.text, auth.request.id), Settled(call, backend))

    def _settle_attach(
        self, call: PendingCall, backend: BackendId, session_id: SessionId, response: Response
    ) -> Settled:
        if not response.ok:
            result: ResumeResult = "not_found" if _not_found(response) else "error"
            return Settled(call, backend, result)
        changes = self._attach_quietly(session_id, backend)
        return Settled(call, backend, "ok", session_id, changes)

    def _settle_created(self, call: PendingCall, backend: BackendId, response: Response) -> Settled:
        new_id = response.member("result", "sessionId")
        if not isinstance(new_id, str):
            return Settled(call, backend)
        session_id = SessionId(new_id)
        return Settled(call, backend, None, session_id, self._attach_quietly(session_id, backend))

    def _settle_failed(self, call: PendingCall, backend: BackendId, response: Response) -> Settled:
        # -32010 from the backend itself: it no longer holds the session for this link (the
        # reference agent says so when another instance took it): stop routing it there,
        # so the client's next resume is located instead of sent back to it.
        session_id = call.session_id
        moved = response.error is not None and response.error.code == SessionNotAttached.code
        if not moved or session_id is None or self.sessions.get(session_id) != backend:
            return Settled(call, backend)
        return Settled(call, backend, changes=(self._drop_session(session_id),))

    def _settle_close(
        self, call: PendingCall, backend: BackendId, session_id: SessionId
    ) -> Settled:
        if self.sessions.get(session_id) != backend:
            return Settled(call, backend)
        return Settled(call, backend, changes=(self._drop_session(session_id),))

    def _attach_quietly(self, session_id: SessionId, backend: BackendId) -> tuple[Change, ...]:
        # The backend already holds the session for us; past the limit we still tell the
        # client what the backend said, but route nothing more for that session.
        previous = self.sessions.get(session_id)
        if previous == backend:
            return ()
        if previous is None and len(self.sessions) >= self.limits.max_sessions:
            return ()
        changes: tuple[Change, ...] = () if previous is None else (self._drop_session(session_id),)
        self.sessions[session_id] = backend
        return (*changes, Attach(session_id, backend))

    def _drop_session(self, session_id: SessionId) -> Detach:
        return Detach(session_id, self.sessions.pop(session_id))

    def _agent_request(self, backend: BackendId, request: Request) -> Action:
        if len(self._agent_calls) >= self.limits.max_agent_requests:
            error = TooManyInFlight("Too many agent requests awaiting the client")
            return Send(backend, encode_error(request.id, error))
        router_id = RoutedId(self._next_agent_id)
        self._next_agent_id += 1
        self._agent_calls[router_id] = (backend, request.id)
        return Deliver(replace_id(request.text, router_id))

    def _agent_cancel(self, backend: BackendId, note: Notification) -> Action:
        wanted = (backend, _named_request(note))
        router_id = next((rid for rid, entry in self._agent_calls.items() if entry == wanted), None)
        if router_id is None:
            return Drop("$/cancel_request for no agent request awaiting the client")
        return Deliver(replace_param(note.text, "requestId", router_id))

    def backend_lost(
        self, backend: BackendId, refused: ErrorObject | None = None, reason: str | None = None
    ) -> Lost:
        """The link to ``backend`` closed: withdraw its agent requests, fail its calls,
        detach its sessions.

        Its calls are answered -32013 (retryable, ``data.reason`` saying why when the shell
        knows), or, when the backend ``refused`` a replayed handshake step
        (``initialize``, ``authenticate``) so that nothing reached it, with the backend's
        own error. Each agent request the client was still answering is withdrawn with a
        ``$/cancel_request``; a late client answer to it is dropped.
        """
        data = {"backend": backend} if reason is None else {"backend": backend, "reason": reason}
        error: JsonRpcError | ErrorObject = refused or BackendLinkLost(None, data)
        lost = [rid for rid, call in self.calls.items() if call.backend == backend]
        auth = self.auth_round
        if auth is not None and backend in auth.waiting:
            self.auth_round = None
            lost.append(auth.request.id)
        replies = tuple(self.fail(rid, error) for rid in lost)
        detached = tuple(
            self._drop_session(s) for s in [s for s, b in self.sessions.items() if b == backend]
        )
        withdrawn = [r for r, (b, _) in self._agent_calls.items() if b == backend]
        for router_id in withdrawn:
            del self._agent_calls[router_id]
        if self.last_backend == backend:
            self.last_backend = None
        self.linked.discard(backend)
        return Lost(replies, detached, tuple(_withdraw(router_id) for router_id in withdrawn))

    def unanswered(self) -> list[RequestId]:
        """Ids of client requests still awaiting an answer."""
        return list(self.calls)


def _holds_its_session(call: PendingCall, action: Action) -> bool:
    """True for the calls later frames of their session wait behind: resume and load (they
    attach it), and a close of a session not attached here (it is being located)."""
    if call.request.method in acp.ATTACHING:
        return True
    return isinstance(action, Handle) and action.duty is Duty.LOCATE_DETACHED


def _withdraw(router_id: RoutedId) -> Reply:
    """ACP's ``$/cancel_request`` for an agent request the client saw as ``router_id``."""
    return Reply(encode_notification(acp.CANCEL_REQUEST, {"requestId": router_id}))


def _not_found(response: Response) -> bool:
    return response.error is not None and response.error.code == acp.RESOURCE_NOT_FOUND


def _named_request(note: Notification) -> RequestId | None:
    """The id a ``$/cancel_request`` names, when it is one (not a list, ``true`` or ``1.0``)."""
    named = note.param("requestId")
    return named if is_request_id(named) else None
