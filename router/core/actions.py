"""What the routing core of one client connection tells its shell to do, as values.

The core (:mod:`router.core.routes`) takes messages and returns one :data:`Action` per
call; the links to open and close come separately, in order, as :data:`LinkCommand`
values (:meth:`~router.core.routes.ClientRoutes.link_commands`), and the shell carries
those out before the action. Every decision is in these values (which sessions
attached or detached, what a resume came to, where a session was learned to live):
the shell records them and never works them out again.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Literal

from router.protocol.errors import JsonRpcError, ProtocolError
from router.protocol.ids import BackendId, SessionId
from router.protocol.jsonrpc import ErrorObject, Request, RequestId, encode_error


class Duty(enum.Enum):
    """Requests the router answers or routes itself."""

    INITIALIZE = "initialize"
    AUTHENTICATE = "authenticate"
    PLACE = "place"  # session/new: choose a backend
    LOCATE = "locate"  # session/resume, session/load: locate, forward, attach
    #: session/close, session/archive or session/delete of a session not attached here
    LOCATE_DETACHED = "locate_detached"
    STATUS = "status"  # session/status: answered from the pool
    LIST = "list"  # session/list: merged over the pool


@dataclass(frozen=True, slots=True)
class PendingCall:
    """A client request awaiting its one answer, and where it was sent."""

    request: Request
    session_id: SessionId | None
    backend: BackendId | None = None
    #: backends that answered this resume/load with ``-32002``, in the order tried
    tried: tuple[BackendId, ...] = ()
    #: waiting behind its session's resume/load/close (not yet routed anywhere)
    held: bool = False
    #: made by the router itself (a failover's resume): its answer is not the client's
    internal: bool = False


@dataclass(frozen=True, slots=True)
class Attach:
    """``session_id`` is now routed to ``backend`` on this connection."""

    session_id: SessionId
    backend: BackendId


@dataclass(frozen=True, slots=True)
class Detach:
    """``session_id`` is no longer routed to ``backend`` on this connection."""

    session_id: SessionId
    backend: BackendId


Change = Attach | Detach

#: What a forwarded ``session/resume`` or ``session/load`` came to (a metric label).
ResumeResult = Literal["ok", "not_found", "error", "link_lost"]


@dataclass(frozen=True, slots=True)
class Settled:
    """A backend answered a forwarded call: what that changed, for the shell to record."""

    call: PendingCall
    backend: BackendId
    #: set for ``session/resume`` and ``session/load``
    resume: ResumeResult | None = None
    #: a session the answer shows living on ``backend`` (a location worth remembering)
    learned: SessionId | None = None
    changes: tuple[Change, ...] = ()
    #: a session the answer closed (``session/close`` and the like): it counts nowhere now
    released: SessionId | None = None


@dataclass(frozen=True, slots=True)
class Reply:
    """Send ``text`` to the client (an answer the router made).

    ``error`` is the JSON-RPC code when the answer is an error the router made
    itself (the shell counts it in ``acp_router_client_errors_total{code}``).
    """

    text: str
    error: int | None = None


def refusal(request_id: RequestId | None, error: JsonRpcError | ErrorObject) -> Reply:
    """The router's own error answer to ``request_id``: the one way such answers are made.

    ``error`` is the router's, or a backend's that the router answers in its name (a
    replayed handshake step the backend refused, so the request never reached it).
    """
    return Reply(encode_error(request_id, error), error.code)


def unreadable(error: ProtocolError) -> Reply:
    """The answer to a client frame :func:`~router.protocol.jsonrpc.parse` rejected."""
    return refusal(error.request_id, error)


@dataclass(frozen=True, slots=True)
class Send:
    """Send ``text`` to ``backend`` on this connection's link to it."""

    backend: BackendId
    text: str


@dataclass(frozen=True, slots=True)
class Broadcast:
    """Send ``text`` to each of ``backends``."""

    backends: tuple[BackendId, ...]
    text: str


@dataclass(frozen=True, slots=True)
class Deliver:
    """Send a backend's ``text`` to the client; ``settled`` says what it answered."""

    text: str
    settled: Settled | None = None
    #: sessions the message itself attached (a ``subagent_update`` announcing a child)
    changes: tuple[Change, ...] = ()


@dataclass(frozen=True, slots=True)
class Handle:
    """The shell must carry out ``duty`` for ``request``, then answer or forward it."""

    duty: Duty
    request: Request
    session_id: SessionId | None = None


@dataclass(frozen=True, slots=True)
class Relocate:
    """``backend`` did not know the session a forwarded resume/load named after all.

    The call is back in flight, with ``backend`` added to the backends it tried: the
    shell forgets the location hint, locates again among the backends not tried yet
    and forwards (:meth:`~router.core.routes.ClientRoutes.forward`), or answers
    ``-32002`` when none is left. At most ``Limits.max_resume_attempts`` backends are
    tried per call.
    """

    request: Request
    session_id: SessionId
    backend: BackendId
    tried: tuple[BackendId, ...] = ()


@dataclass(frozen=True, slots=True)
class Lost:
    """A backend link closed: what the client is owed, and the sessions detached.

    ``withdrawn`` holds a ``$/cancel_request`` for each agent request the client was
    still answering (``requestId`` is the id the client saw); ``replies`` answer the
    client's own requests on that link, which were ``calls``.
    """

    replies: tuple[Reply, ...]
    detached: tuple[Detach, ...]
    withdrawn: tuple[Reply, ...] = ()
    calls: tuple[PendingCall, ...] = ()
    #: sessions kept for a failover (``[failover]``): their frames wait until the shell
    #: resumes them (:meth:`~router.core.routes.ClientRoutes.fail_over`) or gives up
    orphaned: tuple[SessionId, ...] = ()


@dataclass(frozen=True, slots=True)
class Absorbed:
    """A backend answered a call the router made itself (a failover's resume): record
    what it changed; the client sees nothing."""

    settled: Settled


@dataclass(frozen=True, slots=True)
class Held:
    """Nothing to send yet: the frame waits behind ``session_id``'s resume, load or
    close; :meth:`~router.core.routes.ClientRoutes.release` hands it out once that call
    has settled."""

    session_id: SessionId


@dataclass(frozen=True, slots=True)
class Drop:
    """Nothing to send: the frame is ignored, for ``reason`` (logged at debug)."""

    reason: str


Action = Reply | Send | Broadcast | Deliver | Absorbed | Handle | Relocate | Held | Drop


@dataclass(frozen=True, slots=True)
class OpenLink:
    """Open this connection's link to ``backend``: replay ``initialize`` (and the
    accepted ``authenticate``), then send ``first`` before anything routed there."""

    backend: BackendId
    initialize: Request
    authenticate: Request | None = None
    first: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class CloseLink:
    """Close this connection's link to ``backend``: nothing was ever routed on it, so
    nothing is owed (a link opened ahead that the locate did not need)."""

    backend: BackendId
    reason: str


LinkCommand = OpenLink | CloseLink
