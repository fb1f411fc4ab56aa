"""One client connection's routing core, as its shell drives it.

:class:`ClientRoutes` is :class:`~router.core.client_side.ClientSide` (the connection's
state, and what its client sends) with what its backends send
(:mod:`router.core.backend_side`) and failover (:mod:`router.core.failover`). Every
method returns one ordered tuple of :mod:`~router.core.effects`.
"""

from __future__ import annotations

from router.core import backend_side, failover
from router.core.calls import Limits, PendingCall
from router.core.client_side import ClientSide
from router.core.effects import Effects
from router.core.health import Health
from router.protocol.errors import ErrorObject
from router.protocol.ids import BackendId, SessionId
from router.protocol.jsonrpc import Message

__all__ = ["ClientRoutes", "Limits", "PendingCall"]


class ClientRoutes(ClientSide):
    def receive_backend(self, backend: BackendId, message: Message) -> Effects:
        """Route one message from ``backend``."""
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
