"""Failover, sans-I/O: a session whose link was lost, resumed where it lives now.

With ``[failover] enabled``, a session a client request attached (``session/new``,
``session/resume``, ``session/load``) whose link to its backend is lost is *orphaned*
(:mod:`router.core.phases`): its frames wait, and the shell waits for its backend's
health to settle (:class:`~router.core.effects.AwaitBackend`, at most
``failover.wait_ms``). Then :func:`known` decides:

* the backend is known again (back up, or gone): each orphan is resumed by a
  ``session/resume`` the router makes itself, with the params of the client's request
  that attached it, located like a client's (the backend it lives on now); its answer
  is the router's own (:class:`~router.core.effects.FailedOver`), and the frames that
  waited go where it attached;
* the backend is still unknown when the wait is over: nothing is resumed anywhere (that
  could run the session twice); the frames that waited go on as for a session not
  attached here (the client's next prompt is told to resume first).
"""

from __future__ import annotations

from router.core.calls import PendingCall
from router.core.client_side import ClientSide
from router.core.effects import NOTHING, Effect, Effects, FailedOver, Locate, MovedAway
from router.core.health import Health
from router.core.phases import orphan_holder
from router.protocol import acp
from router.protocol.ids import BackendId, SessionId, reserved_id
from router.protocol.jsonrpc import Request, encode_request

#: ids of the resumes a failover makes (a counter follows): in the router's own space
FAILOVER_ID = reserved_id("failover:")


def known(
    routes: ClientSide, backend: BackendId, sessions: tuple[SessionId, ...], health: Health
) -> Effects:
    """``backend``'s ``health`` after the wait: what becomes of each of ``sessions``
    (orphaned when its link to ``backend`` was lost)."""
    effects: list[Effect] = []
    if health is Health.GONE:
        effects.append(MovedAway(backend, sessions))
    for session_id in sessions:
        if health is not Health.UNKNOWN:
            effects += _resume(routes, session_id)
        elif routes.sessions.held_by(session_id, orphan_holder(session_id)):
            effects.append(FailedOver("timeout", session_id))
            effects += routes.release(session_id, orphan_holder(session_id))
    return tuple(effects)


def _resume(routes: ClientSide, session_id: SessionId) -> Effects:
    """Resume the orphaned ``session_id`` where it lives now (nothing when it is no longer
    waiting for a failover: the connection was abandoned, say)."""
    by = routes.sessions.attached_by(session_id)
    if by is None or not routes.sessions.held_by(session_id, orphan_holder(session_id)):
        return NOTHING
    params = {**by.params, "sessionId": session_id} if isinstance(by.params, dict) else {}
    params.setdefault("sessionId", session_id)
    request_id = f"{FAILOVER_ID}{routes.next_failover()}"
    text = encode_request(request_id, acp.SESSION_RESUME, params)
    request = Request(request_id, acp.SESSION_RESUME, params, text)
    routes.own_call(PendingCall(request, session_id, internal=True))
    routes.sessions.resume(session_id, request_id)
    return (Locate(request, session_id, internal=True),)
