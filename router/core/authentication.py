"""A client's ``authenticate``, forwarded truthfully, sans-I/O.

The router holds no credentials and never answers ``authenticate`` itself. A round
sends the client's frame, under a router id, to every backend the connection has a
link to (or, with none yet, to the one the shell picks: where a ``session/new`` would
go now). A link that opens while the round is in flight joins it: the frame goes there
too, before anything routed on it, and the round waits for that backend as well.

The first refusal ends the round: the client gets that backend's own error, which says
nothing of retrying; so backends that disagree fail closed. When every target has
accepted, the client gets the last acceptance, and the request is kept, to be replayed
in the handshake of every link opened later. A target lost before it answered ends the
round with -32013 (retryable). One round at a time.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from router.protocol.ids import BackendId, reserved_id
from router.protocol.jsonrpc import Request, Response
from router.protocol.splice import replace_id

#: ids the router gives a forwarded ``authenticate`` (a counter follows), so that no
#: answer to an earlier round can pass for the answer to a later request
AUTHENTICATE_ID = reserved_id("authenticate:")


@dataclass(slots=True)
class AuthRound:
    """One ``authenticate`` on its way: the backends it still waits for."""

    request: Request
    routed_id: str
    waiting: set[BackendId]

    @property
    def text(self) -> str:
        """The frame each target gets: the client's, under the round's id."""
        return replace_id(self.request.text, self.routed_id)


@dataclass(frozen=True, slots=True)
class Ended:
    """The round is over: ``response`` is the answer the client gets (the last
    acceptance, or the first refusal)."""

    request: Request
    response: Response
    accepted: bool


class Authentication:
    """The connection's accepted ``authenticate``, and the round in flight."""

    def __init__(self) -> None:
        #: the last ``authenticate`` every backend it went to accepted: replayed on every
        #: link opened later
        self.accepted: Request | None = None
        self.round: AuthRound | None = None
        self._rounds = 0

    def begin(self, request: Request, targets: Iterable[BackendId]) -> AuthRound:
        """Start a round (the caller checked none is in flight)."""
        self._rounds += 1
        self.round = AuthRound(request, f"{AUTHENTICATE_ID}{self._rounds}", set(targets))
        return self.round

    def join(self, backend: BackendId) -> str | None:
        """A link to ``backend`` is opening: the frame it must send first, if a round is
        in flight."""
        if self.round is None:
            return None
        self.round.waiting.add(backend)
        return self.round.text

    def answers(self, backend: BackendId, response: Response) -> bool:
        """Whether ``response`` from ``backend`` answers the round in flight."""
        auth = self.round
        return auth is not None and response.id == auth.routed_id and backend in auth.waiting

    def heard(self, backend: BackendId, response: Response) -> Ended | None:
        """``backend`` answered the round (:meth:`answers`); the end, if this ends it."""
        auth = self.round
        assert auth is not None
        auth.waiting.discard(backend)
        if response.ok and auth.waiting:
            return None
        self.round = None
        if response.ok:
            self.accepted = auth.request
        return Ended(auth.request, response, response.ok)

    def lost(self, backend: BackendId) -> Request | None:
        """``backend``'s link closed: the round's request, if that ends the round."""
        auth = self.round
        if auth is None or backend not in auth.waiting:
            return None
        self.round = None
        return auth.request
