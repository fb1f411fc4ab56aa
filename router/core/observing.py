"""What the shell is told of the client requests it observes (the request log, trace
context), sans-I/O: each one's :class:`~router.core.effects.Answered`, made exactly once,
when its answer goes back."""

from __future__ import annotations

from router.core.calls import PendingCall
from router.core.effects import Answered, Deliver, Effects, Reply, refusal
from router.protocol import acp
from router.protocol.errors import JsonRpcError
from router.protocol.ids import SessionId
from router.protocol.jsonrpc import Request, Response


def refused(request: Request, error: JsonRpcError, observed: bool, max_chars: int) -> Effects:
    """The router's error answer to ``request``, which it does not take in (and, when
    ``observed``, its :class:`~router.core.effects.Answered`)."""
    reply = refusal(request.id, error)
    if not observed:
        return (reply,)
    named = acp.session_id_of(request) if request.method in acp.SESSION_SCOPED else None
    return (reply, Answered(request, loggable(named, max_chars), None, error.code))


def answered(call: PendingCall, answer: Effects, max_chars: int) -> Answered:
    """What ``answer``, the answer to an observed ``call``, says of it: its error code,
    and, for a new session, the session's id."""
    error: int | None = None
    session_id = call.session_id
    for effect in answer:
        if isinstance(effect, Reply):
            error = effect.error
        elif isinstance(effect, Deliver) and isinstance(effect.message, Response):
            response = effect.message
            if response.error is not None:
                error = response.error.code
            elif session_id is None and call.request.method in acp.CREATING:
                made = response.member("result", "sessionId")
                session_id = loggable(made if isinstance(made, str) else None, max_chars)
    return Answered(call.request, session_id, call.backend, error)


def loggable(session_id: str | None, max_chars: int) -> SessionId | None:
    """``session_id``, unless it is longer than the router routes (``max_chars``)."""
    if session_id is None or len(session_id) > max_chars:
        return None
    return SessionId(session_id)
