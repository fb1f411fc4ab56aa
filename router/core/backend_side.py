"""What a backend sends on one client connection's link, sans-I/O: its answers to the
calls forwarded to it, its own requests to the client, its notifications, and the end
of its link.

An answer settles its call (:meth:`~router.core.client_side.ClientSide.conclude`), and
what it did to the call's session is read here:

* a ``session/resume`` or ``session/load`` that succeeded attaches the session where it
  was sent; one answered ``-32002`` is located again among the backends not tried yet
  (:class:`~router.core.effects.Locate` with ``tried``), at most
  ``Limits.max_resume_attempts`` backends per call;
* a close (archive, delete) that succeeded, or that the backend answered ``-32002`` or
  ``-32010`` (it does not run the session either), detaches the session; one that
  failed otherwise leaves it attached;
* ``-32010`` from the backend itself (it no longer holds the session for this link: the
  reference agent says so when another instance took it) detaches it, so the client's
  next resume is located instead of sent back there;
* a ``session/new`` or ``session/fork`` attaches the session its result names;
* a ``subagent_update`` announcing a child session of a session that lives on that
  backend attaches the child there too.
"""

from __future__ import annotations

from router.core import outcomes
from router.core.calls import PendingCall
from router.core.client_side import ClientSide
from router.core.effects import (
    NOTHING,
    Abandoned,
    AwaitBackend,
    Change,
    Deliver,
    Dropped,
    Effect,
    Effects,
    FailedOver,
    Learned,
    Locate,
    NotThere,
    Released,
    Resumed,
    ResumeResult,
    Send,
)
from router.core.phases import Phase
from router.protocol import acp
from router.protocol.errors import (
    BackendLinkLost,
    ErrorObject,
    JsonRpcError,
    SessionNotAttached,
    TooManyInFlight,
)
from router.protocol.ids import BackendId, SessionId
from router.protocol.jsonrpc import (
    Message,
    Notification,
    Request,
    Response,
    encode_error,
    is_request_id,
)
from router.protocol.splice import replace_id, replace_param


def receive(routes: ClientSide, backend: BackendId, message: Message) -> Effects:
    """Route one message from ``backend``."""
    if isinstance(message, Response):
        return _response(routes, backend, message)
    if isinstance(message, Request):
        return _agent_request(routes, backend, message)
    if message.method == acp.CANCEL_REQUEST:
        return _agent_cancel(routes, backend, message)
    return (*_adopt_child(routes, backend, message), Deliver(message.text, message))


def relayed(message: Message) -> bool:
    """Whether :func:`receive` would return just a ``Deliver`` of ``message``'s text."""
    return (
        type(message) is Notification  # not isinstance: an answer would look up __class__
        and message.method != acp.CANCEL_REQUEST
        and acp.announced_child(message) is None
    )


def _response(routes: ClientSide, backend: BackendId, response: Response) -> Effects:
    auth = routes.auth
    if auth.answers(backend, response):
        ended = auth.heard(backend, response)
        if ended is None:
            return (Dropped(f"{backend} accepted authenticate; backends to go"),)
        answer = Deliver(replace_id(ended.response.text, ended.request.id), ended.response)
        return routes.conclude(ended.request.id, (answer,))
    if response.id is not None and routes.unanswered_on.get(response.id) == backend:
        return _late_new(routes, backend, response)
    call = routes.calls.get(response.id) if response.id is not None else None
    if call is None and response.id in routes.abandoned:
        return routes.gone(response.id, f"a response from {backend}")
    if call is None or call.backend != backend:
        return (Dropped(f"a response from {backend} to no request in flight there"),)
    method, session_id = call.request.method, call.session_id
    if method in acp.ATTACHING and session_id is not None:
        return _resumed(routes, call, backend, session_id, response)
    if method in acp.RELEASING and session_id is not None:
        return _closed(routes, call, backend, session_id, response)
    delivered: Effects = (Deliver(response.text, response),)
    if not response.ok:
        return (
            *_moved_off(routes, call, backend, response),
            *routes.conclude(call.request.id, delivered),
        )
    if method in acp.CREATING:
        created = _created(routes, call, backend, response)
        return (*created, *routes.conclude(call.request.id, delivered))
    return routes.conclude(call.request.id, delivered)


def _late_new(routes: ClientSide, backend: BackendId, response: Response) -> Effects:
    """``backend``'s answer to a ``session/new`` placed elsewhere since: the session it
    made, if any, is nobody's (:class:`~router.core.effects.Abandoned`)."""
    assert response.id is not None
    del routes.unanswered_on[response.id]
    made = response.member("result", "sessionId") if response.ok else None
    if not isinstance(made, str):
        return (Dropped(f"a late answer from {backend} to a session/new placed elsewhere"),)
    return (Abandoned(backend, SessionId(made)),)


def _resumed(
    routes: ClientSide,
    call: PendingCall,
    backend: BackendId,
    session_id: SessionId,
    response: Response,
) -> Effects:
    request_id = call.request.id
    if _not_found(response) and len(call.tried) + 1 < routes.limits.max_resume_attempts:
        tried = (*call.tried, backend)
        routes.relocating(request_id, call, tried)
        relocate = Locate(call.request, session_id, tried, call.internal, call.claimed)
        return (Resumed(backend, "not_found"), NotThere(session_id, backend), relocate)
    if call.internal:
        answered: Effect = FailedOver("ok" if response.ok else "failed", session_id)
    else:
        answered = Deliver(response.text, response)
    if not response.ok:
        result: ResumeResult = "not_found" if _not_found(response) else "error"
        return (Resumed(backend, result), *routes.conclude(request_id, (answered,)))
    learned = Learned(session_id, backend)
    concluded = routes.conclude(request_id, (answered,), attach_to=backend)
    return (Resumed(backend, "ok"), learned, *concluded)


def _closed(
    routes: ClientSide,
    call: PendingCall,
    backend: BackendId,
    session_id: SessionId,
    response: Response,
) -> Effects:
    """A close (archive, delete) answered: unless it failed for another reason than
    "not found" or "not attached" (the backend does not run it either), the session is
    detached, and counts nowhere now."""
    delivered: Effects = (Deliver(response.text, response),)
    if not (response.ok or _not_found(response) or _moved(response)):
        routes.sessions.keep(session_id)
        return routes.conclude(call.request.id, delivered)
    detached = (
        routes.sessions.detach(session_id)
        if routes.sessions.backend(session_id) == backend
        else None
    )
    changes: tuple[Change, ...] = () if detached is None else (detached,)
    return (*changes, Released(session_id), *routes.conclude(call.request.id, delivered))


def _moved_off(
    routes: ClientSide, call: PendingCall, backend: BackendId, response: Response
) -> tuple[Change, ...]:
    session_id = call.session_id
    if not _moved(response) or session_id is None or routes.sessions.backend(session_id) != backend:
        return ()
    detached = routes.sessions.detach(session_id)
    return () if detached is None else (detached,)


def _created(
    routes: ClientSide, call: PendingCall, backend: BackendId, response: Response
) -> Effects:
    new_id = response.member("result", "sessionId")
    if not isinstance(new_id, str):
        return NOTHING
    session_id = SessionId(new_id)
    attached = _attach(routes, session_id, backend, call.request)
    return (Learned(session_id, backend, created=True), *attached)


def _attach(
    routes: ClientSide, session_id: SessionId, backend: BackendId, by: Request | None = None
) -> tuple[Change, ...]:
    """Route a session a backend made or announced there, if it is not routed otherwise
    and there is room (the backend holds it for us either way)."""
    if routes.sessions.phase(session_id) not in (Phase.DETACHED, Phase.ATTACHED):
        return ()
    if not routes.room_for(session_id):
        return ()
    return routes.sessions.attach(session_id, backend, by)


def _adopt_child(routes: ClientSide, backend: BackendId, note: Notification) -> tuple[Change, ...]:
    """A ``subagent_update`` announcing a child session of a session attached here to
    ``backend``: route the child there too (its cancels and prompts follow)."""
    child = acp.announced_child(note)
    if child is None:  # nearly every update: nothing more to read
        return ()
    parent = acp.session_id_of(note)
    if (
        parent is None
        or not _lives_on(routes, parent, backend)
        or routes.sessions.phase(child) is not Phase.DETACHED
        or len(child) > routes.limits.max_session_id_chars
    ):
        return ()
    return _attach(routes, child, backend)


def _lives_on(routes: ClientSide, session_id: SessionId, backend: BackendId) -> bool:
    """Attached to ``backend`` here, or being resumed there (its answer not yet in)."""
    if routes.sessions.backend(session_id) == backend:
        return True
    resume = routes.sessions.resuming(session_id)
    call = routes.calls.get(resume) if resume is not None else None
    return call is not None and call.backend == backend


def _agent_request(routes: ClientSide, backend: BackendId, request: Request) -> Effects:
    routes.links.used(backend)  # it carries a request now: never closed as unused
    router_id = routes.agent_requests.admit(backend, request.id)
    if router_id is None:
        error = TooManyInFlight("Too many agent requests awaiting the client")
        return (Send(backend, encode_error(request.id, error)),)
    return (Deliver(replace_id(request.text, router_id), request),)


def _agent_cancel(routes: ClientSide, backend: BackendId, note: Notification) -> Effects:
    named = note.param("requestId")
    named = named if is_request_id(named) else None
    router_id = None if named is None else routes.agent_requests.router_id(backend, named)
    if router_id is None:
        return (Dropped("$/cancel_request for no agent request awaiting the client"),)
    return (Deliver(replace_param(note.text, "requestId", router_id), note),)


def lost(
    routes: ClientSide,
    backend: BackendId,
    refused: ErrorObject | None = None,
    reason: str | None = None,
) -> Effects:
    """The link to ``backend`` closed: withdraw its agent requests, fail its calls,
    detach its sessions (with failover, keep those a client attached, to be resumed
    where they live now: :mod:`router.core.failover`).

    Its calls are answered -32013 (retryable, ``data.reason`` saying why when the shell
    knows), or, when the backend ``refused`` a replayed handshake step (``initialize``,
    ``authenticate``) so that nothing reached it, with the backend's own error. Each
    agent request the client was still answering is withdrawn with a
    ``$/cancel_request``; a late client answer to it is dropped.
    """
    routes.links.lost(backend)
    for request_id in [r for r, b in routes.unanswered_on.items() if b == backend]:
        del routes.unanswered_on[request_id]  # no late answer can come on a lost link
    data = {"backend": backend} if reason is None else {"backend": backend, "reason": reason}
    error: JsonRpcError | ErrorObject = refused or BackendLinkLost(None, data)
    failed = [rid for rid, call in routes.calls.items() if call.backend == backend]
    round_request = routes.auth.lost(backend)
    if round_request is not None:
        failed.append(round_request.id)
    detached, orphaned = routes.sessions.lose(backend, orphan=routes.limits.failover)
    routes.unfollow(backend)
    effects: list[Effect] = [*detached, *routes.agent_requests.withdraw(backend)]
    for request_id in failed:
        call = routes.calls.get(request_id)
        if call is None:  # answered by a frame released meanwhile
            continue
        if call.request.method in acp.ATTACHING:
            effects.append(Resumed(backend, "link_lost"))
        effects += outcomes.fail(routes, request_id, error)
    if orphaned:
        effects.append(AwaitBackend(backend, tuple(orphaned)))
    return tuple(effects)


def _not_found(response: Response) -> bool:
    return response.error is not None and response.error.code == acp.RESOURCE_NOT_FOUND


def _moved(response: Response) -> bool:
    return response.error is not None and response.error.code == SessionNotAttached.code
