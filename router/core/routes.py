"""The routing state of one client connection, sans-I/O.

Rules this module keeps:

1. Every client request is recorded in ``calls`` when it arrives and leaves it when
   exactly one answer goes back: the backend's response, or an error the router
   makes (:meth:`ClientRoutes.answer`, :meth:`ClientRoutes.fail`,
   :meth:`ClientRoutes.backend_lost`). A request id already in flight is refused, and
   so is one in the router's own id space (``acp-router:...``).
2. Client request ids travel to backends unchanged: each backend link belongs to
   one client connection, so they cannot collide there. Agent→client request ids
   are rewritten to router-assigned integers (:mod:`router.core.agent_requests`).
3. Frames are forwarded as the text they arrived in; only ids are spliced.
   ``authenticate`` is forwarded truthfully (:mod:`router.core.authentication`).
4. Per-session order (:mod:`router.core.sessions`): while a ``session/resume`` or
   ``session/load`` of a session, or a ``session/close`` of a session not attached
   here, is in flight, every later request and notification for that session waits
   (:class:`~router.core.actions.Held`); :meth:`ClientRoutes.release` hands the waiting
   frames out one at a time, in arrival order, routed as if they had just arrived.
   Other sessions are never held. Held frames count against ``max_in_flight``.
5. The links to backends are the core's to open and close (:mod:`router.core.links`):
   a frame routed to a backend opens its link first; a link may be opened ahead of a
   locate (:meth:`ClientRoutes.open_ahead`) and is closed again if nothing was routed
   on it. The shell carries out :meth:`ClientRoutes.link_commands` before each action.
6. Nothing here does I/O or reads a clock: methods take messages and return
   :mod:`~router.core.actions` values that the shell carries out.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from router.core.actions import (
    Absorbed,
    Action,
    Broadcast,
    Change,
    Deliver,
    Drop,
    Duty,
    Handle,
    Held,
    LinkCommand,
    Lost,
    PendingCall,
    Relocate,
    Reply,
    ResumeResult,
    Send,
    Settled,
    refusal,
)
from router.core.agent_requests import AgentRequests
from router.core.authentication import Authentication, Ended
from router.core.links import Links
from router.core.sessions import Phase, SessionTable
from router.protocol import acp
from router.protocol.errors import (
    BackendLinkLost,
    InvalidParams,
    InvalidRequest,
    JsonRpcError,
    MethodNotFound,
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
    encode_request,
    encode_result,
    is_request_id,
    replace_id,
    replace_param,
)

#: the router's own request ids begin so (its handshake replays, forwarded
#: ``authenticate``): a client request id that does is refused (-32600), so that no
#: answer meant for the router can be taken for the client's, or the other way round
RESERVED_ID_PREFIX = "acp-router:"


@dataclass(frozen=True, slots=True)
class Limits:
    """Bounds on one connection's tables: calls in flight, sessions, agent requests."""

    max_in_flight: int = 1024
    #: sessions attached, counting those a call in flight may attach (a session/new,
    #: or a resume of a session not attached here)
    max_sessions: int = 1024
    max_agent_requests: int = 1024
    #: longest ``sessionId`` routed: longer ones are -32602 here, never a probe that an
    #: agent's frame limit could turn into a dropped control link
    max_session_id_chars: int = 1024
    #: backends one resume/load may be forwarded to before the ``-32002`` stands: the
    #: first, then the ones that cannot be probed, in rank order (:mod:`router.core.locate`)
    max_resume_attempts: int = 8
    #: ``[failover]``: a session whose link is lost is kept, its frames waiting, until the
    #: shell resumes it where it lives now (:meth:`ClientRoutes.fail_over`)
    failover: bool = False


#: ids of the resumes a failover makes (a counter follows): in the router's own space
FAILOVER_ID = "acp-router:failover:"


class ClientRoutes:
    """Which backend each session of one client connection lives on, and who awaits what."""

    def __init__(self, limits: Limits = Limits()) -> None:
        self.limits = limits
        #: the client's ``initialize``: replayed on every link opened
        self.initialize: Request | None = None
        self.auth = Authentication()
        self.links = Links()
        self.sessions = SessionTable()
        self.calls: dict[RequestId, PendingCall] = {}
        self.last_backend: BackendId | None = None
        self.agent_requests = AgentRequests(limits.max_agent_requests)
        self._held_notifications = 0
        self._failovers = 0

    @property
    def authenticate(self) -> Request | None:
        """The ``authenticate`` every backend it went to accepted (replayed on new links)."""
        return self.auth.accepted

    def attached(self) -> dict[SessionId, BackendId]:
        """Every session attached to this connection, and its backend."""
        return self.sessions.attached()

    def links_changed(self) -> bool:
        """Whether :meth:`link_commands` has anything to carry out."""
        return self.links.changed()

    def link_commands(self) -> tuple[LinkCommand, ...]:
        """The links to open and close, in order, before the last action is carried out."""
        return self.links.commands()

    # -- from the client ---------------------------------------------------------------------

    def receive_client(self, message: Message) -> Action:
        """Route one message from the client."""
        if isinstance(message, Response):
            return self._client_response(message)
        if isinstance(message, Notification):
            return self._client_notification(message)
        return self._client_request(message)

    def _client_request(self, request: Request) -> Action:
        if isinstance(request.id, str) and request.id.startswith(RESERVED_ID_PREFIX):
            error = InvalidRequest(f"request ids starting with {RESERVED_ID_PREFIX!r} are reserved")
            return refusal(request.id, error)
        if request.id in self.calls:
            error = InvalidRequest(f"request id {request.id!r} is already in flight")
            return refusal(request.id, error)
        if self._in_flight() >= self.limits.max_in_flight:
            return refusal(request.id, TooManyInFlight())
        queue_of = self._held_session(request)
        if queue_of is not None:
            self.calls[request.id] = PendingCall(request, queue_of, held=True)
            self.sessions.wait(queue_of, request)
            return Held(queue_of)
        return self._route_request(request)

    def _route_request(self, request: Request) -> Action:
        try:
            call, action = self._classify(request)
        except JsonRpcError as exc:
            return refusal(request.id, exc)
        self.calls[request.id] = call
        session_id = call.session_id
        if session_id is not None:
            if request.method in acp.ATTACHING:
                self.sessions.hold(session_id, request.id, Phase.ATTACHING)
            elif isinstance(action, Handle) and action.duty is Duty.LOCATE_DETACHED:
                self.sessions.hold(session_id, request.id, Phase.RELEASING)
            elif request.method in acp.RELEASING:
                self.sessions.releasing(session_id)
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
        return session_id if session_id is not None and self.sessions.holding(session_id) else None

    def any_released(self) -> bool:
        """Whether :meth:`release` has a frame to hand out (a cheap check per frame)."""
        return self.sessions.any_released()

    def release(self) -> Action | None:
        """The next frame that waited behind a settled resume/load/close, routed now as if
        it had just arrived; None when no frame can go.

        The shell calls this until None after every call that can answer a request
        (:meth:`receive_backend`, :meth:`answer`, :meth:`fail`, :meth:`backend_lost`), and
        carries each action out before asking for the next: that keeps the session's order.
        A released resume/load holds its session again; the frames behind it wait on.
        """
        frame = self.sessions.next_released()
        if frame is None:
            return None
        if isinstance(frame, Notification):
            self._held_notifications -= 1
            return self._route_notification(frame)
        del self.calls[frame.id]
        return self._route_request(frame)

    def _settle(self, request_id: RequestId) -> PendingCall:
        """``request_id`` is answered: forget it, free its session's frames, and close a
        link opened ahead for it that nothing used."""
        call = self.calls.pop(request_id)
        if call.session_id is not None:
            self.sessions.settled(call.session_id, request_id)
        self.links.settled(request_id)
        return call

    def _classify(self, request: Request) -> tuple[PendingCall, Action]:
        method = request.method
        if method == acp.INITIALIZE:
            self.initialize = request
            return PendingCall(request, None), Handle(Duty.INITIALIZE, request)
        if self.initialize is None:
            raise InvalidRequest(f"send initialize before {method}")
        if method == acp.AUTHENTICATE:
            if any(c.request.method == acp.AUTHENTICATE for c in self.calls.values()):
                raise InvalidRequest("an authenticate is already in flight on this connection")
            linked = self.links.linked()
            if not linked:
                return PendingCall(request, None), Handle(Duty.AUTHENTICATE, request)
            return PendingCall(request, None), self._authenticate(request, linked)
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
        backend = self.sessions.backend(session_id)
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
        """Room for one more session: the attached ones, and those calls in flight may
        attach, are fewer than the limit."""
        if self.sessions.count_attached() + self._may_attach() >= self.limits.max_sessions:
            raise TooManySessions(None, {"sessionId": session_id} if session_id else None)

    def _may_attach(self) -> int:
        """Calls in flight that attach a session not attached here when they succeed."""
        count = 0
        for call in self.calls.values():
            method = call.request.method
            if method in acp.CREATING or (
                method in acp.ATTACHING
                and call.session_id is not None
                and self.sessions.backend(call.session_id) is None
            ):
                count += 1
        return count

    def _forwarded(
        self, request: Request, session_id: SessionId | None, backend: BackendId
    ) -> tuple[PendingCall, Send]:
        return PendingCall(request, session_id, backend), self._send(backend, request.text)

    def _send(self, backend: BackendId, text: str) -> Send:
        """Route ``text`` to ``backend``, opening the connection's link there first."""
        self._link(backend)
        self.last_backend = backend
        return Send(backend, text)

    def _link(self, backend: BackendId) -> None:
        """Make sure the link to ``backend`` is open."""
        if not self.links.used(backend):
            self._open_link(backend)

    def _open_link(self, backend: BackendId, ahead_for: RequestId | None = None) -> None:
        """Open the link to ``backend``: a link that opens during an ``authenticate``
        round joins it."""
        assert self.initialize is not None  # nothing is routed before initialize
        first = self.auth.join(backend)
        self.links.open(backend, self.initialize, self.auth.accepted, first, ahead_for=ahead_for)

    def open_ahead(self, request_id: RequestId | None, backend: BackendId) -> None:
        """Open the link to ``backend`` now, ahead of need: where the call ``request_id``
        (a resume or load being located; None: no call, a pool of one at ``initialize``)
        will most likely go. Closed again when the call settles elsewhere, if nothing
        was routed on it; nothing happens when the link is open already."""
        if self.initialize is not None and backend not in self.links:
            self._open_link(backend, ahead_for=request_id)

    def _client_notification(self, note: Notification) -> Action:
        queue_of = self._held_session(note)
        if queue_of is None:
            return self._route_notification(note)
        if self._in_flight() >= self.limits.max_in_flight:
            return Drop(f"{note.method}: too many frames held on this connection")
        self.sessions.wait(queue_of, note)
        self._held_notifications += 1
        return Held(queue_of)

    def _route_notification(self, note: Notification) -> Action:
        if note.method == acp.CANCEL_REQUEST:
            named = _named_request(note)
            call = self.calls.get(named) if named is not None else None
            if call is None or call.backend is None:
                return Drop("$/cancel_request names no request forwarded to a backend")
            return self._send(call.backend, note.text)
        if note.method in acp.SESSION_SCOPED:
            session_id = acp.session_id_of(note)
            backend = self.sessions.backend(session_id) if session_id else None
            if backend is None:
                return Drop(f"{note.method} for a session not attached to this connection")
            return self._send(backend, note.text)
        if self.last_backend is None:
            return Drop(f"{note.method} with no backend to send it to")
        return self._send(self.last_backend, note.text)

    def _client_response(self, response: Response) -> Action:
        entry = (
            self.agent_requests.answered(RoutedId(response.id))
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
        send = self._send(backend, call.request.text)
        self.links.settled(request_id)  # a link opened ahead elsewhere is not needed
        return send

    def authenticate_on(self, request_id: RequestId, backend: BackendId) -> Broadcast:
        """Send the client's ``authenticate`` to ``backend``, picked by the shell because
        the connection had no link yet."""
        return self._authenticate(self.calls[request_id].request, [backend])

    def _authenticate(self, request: Request, targets: list[BackendId]) -> Broadcast:
        for backend in targets:
            self._link(backend)
        auth_round = self.auth.begin(request, targets)
        return Broadcast(tuple(targets), auth_round.text)

    def answer(self, request_id: RequestId, result: Any) -> Reply:
        """The router's own answer to a call in flight (KeyError if it was answered)."""
        self._settle(request_id)
        return Reply(encode_result(request_id, result))

    def fail(self, request_id: RequestId, error: JsonRpcError | ErrorObject) -> Reply:
        """The router's error answer to a call in flight (KeyError if it was answered)."""
        self._settle(request_id)
        return refusal(request_id, error)

    def close(self) -> tuple[Change, ...]:
        """The client connection is gone: detach every session."""
        detached = (self.sessions.detach(s) for s in list(self.sessions.attached()))
        return tuple(d for d in detached if d is not None)

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

    def relays(self, message: Message) -> bool:
        """Whether ``message`` from a backend goes to the client as it came and changes
        nothing here: :meth:`receive_backend` would answer a bare ``Deliver`` of its text.
        True for a notification that is neither ``$/cancel_request`` nor a child session's
        announcement (nearly every frame an agent sends: its updates). The shell asks this
        first on the per-frame path, so that nothing is built for such a frame."""
        return (
            isinstance(message, Notification)
            and message.method != acp.CANCEL_REQUEST
            and acp.announced_child(message) is None
        )

    def _adopt_child(self, backend: BackendId, note: Notification) -> tuple[Change, ...]:
        """A ``subagent_update`` announcing a child session of a session attached here to
        ``backend``: route the child there too (its cancels and prompts follow)."""
        child = acp.announced_child(note)
        if child is None:  # nearly every update: nothing more to read
            return ()
        parent = acp.session_id_of(note)
        if (
            parent is None
            or not self._lives_on(parent, backend)
            or self.sessions.backend(child) is not None
            or len(child) > self.limits.max_session_id_chars
        ):
            return ()
        return self._attach(child, backend)

    def _lives_on(self, session_id: SessionId, backend: BackendId) -> bool:
        """Attached to ``backend`` here, or being resumed there (its answer not yet in)."""
        if self.sessions.backend(session_id) == backend:
            return True
        return any(
            call.session_id == session_id
            and call.backend == backend
            and call.request.method in acp.ATTACHING
            for call in self.calls.values()
        )

    def _backend_response(self, backend: BackendId, response: Response) -> Action:
        if self.auth.answers(backend, response):
            ended = self.auth.heard(backend, response)
            if ended is None:
                return Drop(f"{backend} accepted authenticate; backends to go")
            return self._authenticated(backend, ended)
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
            settled = self._settle_attach(call, backend, session_id, response)
            if call.internal:
                return Absorbed(settled)
            return Deliver(response.text, settled)
        self._settle(request_id)
        if method in acp.RELEASING and session_id is not None:
            return Deliver(response.text, self._settle_close(call, backend, session_id, response))
        if not response.ok:
            return Deliver(response.text, self._settle_failed(call, backend, response))
        if method in acp.CREATING:
            return Deliver(response.text, self._settle_created(call, backend, response))
        return Deliver(response.text, Settled(call, backend))

    def _authenticated(self, backend: BackendId, ended: Ended) -> Action:
        call = self._settle(ended.request.id)
        return Deliver(replace_id(ended.response.text, ended.request.id), Settled(call, backend))

    def _settle_attach(
        self, call: PendingCall, backend: BackendId, session_id: SessionId, response: Response
    ) -> Settled:
        if not response.ok:
            result: ResumeResult = "not_found" if _not_found(response) else "error"
            return Settled(call, backend, result)
        changes = self._attach(session_id, backend, call.request)
        return Settled(call, backend, "ok", session_id, changes)

    def _settle_created(self, call: PendingCall, backend: BackendId, response: Response) -> Settled:
        new_id = response.member("result", "sessionId")
        if not isinstance(new_id, str):
            return Settled(call, backend)
        session_id = SessionId(new_id)
        changes = self._attach(session_id, backend, call.request)
        return Settled(call, backend, None, session_id, changes)

    def _settle_failed(self, call: PendingCall, backend: BackendId, response: Response) -> Settled:
        # -32010 from the backend itself: it no longer holds the session for this link (the
        # reference agent says so when another instance took it): stop routing it there,
        # so the client's next resume is located instead of sent back to it.
        session_id = call.session_id
        if (
            not _moved(response)
            or session_id is None
            or self.sessions.backend(session_id) != backend
        ):
            return Settled(call, backend)
        return Settled(call, backend, changes=self._detach(session_id))

    def _settle_close(
        self, call: PendingCall, backend: BackendId, session_id: SessionId, response: Response
    ) -> Settled:
        """A close (archive, delete) answered: unless it failed for another reason than
        "not found" (the backend does not have it: it is not running there either), the
        session is detached, and counts nowhere now."""
        gone = response.ok or _not_found(response) or _moved(response)
        if not gone:
            self.sessions.kept(session_id)
            return Settled(call, backend)
        changes = self._detach(session_id) if self.sessions.backend(session_id) == backend else ()
        return Settled(call, backend, changes=changes, released=session_id)

    def _attach(
        self, session_id: SessionId, backend: BackendId, by: Request | None = None
    ) -> tuple[Change, ...]:
        # The backend already holds the session for us; past the limit we still tell the
        # client what the backend said, but route nothing more for that session.
        if self.sessions.backend(session_id) is None and (
            self.sessions.count_attached() >= self.limits.max_sessions
        ):
            return ()
        return self.sessions.attach(session_id, backend, by)

    def _detach(self, session_id: SessionId) -> tuple[Change, ...]:
        detached = self.sessions.detach(session_id)
        return () if detached is None else (detached,)

    def _agent_request(self, backend: BackendId, request: Request) -> Action:
        self.links.used(backend)  # it carries a request now: never closed as unused
        router_id = self.agent_requests.admit(backend, request.id)
        if router_id is None:
            error = TooManyInFlight("Too many agent requests awaiting the client")
            return Send(backend, encode_error(request.id, error))
        return Deliver(replace_id(request.text, router_id))

    def _agent_cancel(self, backend: BackendId, note: Notification) -> Action:
        named = _named_request(note)
        router_id = None if named is None else self.agent_requests.router_id(backend, named)
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
        self.links.lost(backend)
        data = {"backend": backend} if reason is None else {"backend": backend, "reason": reason}
        error: JsonRpcError | ErrorObject = refused or BackendLinkLost(None, data)
        lost = [rid for rid, call in self.calls.items() if call.backend == backend]
        round_request = self.auth.lost(backend)
        if round_request is not None:
            lost.append(round_request.id)
        calls = tuple(self.calls[rid] for rid in lost)
        replies = tuple(r for r in (self.end(rid, error) for rid in lost) if r)
        attached = self.sessions.on(backend)
        orphaned = tuple(s for s in attached if self._orphan(s)) if self.limits.failover else ()
        detached = tuple(d for d in (self.sessions.detach(s) for s in attached) if d)
        withdrawn = self.agent_requests.withdraw(backend)
        if self.last_backend == backend:
            self.last_backend = None
        withdraws = tuple(_withdraw(rid) for rid in withdrawn)
        return Lost(replies, detached, withdraws, calls, orphaned)

    # -- failover ------------------------------------------------------------------------------

    def _orphan(self, session_id: SessionId) -> bool:
        """Keep ``session_id`` (its link was lost) for a failover: its frames wait."""
        if self.sessions.attached_by(session_id) is None or self.sessions.holding(session_id):
            return False
        self.sessions.hold(session_id, _orphan_holder(session_id), Phase.ATTACHING)
        return True

    def fail_over(self, session_id: SessionId) -> Handle | None:
        """Resume the orphaned ``session_id`` where it lives now: a ``session/resume`` the
        router makes, with the params of the client's request that attached it, to be
        located and forwarded like a client's (its answer is :class:`Absorbed`). None
        when it is no longer waiting for a failover."""
        by = self.sessions.attached_by(session_id)
        if by is None or not self.sessions.held_by(session_id, _orphan_holder(session_id)):
            return None
        self._failovers += 1
        params = {**by.params, "sessionId": session_id} if isinstance(by.params, dict) else {}
        params.setdefault("sessionId", session_id)
        request_id = f"{FAILOVER_ID}{self._failovers}"
        text = encode_request(request_id, acp.SESSION_RESUME, params)
        request = Request(request_id, acp.SESSION_RESUME, params, text)
        self.calls[request_id] = PendingCall(request, session_id, internal=True)
        self.sessions.hold(session_id, request_id, Phase.ATTACHING)
        return Handle(Duty.LOCATE, request, session_id)

    def give_up_failover(self, session_id: SessionId) -> None:
        """No failover for the orphaned ``session_id``: its waiting frames go on as for a
        session not attached here."""
        self.sessions.settled(session_id, _orphan_holder(session_id))

    def internal(self, request_id: RequestId) -> bool:
        """Whether ``request_id`` is a call the router made itself."""
        call = self.calls.get(request_id)
        return call is not None and call.internal

    def end(self, request_id: RequestId, error: JsonRpcError | ErrorObject) -> Reply | None:
        """:meth:`fail`, or for a call the router made, its quiet end (None)."""
        if self.internal(request_id):
            self._settle(request_id)
            return None
        return self.fail(request_id, error)

    def abandon(self, error: JsonRpcError) -> tuple[Reply, ...]:
        """The connection is about to close (the router is stopping): answer every request
        still in flight with ``error``, held ones included, and withdraw every agent
        request the client was still answering. Nothing is released afterwards."""
        replies = [r for r in (self.end(rid, error) for rid in list(self.calls)) if r]
        self._held_notifications = 0
        self.sessions.drop_waiting()
        self.auth.round = None
        withdrawn = [
            rid for backend in self.links.linked() for rid in self.agent_requests.withdraw(backend)
        ]
        return (*replies, *(_withdraw(rid) for rid in withdrawn))

    def unanswered(self) -> list[RequestId]:
        """Ids of client requests still awaiting an answer."""
        return list(self.calls)


def _orphan_holder(session_id: SessionId) -> str:
    """The holder an orphaned session waits behind until its failover starts."""
    return f"{FAILOVER_ID}{session_id}"


def _withdraw(router_id: RoutedId) -> Reply:
    """ACP's ``$/cancel_request`` for an agent request the client saw as ``router_id``."""
    return Reply(encode_notification(acp.CANCEL_REQUEST, {"requestId": router_id}))


def _not_found(response: Response) -> bool:
    return response.error is not None and response.error.code == acp.RESOURCE_NOT_FOUND


def _moved(response: Response) -> bool:
    return response.error is not None and response.error.code == SessionNotAttached.code


def _named_request(note: Notification) -> RequestId | None:
    """The id a ``$/cancel_request`` names, when it is one (not a list, ``true`` or ``1.0``)."""
    named = note.param("requestId")
    return named if is_request_id(named) else None
