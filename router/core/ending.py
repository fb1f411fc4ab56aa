"""The end of one client connection, sans-I/O: its client gone, or the router closing it
(:class:`Ending`: stopping, a token revoked, no ``initialize`` in time).

Either way the prompt turns the client leaves running are cancelled on their backends
(:func:`abandoned_turns`), unless another client connection of this router still has
the session attached there and stays (a stopping router closes them all); when the router closes the connection, every request still
in flight gets its one answer first (:func:`abandon`).
"""

from __future__ import annotations

from dataclasses import dataclass

from router.core.calls import AttachedCount
from router.core.client_side import ClientSide
from router.core.effects import Answered, CancelTurn, Effect, Effects, TurnEnd, cancel_turn, refusal
from router.core.frontdoor import Credentials, Principal
from router.core.phases import Lifecycle
from router.protocol import acp
from router.protocol.errors import JsonRpcError
from router.protocol.ids import BackendId, SessionId


@dataclass(frozen=True, slots=True)
class Ending:
    """Why the router ends one client connection itself: the close code it sends (RFC
    6455, on either transport), the reason, and what the turns the connection leaves
    running do (:func:`abandoned_turns`: ``"stopping"`` cancels one another connection
    holds too)."""

    code: int
    reason: str
    why: TurnEnd = "client_gone"


#: the router is stopping (1012, service restart: come back to another replica)
STOPPING = Ending(1012, "router shutting down", "stopping")
#: a reload removed the token the connection came with (1008, policy violation)
REVOKED = Ending(1008, "token revoked")


def no_initialize(within_ms: int) -> Ending:
    """The client sent no ``initialize`` within ``router.initialize_timeout_ms`` (1008)."""
    return Ending(1008, f"no initialize within {within_ms} ms")


def revoked(principal: Principal | None, credentials: Credentials | None) -> bool:
    """Whether a connection that came as ``principal`` ends when the tokens become
    ``credentials`` (a reload; None: no ``[auth]``, nothing is revoked): its token is
    no longer among them."""
    return credentials is not None and principal is not None and not credentials.admits(principal)


def client_gone(side: ClientSide, attached_count: AttachedCount) -> Effects:
    """The client connection is gone: the prompt turns it leaves running are cancelled
    (the shell lets the cancels leave on its links before they close), and every session
    is detached."""
    side.connection.gone()
    cancels = abandoned_turns(side, "client_gone", attached_count)
    gone = tuple(
        Answered(call.request, call.session_id, call.backend, gone=True)
        for call in side.calls.values()
        if call.observed
    )
    return (*cancels, *side.sessions.detach_all(), *gone)


def abandon(
    side: ClientSide, error: JsonRpcError, attached_count: AttachedCount, why: TurnEnd
) -> Effects:
    """The connection is about to close (the router is stopping, or closes it): cancel
    the prompt turns it leaves running, answer every request still in flight with
    ``error``, held ones included, withdraw every agent request the client was still
    answering, and refuse every request from now on. An answer that comes later for a
    call it answered is :class:`~router.core.effects.Late`. A router that stops closes
    every connection: another one holding the session goes too, so it does not keep
    the turn running (``why`` ``"stopping"``); one closed alone (``"client_gone"``: its
    token revoked, say) leaves a turn another connection holds to that one."""
    if side.connection.phase is Lifecycle.GONE:
        return ()  # its client went first: its turns were cancelled then, nobody to answer
    counted = _alone if why == "stopping" else attached_count
    effects: list[Effect] = list(abandoned_turns(side, why, counted))
    for request_id, call in side.stop():
        effects += side.links.done(request_id)
        if not call.internal:
            effects.append(refusal(request_id, error))
        if call.observed:
            effects.append(Answered(call.request, call.session_id, call.backend, error.code))
    for backend in side.links.linked():
        effects += side.agent_requests.withdraw(backend)
    return tuple(effects)


def _alone(session_id: SessionId, backend: BackendId) -> int:
    """No other connection counts: every one of them is closing too."""
    return 0


def abandoned_turns(
    side: ClientSide, why: TurnEnd, attached_count: AttachedCount
) -> tuple[CancelTurn, ...]:
    """A ``session/cancel`` for each turn the client leaves running: a ``session/prompt``
    forwarded to a backend and not answered, whose session no other client connection
    of this router has attached on that backend (``attached_count`` counts this one too, where
    it has the session attached). One per session and backend; none with
    ``Limits.cancel_abandoned_turns`` off."""
    if not side.limits.cancel_abandoned_turns:
        return ()
    turns: dict[tuple[SessionId, BackendId], CancelTurn] = {}
    for call in side.calls.values():
        session_id, backend = call.session_id, call.backend
        if call.request.method != acp.SESSION_PROMPT or session_id is None or backend is None:
            continue
        here = 1 if side.sessions.backend(session_id) == backend else 0
        if (session_id, backend) not in turns and attached_count(session_id, backend) <= here:
            turns[session_id, backend] = cancel_turn(session_id, backend, why)
    return tuple(turns.values())
