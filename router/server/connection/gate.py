"""The rate limits, the clock and the seal every client connection's gate is made from
(:class:`Gatekeeper`, the application's): the gate itself, what frames become past the
front door, is the core's (:class:`router.core.gate.Gate`). This module reads the
configuration into the core's objects; it makes no decision.
"""

from __future__ import annotations

from collections.abc import Callable

from router.core.frontdoor import Principal
from router.core.gate import Gate
from router.core.hinted_ids import HintedSessions
from router.core.ownership import Ownership, SessionSeal
from router.core.quotas import Budget, Client, LocateQuota, SessionQuota
from router.server.config import RouterSection


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
        # whom the locate budget counts: the token's principal, or the address
        client = Client.of(principal, address)
        budget = Budget(self.quota, self.locates, address, client, self.clock())
        return Gate(budget, ownership, hinted)
