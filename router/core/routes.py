"""One client connection's routing core, as its shell drives it.

:class:`ClientRoutes` is :class:`~router.core.client_side.ClientSide` (the connection's
state, and what its client sends) with what its backends send
(:mod:`router.core.backend_side`), what the shell found out (:mod:`router.core.outcomes`),
failover (:mod:`router.core.failover`) and the connection's end (:mod:`router.core.ending`).

The rules every connection keeps:

1. Every client request is recorded in ``calls`` when it arrives and leaves it when
   exactly one answer goes back: the backend's response, or an error the router makes
   (:meth:`ClientRoutes.answer`, :meth:`ClientRoutes.fail`,
   :meth:`ClientRoutes.backend_lost`, :meth:`ClientRoutes.abandon`). A request id
   already in flight is refused, and so is one in the router's own id space
   (:data:`router.protocol.ids.RESERVED_ID_PREFIX`), in a request or named by a ``$/cancel_request``.
2. Client request ids travel to backends unchanged: each backend link belongs to one
   client connection, so they cannot collide there. Agent→client request ids are
   rewritten to router-assigned integers (:mod:`router.core.agent_requests`).
3. Frames are forwarded as the text they arrived in; only ids are spliced.
   ``authenticate`` is forwarded truthfully (:mod:`router.core.authentication`).
4. Per-session order (:mod:`router.core.phases`): frames for a held session wait, and
   are routed, in arrival order, as soon as its holder settles, within the same call.
5. The links to backends are the core's to open and close (:mod:`router.core.links`).
6. One channel: every entry point returns one ordered tuple of
   :mod:`~router.core.effects`, which the shell carries out in order; nothing here does
   I/O or reads a clock.
"""

from __future__ import annotations

from typing import Any

from router.core import backend_side, ending, failover, outcomes
from router.core.calls import AttachedCount, Limits, PendingCall
from router.core.client_side import ClientSide
from router.core.effects import Change, Effects, TurnEnd
from router.core.health import Health
from router.protocol.errors import ErrorObject, JsonRpcError
from router.protocol.ids import BackendId, SessionId
from router.protocol.jsonrpc import Message, RequestId

__all__ = ["ClientRoutes", "Limits", "PendingCall"]


class ClientRoutes(ClientSide):
    def initialized(
        self, request_id: RequestId, capabilities: Any, only: BackendId | None = None
    ) -> Effects:
        """Answer ``initialize`` (:func:`router.core.outcomes.initialized`)."""
        return outcomes.initialized(self, request_id, capabilities, only)

    def placed(self, request_id: RequestId, backend: BackendId) -> Effects:
        """A :class:`~router.core.effects.Place` is over (:func:`router.core.outcomes.placed`)."""
        return outcomes.placed(self, request_id, backend)

    def located(
        self, request_id: RequestId, backend: BackendId, epoch: int | None = None
    ) -> Effects:
        """A :class:`~router.core.effects.Locate` found ``backend``; a resume goes there
        carrying ``epoch`` (:func:`router.core.outcomes.located`)."""
        return outcomes.located(self, request_id, backend, epoch)

    def replaced(self, request_id: RequestId, unanswered: BackendId, backend: BackendId) -> Effects:
        """A ``session/new`` that ``unanswered`` left unanswered goes to ``backend``
        (:func:`router.core.outcomes.replaced`)."""
        return outcomes.replaced(self, request_id, unanswered, backend)

    def waits_on(self, request_id: RequestId, backend: BackendId) -> bool:
        """Whether the call ``request_id`` is in flight on ``backend``, unanswered."""
        call = self.calls.get(request_id)
        return call is not None and call.backend == backend

    def stale_copies(
        self, session_id: SessionId, backends: frozenset[BackendId]
    ) -> tuple[Change, ...]:
        """The copies of ``session_id`` on ``backends`` were found stale (another copy is
        its home): where it is attached to one of them here, it is detached, and its
        next frames get ``-32010`` (resume it again: the resume finds the home)."""
        backend = self.sessions.backend(session_id)
        if backend is None or backend not in backends:
            return ()
        detached = self.sessions.detach(session_id)
        return () if detached is None else (detached,)

    def answer(self, request_id: RequestId, result: Any) -> Effects:
        """The router's own answer to a call (:func:`router.core.outcomes.answer`)."""
        return outcomes.answer(self, request_id, result)

    def fail(self, request_id: RequestId, error: JsonRpcError | ErrorObject) -> Effects:
        """The router's error answer to a call (:func:`router.core.outcomes.fail`)."""
        return outcomes.fail(self, request_id, error)

    def receive_backend(self, backend: BackendId, message: Message) -> Effects:
        """Route one message from ``backend`` (:func:`router.core.backend_side.receive`)."""
        return backend_side.receive(self, backend, message)

    @staticmethod
    def relays(message: Message) -> bool:
        """Whether ``message`` from a backend goes to the client as it came and changes
        nothing here: :meth:`receive_backend` would return just its ``Deliver``. True for
        a notification that is neither ``$/cancel_request`` nor a child session's
        announcement (nearly every frame an agent sends: its updates). The shell asks
        this first on the per-frame path, so that nothing is built for such a frame."""
        return backend_side.relayed(message)

    def backend_lost(
        self, backend: BackendId, refused: ErrorObject | None = None, reason: str | None = None
    ) -> Effects:
        """The link to ``backend`` closed (:func:`router.core.backend_side.lost`)."""
        return backend_side.lost(self, backend, refused, reason)

    def backend_known(
        self, backend: BackendId, sessions: tuple[SessionId, ...], health: Health
    ) -> Effects:
        """An :class:`~router.core.effects.AwaitBackend` is over, ``backend``'s ``health``
        what it is (:func:`router.core.failover.known`)."""
        return failover.known(self, backend, sessions, health)

    def client_gone(self, attached_count: AttachedCount) -> Effects:
        """The client connection is gone (:func:`router.core.ending.client_gone`)."""
        return ending.client_gone(self, attached_count)

    def abandon(
        self, error: JsonRpcError, attached_count: AttachedCount, why: TurnEnd = "stopping"
    ) -> Effects:
        """The connection is about to close: every call in flight is answered with
        ``error`` (:func:`router.core.ending.abandon`)."""
        return ending.abandon(self, error, attached_count, why)
