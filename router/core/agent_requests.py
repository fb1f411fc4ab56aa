"""Agent→client requests awaiting the client, sans-I/O: the router's ids for them.

Two backends may send requests with the same id on one client connection, so each is
given a router id (an integer, :data:`~router.protocol.ids.RoutedId`) before the client
sees it; the client's reply, and a backend's ``$/cancel_request`` naming the request,
are mapped back through this table. It holds at most ``limit`` requests. When a backend's
link ends, the client is told its requests are withdrawn (ACP's ``$/cancel_request``).
"""

from __future__ import annotations

from router.core.effects import Notify
from router.protocol import acp
from router.protocol.ids import BackendId, RoutedId
from router.protocol.jsonrpc import RequestId, encode_notification


class AgentRequests:
    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._by_router_id: dict[RoutedId, tuple[BackendId, RequestId]] = {}
        self._by_origin: dict[tuple[BackendId, RequestId], RoutedId] = {}
        self._next = 0

    def __len__(self) -> int:
        return len(self._by_router_id)

    def admit(self, backend: BackendId, original: RequestId) -> RoutedId | None:
        """The router id for ``backend``'s request ``original``; None when the table is full."""
        if len(self._by_router_id) >= self.limit:
            return None
        router_id = RoutedId(self._next)
        self._next += 1
        self._by_router_id[router_id] = (backend, original)
        self._by_origin[(backend, original)] = router_id
        return router_id

    def answered(self, router_id: RoutedId) -> tuple[BackendId, RequestId] | None:
        """The backend and its own id for the request the client answered; None when no
        such request awaits (answered already, withdrawn, or never sent)."""
        origin = self._by_router_id.pop(router_id, None)
        if origin is not None and self._by_origin.get(origin) == router_id:
            del self._by_origin[origin]
        return origin

    def router_id(self, backend: BackendId, original: RequestId) -> RoutedId | None:
        """The id the client saw for ``backend``'s request ``original``, if it awaits."""
        return self._by_origin.get((backend, original))

    def withdraw(self, backend: BackendId) -> tuple[Notify, ...]:
        """Forget every request of ``backend`` (its link closed): a ``$/cancel_request``
        for each, naming the id the client saw (a late client answer is dropped)."""
        withdrawn = [rid for rid, (b, _) in self._by_router_id.items() if b == backend]
        for router_id in withdrawn:
            self._by_origin.pop(self._by_router_id.pop(router_id), None)
        return tuple(
            Notify(encode_notification(acp.CANCEL_REQUEST, {"requestId": rid})) for rid in withdrawn
        )
