"""One client connection's calls in flight, and the bounds on its tables, sans-I/O."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import msgspec

from router.core import defaults
from router.core.effects import Awaited
from router.protocol import acp
from router.protocol.ids import BackendId, SessionId
from router.protocol.jsonrpc import Request


@dataclass(frozen=True, slots=True)
class Limits:
    """Bounds on one connection's tables: calls in flight, sessions, agent requests
    (the defaults: :mod:`router.core.defaults`, the config's too)."""

    max_in_flight: int = defaults.MAX_IN_FLIGHT_PER_CONNECTION
    #: sessions attached, counting those a call in flight may attach (a session/new,
    #: or a resume of a session not attached here)
    max_sessions: int = defaults.MAX_SESSIONS_PER_CONNECTION
    max_agent_requests: int = defaults.MAX_AGENT_REQUESTS
    #: longest ``sessionId`` routed: longer ones are -32602 here, never a probe that an
    #: agent's frame limit could turn into a dropped control link
    max_session_id_chars: int = defaults.MAX_SESSION_ID_CHARS
    #: backends one resume/load may be forwarded to before the ``-32002`` stands: the
    #: first, then the ones that cannot be probed, in rank order (:mod:`router.core.locate`)
    max_resume_attempts: int = defaults.MAX_RESUME_ATTEMPTS
    #: ``[failover]``: a session whose link is lost is kept, its frames waiting, until
    #: it is resumed where it lives now (:mod:`router.core.failover`)
    failover: bool = defaults.FAILOVER_ENABLED
    #: ``router.cancel_abandoned_turns``: a prompt turn the client leaves running when its
    #: connection goes is cancelled on its backend (:meth:`~router.core.routes.ClientRoutes.client_gone`)
    cancel_abandoned_turns: bool = defaults.CANCEL_ABANDONED_TURNS


class PendingCall(msgspec.Struct, frozen=True, gc=False):
    """A client request awaiting its one answer, and where it was sent (a frozen struct,
    made in C: one is made for every request, and a frozen dataclass of these fields
    cost 0.9 us to make, against 0.06)."""

    request: Request
    session_id: SessionId | None
    backend: BackendId | None = None
    #: backends that answered this resume/load with ``-32002``, in the order tried
    tried: tuple[BackendId, ...] = ()
    #: waiting behind its session's holder (not yet routed anywhere)
    held: bool = False
    #: made by the router itself (a failover's resume): its answer is not the client's
    internal: bool = False
    #: the shell observes it (request log, trace context): its forwards and its answer
    #: are told (:class:`~router.core.effects.Forwarded`, :class:`~router.core.effects.Answered`)
    observed: bool = False
    #: the home the client's hinted id named, for this call's locates only
    claimed: BackendId | None = None
    #: when it came (the shell's clock): a held call spends the client's budget, once
    #: routed, as of then
    arrived: float = 0.0

    @property
    def awaits(self) -> Awaited | None:
        """What its answer is waiting on: the pool's status or list, a locate, or a
        backend's response; None while it is held (nothing was asked for it yet)."""
        if self.held:
            return None
        method = self.request.method
        if method == acp.SESSION_STATUS:
            return "status"
        if method == acp.SESSION_LIST:
            return "list"
        if self.backend is None and (method in acp.ATTACHING or method in acp.RELEASING):
            return "locate"
        return "backend"

    def may_attach(self, attached_to: Callable[[SessionId], BackendId | None]) -> bool:
        """Whether its answer may attach a session not attached here now: a
        ``session/new`` or fork, or a resume or load of a session ``attached_to`` puts
        nowhere."""
        method = self.request.method
        if method in acp.CREATING:
            return True
        return (
            method in acp.ATTACHING
            and self.session_id is not None
            and attached_to(self.session_id) is None
        )


#: how many client connections of this router have a session attached on a backend
#: (:meth:`router.core.directory.Directory.attached_count`), this one included
AttachedCount = Callable[[SessionId, BackendId], int]
