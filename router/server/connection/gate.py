"""What one client connection's frames become past the front door: (with ``[auth]
bind_sessions``) the sealing of the session ids it sees (:mod:`router.core.ownership`),
and (with ``router.hinted_ids``) the homes its ids name (:mod:`router.core.hinted_ids`).

The :class:`Gatekeeper` is the application's (the rate limits, the clock, the seal);
each client connection gets a :class:`Gate` from it, which the connection applies where
frames enter (:meth:`Gate.inbound`) and leave (:meth:`Gate.outbound`, :meth:`Gate.reply`),
and the :class:`~router.core.quotas.Budget` the routing core spends (its rules:
:mod:`router.core.quotas`). This module carries out the core's rules; it makes none.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from router.core.effects import Reply
from router.core.frontdoor import Principal
from router.core.hinted_ids import HintedSessions
from router.core.ownership import Ownership, SessionSeal
from router.core.quotas import Budget, Client, LocateQuota, SessionQuota
from router.protocol.errors import JsonRpcError
from router.protocol.ids import BackendId
from router.protocol.jsonrpc import Message, Request, RequestId, encode_error
from router.server.config import RouterSection


def _same_id(session_id: str) -> str:
    return session_id


@dataclass(frozen=True, slots=True)
class Refusal:
    """A client frame stopped at the gate: ``text`` is its answer (None: a notification,
    dropped). It goes to the client as it is, never through :meth:`Gate.reply`."""

    text: str | None
    code: int
    #: the request it answers
    answers: RequestId | None = None


class Gatekeeper:
    def __init__(
        self,
        router: RouterSection,
        clock: Callable[[], float],
        seal: SessionSeal | None,
    ) -> None:
        self.quota = SessionQuota(
            router.new_sessions_per_minute_per_address,
            router.new_sessions_per_minute,
            max_addresses=router.max_connections,
        )
        self.locates = LocateQuota(
            router.locates_per_minute_per_connection,
            router.locates_per_minute_per_address,
            max_clients=router.max_connections,
            per_principal=router.locates_per_minute_per_principal,
        )
        self.clock = clock
        self.seal = seal
        self.hinted_ids = router.hinted_ids
        self.max_sessions = router.max_sessions_per_connection

    def gate(self, address: str, principal: Principal) -> Gate:
        """The gate of one connection from ``address`` under ``principal``."""
        ownership = Ownership(self.seal, principal) if self.seal is not None else None
        hinted = HintedSessions(2 * self.max_sessions) if self.hinted_ids else None
        return Gate(self, address, ownership, hinted, Client.of(principal, address))


#: a client's message as the router routes it, and the home its hinted session id named
#: (``router.hinted_ids``): a claim, for the routing core to check, never remembered here
Passed = tuple[Message, BackendId | None]


class Gate:
    def __init__(
        self,
        keeper: Gatekeeper,
        address: str,
        ownership: Ownership | None,
        hinted: HintedSessions | None = None,
        client: Client | None = None,
    ) -> None:
        self.clock = keeper.clock
        #: the connection's share of the rate limits, which the routing core spends;
        #: whom the locate budget counts: the token's principal, or the address
        self.budget = Budget(
            keeper.quota,
            keeper.locates,
            address,
            client or Client("address", address),
            keeper.clock(),
        )
        self._ownership = ownership
        self._hinted = hinted

    def inbound(self, message: Message) -> Passed | Refusal:
        """A client's message as the router routes it (and the home its hinted session id
        named), or why it goes no further."""
        try:
            if self._ownership is not None:
                message = self._ownership.inbound(message)
            if self._hinted is not None:
                return self._hinted.inbound(message)
            return message, None
        except JsonRpcError as exc:
            request_id: RequestId | None = message.id if isinstance(message, Request) else None
            text = encode_error(request_id, exc) if request_id is not None else None
            return Refusal(text, exc.code, request_id)

    def outbound(self, message: Message, backend: BackendId) -> Message:
        """A message from ``backend`` as the client may see it."""
        hinted = self._hinted
        if hinted is not None:
            hinted.learn(message, backend)
            if self._ownership is None:
                return hinted.outbound(message)
            return self._ownership.outbound(message, hinted.client_id)
        return message if self._ownership is None else self._ownership.outbound(message)

    def reply(self, reply: Reply) -> str:
        """A reply the router made, as the client may see it (the session id its error
        names, rewritten: :attr:`~router.core.effects.Reply.session_id`)."""
        hinted = self._hinted
        if self._ownership is not None:
            rename = hinted.client_id if hinted else _same_id
            return self._ownership.reply(reply.text, reply.session_id, rename)
        return reply.text if hinted is None else hinted.reply(reply.text, reply.session_id)

    def capabilities(self, capabilities: dict[str, Any]) -> dict[str, Any]:
        """What the router advertises to this client."""
        return (
            capabilities if self._ownership is None else self._ownership.capabilities(capabilities)
        )
