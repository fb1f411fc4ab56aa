"""What one client connection may do past the front door: the new-session quota of its
address and of the process, and (with ``[auth] bind_sessions``) the sealing of the
session ids it sees (:mod:`router.core.ownership`).

The :class:`Gatekeeper` is the application's (the buckets, the clock, the seal); each
client connection gets a :class:`Gate` from it, which the connection applies where
frames enter (:meth:`Gate.inbound`) and leave (:meth:`Gate.outbound`, :meth:`Gate.reply`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from router.core.effects import Reply
from router.core.frontdoor import Principal
from router.core.hinted_ids import HintedSessions
from router.core.ownership import Ownership, SessionSeal
from router.core.quotas import Client, LocateQuota, SessionQuota
from router.protocol import acp
from router.protocol.errors import JsonRpcError, TooManyLocates, TooManyNewSessions
from router.protocol.ids import BackendId
from router.protocol.jsonrpc import Message, Request, RequestId, encode_error
from router.server.config import RouterSection
from router.server.metrics import Metrics


def _same_id(session_id: str) -> str:
    return session_id


#: the metric label of each session limit
_LIMIT_LABELS = {"address": "sessions_per_address", "process": "sessions"}
#: and of each locate limit
_LOCATE_LABELS = {
    "connection": "locates_per_connection",
    "address": "locates_per_address",
    "principal": "locates_per_principal",
}


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
        metrics: Metrics,
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
        self.metrics = metrics
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
        self._keeper = keeper
        self._address = address
        #: whom the locate budget counts: the token's principal, or the address
        self._client = client or Client("address", address)
        self._ownership = ownership
        self._hinted = hinted
        self._locates = keeper.locates.connection_bucket(keeper.clock())

    def inbound(self, message: Message) -> Passed | Refusal:
        """A client's message as the router routes it (and the home its hinted session id
        named), or why it goes no further."""
        try:
            if isinstance(message, Request) and message.method in acp.CREATING:
                self._count_new_session()
            if self._ownership is not None:
                message = self._ownership.inbound(message)
            if self._hinted is not None:
                return self._hinted.inbound(message)
            return message, None
        except JsonRpcError as exc:
            request_id: RequestId | None = message.id if isinstance(message, Request) else None
            text = encode_error(request_id, exc) if request_id is not None else None
            return Refusal(text, exc.code, request_id)

    def _count_new_session(self) -> None:
        refused = self._keeper.quota.admit(self._address, self._keeper.clock())
        if refused is not None:
            scope, wait = refused
            self._keeper.metrics.limited.labels(_LIMIT_LABELS[scope]).inc()
            raise TooManyNewSessions(scope, math.ceil(wait * 1000))

    def count_locate(self) -> None:
        """A client's request the routing core sends to be located or to the pool's status
        (it may ask every backend): within this connection's and address's budget.

        Raises:
            TooManyLocates: over it (a request routed to where its session is attached
                costs no locate, and is never counted).
        """
        keeper = self._keeper
        refused = keeper.locates.admit(self._client, self._locates, keeper.clock())
        if refused is not None:
            scope, wait = refused
            keeper.metrics.limited.labels(_LOCATE_LABELS[scope]).inc()
            raise TooManyLocates(scope, math.ceil(wait * 1000))

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
