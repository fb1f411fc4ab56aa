"""What one client connection's frames become past the front door, sans-I/O: (with
``[auth] bind_sessions``) the sealing of the session ids it sees
(:mod:`router.core.ownership`), and (with ``router.hinted_ids``) the homes its ids name
(:mod:`router.core.hinted_ids`); and the connection's share of the rate limits
(:class:`~router.core.quotas.Budget`), which :class:`~router.core.client_side.ClientSide`
spends.

The connection applies its :class:`Gate` where frames enter (:meth:`Gate.inbound`: a
frame refused here is answered with the :class:`Refusal` it gets, never routed) and
leave (:meth:`Gate.outbound`, :meth:`Gate.reply`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, final

from router.core.effects import Reply
from router.core.hinted_ids import HintedSessions
from router.core.ownership import Ownership
from router.core.quotas import Budget
from router.protocol.errors import JsonRpcError
from router.protocol.ids import BackendId
from router.protocol.jsonrpc import Message, Request, RequestId, encode_error


def _same_id(session_id: str) -> str:
    return session_id


@final
@dataclass(frozen=True, slots=True)
class Refusal:
    """A client frame stopped at the gate: ``text`` is its answer (None: a notification,
    dropped). It goes to the client as it is, never through :meth:`Gate.reply`."""

    text: str | None
    code: int
    #: the request it answers
    answers: RequestId | None = None


#: a client's message as the router routes it, and the home its hinted session id named
#: (``router.hinted_ids``): a claim, for the routing core to check, never remembered here
Passed = tuple[Message, BackendId | None]


class Gate:
    def __init__(
        self,
        budget: Budget,
        ownership: Ownership | None = None,
        hinted: HintedSessions | None = None,
    ) -> None:
        #: the connection's share of the rate limits, which the routing core spends
        self.budget = budget
        self._ownership = ownership
        self._hinted = hinted

    @property
    def rewrites(self) -> bool:
        """Whether frames change on their way (sealed or hinted ids): if not,
        :meth:`outbound` returns every message as it is."""
        return self._ownership is not None or self._hinted is not None

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
