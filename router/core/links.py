"""One client connection's links to backends, sans-I/O: which are open, which were
opened ahead of need, and what the shell must open or close.

A connection has at most one link per backend. The core opens one when it first
routes a frame there, and may open one *ahead*: where a resume will most likely go
while its locate runs, or, in a pool of one, at ``initialize`` (:meth:`Links.open`).
A link opened ahead carries nothing until a frame is routed there; if the call it was
opened for settles elsewhere, it is closed again (:meth:`Links.done`), quietly,
since nothing is owed on it. Each method returns the effect the shell must carry out.
"""

from __future__ import annotations

from router.core.effects import CloseLink, OpenLink
from router.protocol.ids import BackendId
from router.protocol.jsonrpc import Request, RequestId


class Links:
    def __init__(self) -> None:
        self._linked: set[BackendId] = set()
        #: links opened ahead for a call that nothing was routed on yet, and that call
        self._unused: dict[BackendId, RequestId] = {}

    def __contains__(self, backend: object) -> bool:
        return backend in self._linked

    def linked(self) -> list[BackendId]:
        return sorted(self._linked)

    def used(self, backend: BackendId) -> bool:
        """A frame is routed to ``backend``: True when the link exists (it is in use from
        now on), False when it must be opened."""
        self._unused.pop(backend, None)
        return backend in self._linked

    def open(
        self,
        backend: BackendId,
        initialize: Request,
        authenticate: Request | None,
        first: str | None = None,
        *,
        ahead_for: RequestId | None = None,
    ) -> OpenLink:
        """Open the link to ``backend`` (the caller checked there is none): replaying
        ``initialize`` and ``authenticate``, then sending ``first`` before anything else.

        ``ahead_for``: nothing is routed there yet; it was opened for that call, and is
        closed when the call settles elsewhere. A link opened ahead for no call in
        particular (a pool of one), or that carries a ``first`` frame, stays.
        """
        self._linked.add(backend)
        if ahead_for is not None and first is None:
            self._unused[backend] = ahead_for
        return OpenLink(backend, initialize, authenticate, () if first is None else (first,))

    def done(self, call: RequestId) -> tuple[CloseLink, ...]:
        """``call`` has gone where it goes (or failed): close the link opened ahead for it
        if nothing was routed on it."""
        if not self._unused:  # nearly every call: nothing opened ahead
            return ()
        unused = [b for b, c in self._unused.items() if c == call]
        for backend in unused:
            del self._unused[backend]
            self._linked.discard(backend)
        return tuple(CloseLink(b, "opened ahead, not needed") for b in unused)

    def lost(self, backend: BackendId) -> None:
        """The link to ``backend`` closed (the shell saw it end)."""
        self._linked.discard(backend)
        self._unused.pop(backend, None)
