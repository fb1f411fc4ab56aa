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
4. Nothing here does I/O or reads a clock: methods take messages and return
   :data:`Action` values that the shell carries out.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

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
from router.protocol.jsonrpc import (
    Message,
    Notification,
    Request,
    RequestId,
    Response,
    encode_error,
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
    LOCATE_DETACHED = "locate_detached"  # session/close of a session not attached here
    STATUS = "status"  # session/status: answered from the pool
    LIST = "list"  # session/list: merged over the pool


@dataclass(frozen=True, slots=True)
class PendingCall:
    request: Request
    session_id: str | None
    backend: str | None = None
    retried: bool = False


@dataclass(frozen=True, slots=True)
class Reply:
    """Send ``text`` to the client (an answer the router made)."""

    text: str


@dataclass(frozen=True, slots=True)
class Send:
    """Send ``text`` to ``backend`` on this connection's link to it."""

    backend: str
    text: str


@dataclass(frozen=True, slots=True)
class Deliver:
    """Send a backend's ``text`` to the client; ``settled`` is the call it answers."""

    text: str
    settled: PendingCall | None = None
    response: Response | None = None


@dataclass(frozen=True, slots=True)
class Handle:
    """The shell must carry out ``duty`` for ``request``, then answer or forward it."""

    duty: Duty
    request: Request
    session_id: str | None = None


@dataclass(frozen=True, slots=True)
class Relocate:
    """A forwarded resume/load found no session: locate once more, then forward."""

    call: PendingCall
    response: Response


@dataclass(frozen=True, slots=True)
class Drop:
    reason: str


Action = Reply | Send | Deliver | Handle | Relocate | Drop


@dataclass(frozen=True, slots=True)
class Limits:
    max_in_flight: int = 1024
    max_sessions: int = 1024
    max_agent_requests: int = 1024


class ClientRoutes:
    """Which backend each session of one client connection lives on, and who awaits what."""

    def __init__(
        self, limits: Limits = Limits(), on_attach: Callable[[str, int], None] | None = None
    ) -> None:
        self.limits = limits
        #: told (backend, +1 / -1) whenever a session is attached to or detached from a backend
        self._on_attach = on_attach
        self.initialize: Request | None = None
        self.authenticate: Request | None = None
        self.sessions: dict[str, str] = {}
        self.calls: dict[RequestId, PendingCall] = {}
        self.last_backend: str | None = None
        self._agent_calls: dict[int, tuple[str, RequestId]] = {}
        self._next_agent_id = 0

    # -- from the client ---------------------------------------------------------------------

    def receive_client(self, message: Message) -> Action:
        if isinstance(message, Response):
            return self._client_response(message)
        if isinstance(message, Notification):
            return self._client_notification(message)
        return self._client_request(message)

    def _client_request(self, request: Request) -> Action:
        if request.id in self.calls:
            error = InvalidRequest(f"request id {request.id!r} is already in flight")
            return Reply(encode_error(request.id, error))
        if len(self.calls) >= self.limits.max_in_flight:
            return Reply(encode_error(request.id, TooManyInFlight()))
        try:
            call, action = self._classify(request)
        except JsonRpcError as exc:
            return Reply(encode_error(request.id, exc))
        self.calls[request.id] = call
        return action

    def _classify(self, request: Request) -> tuple[PendingCall, Action]:
        method = request.method
        if method == acp.INITIALIZE:
            return PendingCall(request, None), Handle(Duty.INITIALIZE, request)
        if self.initialize is None:
            raise InvalidRequest(f"send initialize before {method}")
        if method == acp.AUTHENTICATE:
            return PendingCall(request, None), Handle(Duty.AUTHENTICATE, request)
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
        if request.method == acp.SESSION_STATUS:
            return PendingCall(request, session_id), Handle(Duty.STATUS, request, session_id)
        backend = self.sessions.get(session_id)
        if backend is not None:
            return self._forwarded(request, session_id, backend)
        if request.method in acp.ATTACHING:
            self._check_room(session_id)
            return PendingCall(request, session_id), Handle(Duty.LOCATE, request, session_id)
        if request.method == acp.SESSION_CLOSE:
            call = PendingCall(request, session_id)
            return call, Handle(Duty.LOCATE_DETACHED, request, session_id)
        raise SessionNotAttached(session_id)

    def _check_room(self, session_id: str | None) -> None:
        if len(self.sessions) >= self.limits.max_sessions:
            raise TooManySessions(None, {"sessionId": session_id} if session_id else None)

    def _forwarded(
        self, request: Request, session_id: str | None, backend: str
    ) -> tuple[PendingCall, Send]:
        self.last_backend = backend
        return PendingCall(request, session_id, backend), Send(backend, request.text)

    def _client_notification(self, note: Notification) -> Action:
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
        entry = self._agent_calls.pop(response.id, None) if isinstance(response.id, int) else None
        if entry is None:
            return Drop("a reply to no agent request")
        backend, original_id = entry
        return Send(backend, replace_id(response.text, original_id))

    # -- decisions the shell made --------------------------------------------------------------

    def forward(self, request_id: RequestId, backend: str) -> Send:
        """Send a located or placed request to ``backend``."""
        call = replace(self.calls[request_id], backend=backend)
        self.calls[request_id] = call
        self.last_backend = backend
        return Send(backend, call.request.text)

    def answer(self, request_id: RequestId, result: Any) -> Reply:
        """The router's own answer to a call in flight (KeyError if it was answered)."""
        del self.calls[request_id]
        return Reply(encode_result(request_id, result))

    def fail(self, request_id: RequestId, error: JsonRpcError) -> Reply:
        """The router's error answer to a call in flight (KeyError if it was answered)."""
        del self.calls[request_id]
        return Reply(encode_error(request_id, error))

    def retry(self, call: PendingCall) -> None:
        """Put back a call whose backend said "not found", marked as retried once."""
        self.calls[call.request.id] = replace(call, backend=None, retried=True)

    def _set_session(self, session_id: str, backend: str) -> None:
        previous = self.sessions.get(session_id)
        if previous == backend:
            return
        if previous is not None:
            self._drop_session(session_id)
        self.sessions[session_id] = backend
        if self._on_attach is not None:
            self._on_attach(backend, 1)

    def _drop_session(self, session_id: str) -> None:
        backend = self.sessions.pop(session_id)
        if self._on_attach is not None:
            self._on_attach(backend, -1)

    def close(self) -> None:
        """The client connection is gone: detach every session."""
        for session_id in list(self.sessions):
            self._drop_session(session_id)

    # -- from a backend ------------------------------------------------------------------------

    def receive_backend(self, backend: str, message: Message) -> Action:
        if isinstance(message, Response):
            return self._backend_response(backend, message)
        if isinstance(message, Request):
            return self._agent_request(backend, message)
        if message.method == acp.CANCEL_REQUEST:
            return self._agent_cancel(backend, message)
        return Deliver(message.text)

    def _backend_response(self, backend: str, response: Response) -> Action:
        request_id = response.id
        call = self.calls.get(request_id) if request_id is not None else None
        if request_id is None or call is None or call.backend != backend:
            return Drop(f"a response from {backend} to no request in flight there")
        del self.calls[request_id]
        method, session_id = call.request.method, call.session_id
        if response.ok:
            self._settle_ok(backend, method, session_id, response)
        elif (
            method in acp.ATTACHING
            and response.error is not None
            and response.error.code == acp.RESOURCE_NOT_FOUND
            and not call.retried
        ):
            return Relocate(call, response)
        return Deliver(response.text, call, response)

    def _settle_ok(
        self, backend: str, method: str, session_id: str | None, response: Response
    ) -> None:
        if method in acp.CREATING and isinstance(response.result, dict):
            new_id = response.result.get("sessionId")
            if isinstance(new_id, str):
                self._attach_quietly(new_id, backend)
        elif method in acp.ATTACHING and session_id is not None:
            self._attach_quietly(session_id, backend)
        elif (
            method == acp.SESSION_CLOSE
            and session_id is not None
            and self.sessions.get(session_id) == backend
        ):
            self._drop_session(session_id)

    def _attach_quietly(self, session_id: str, backend: str) -> None:
        # The backend already holds the session for us; past the limit we still tell the
        # client what the backend said, but route nothing more for that session.
        if session_id in self.sessions or len(self.sessions) < self.limits.max_sessions:
            self._set_session(session_id, backend)

    def _agent_request(self, backend: str, request: Request) -> Action:
        if len(self._agent_calls) >= self.limits.max_agent_requests:
            error = TooManyInFlight("Too many agent requests awaiting the client")
            return Send(backend, encode_error(request.id, error))
        router_id = self._next_agent_id
        self._next_agent_id += 1
        self._agent_calls[router_id] = (backend, request.id)
        return Deliver(replace_id(request.text, router_id))

    def _agent_cancel(self, backend: str, note: Notification) -> Action:
        wanted = (backend, _named_request(note))
        router_id = next((rid for rid, entry in self._agent_calls.items() if entry == wanted), None)
        if router_id is None:
            return Drop("$/cancel_request for no agent request awaiting the client")
        return Deliver(replace_param(note.text, "requestId", router_id))

    def backend_lost(self, backend: str) -> list[Reply]:
        """The link to ``backend`` closed: fail its calls, detach its sessions."""
        lost = [rid for rid, call in self.calls.items() if call.backend == backend]
        replies = [self.fail(rid, BackendLinkLost(None, {"backend": backend})) for rid in lost]
        for session_id in [s for s, b in self.sessions.items() if b == backend]:
            self._drop_session(session_id)
        for router_id in [r for r, (b, _) in self._agent_calls.items() if b == backend]:
            del self._agent_calls[router_id]
        if self.last_backend == backend:
            self.last_backend = None
        return replies

    def unanswered(self) -> list[RequestId]:
        """Ids of client requests still awaiting an answer."""
        return list(self.calls)


def _named_request(note: Notification) -> RequestId | None:
    """The id a ``$/cancel_request`` names, when it is one (not a list, ``true`` or ``1.0``)."""
    named = note.param("requestId")
    return named if is_request_id(named) else None
