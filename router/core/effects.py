"""What the routing core of one client connection tells its shell to do: effects.

Every entry point of :class:`~router.core.routes.ClientRoutes` returns one ordered tuple of
:data:`Effect` values, and the shell carries them out in that order and does nothing
else (docs/architecture.md, "The effects channel"). Four kinds:

* frames to write: :class:`Reply` (the router's own answer to the client),
  :class:`Notify` (its own notification), :class:`Deliver` (a backend's frame to the
  client), :class:`Send` (a frame to a backend on this connection's link to it),
  :class:`CancelTurn` (the router's own ``session/cancel`` of a turn its client left);
* links to open and close: :class:`OpenLink`, :class:`CloseLink`; an ``OpenLink`` always
  comes before the first ``Send`` on that link;
* work that waits on the pool, whose outcome the shell hands back to the core:
  :class:`Initialize`, :class:`Place`, :class:`Locate`, :class:`AskPool`,
  :class:`AwaitBackend`;
* what the router learned, for the shell to record (the replica's directory, metrics,
  the log): :class:`Attach`, :class:`Detach`, :class:`Learned`, :class:`MovedAway`,
  :class:`Released`,
  :class:`NotThere`, :class:`ResumeSent`, :class:`Resumed`, :class:`FailedOver`,
  :class:`Abandoned`, :class:`Dropped`, :class:`Late`; and, for the client requests the shell observes (the
  request log, trace context), :class:`Forwarded` and :class:`Answered`.
"""

from __future__ import annotations

import enum
from typing import Literal

import msgspec

from router.protocol import acp
from router.protocol.errors import ErrorObject, JsonRpcError
from router.protocol.ids import BackendId, SessionId
from router.protocol.jsonrpc import Message, Request, RequestId, encode_error, encode_notification

# -- frames ------------------------------------------------------------------------------------


class Reply(msgspec.Struct, frozen=True):
    """Write ``text``, a message the router made, to the client.

    ``answers``: the request it answers (None: a notification). ``error``: the JSON-RPC
    code when it is an error answer (the shell counts it in
    ``acp_router_client_errors_total{code}``), and ``session_id`` the ``data.sessionId``
    it names, if any: the one member of a reply the gate may rewrite (a sealed or hinted
    id), spliced without reading the text again.
    """

    text: str
    answers: RequestId | None = None
    error: int | None = None
    session_id: str | None = None


def refusal(request_id: RequestId | None, error: JsonRpcError | ErrorObject) -> Reply:
    """The router's own error answer to ``request_id``: the one way such answers are made.

    ``error`` is the router's, or a backend's that the router answers in its name (a
    replayed handshake step the backend refused, so the request never reached it).
    """
    data = error.data if isinstance(error.data, dict) else None
    named = data.get("sessionId") if data is not None else None
    session_id = named if isinstance(named, str) else None
    return Reply(encode_error(request_id, error), request_id, error.code, session_id)


class Notify(msgspec.Struct, frozen=True):
    """Write ``text``, a notification the router made, to the client (a withdrawn agent
    request's ``$/cancel_request``)."""

    text: str


class Deliver(msgspec.Struct, frozen=True, eq=False):
    """Write a backend's frame ``text`` to the client, as it came (ids spliced);
    ``message`` is what was parsed of it (a transport may route by it)."""

    text: str
    #: derived from ``text`` (not compared): parsed once, read again by no one
    message: Message | None = None

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Deliver):
            return NotImplemented
        return self.text == other.text

    def __hash__(self) -> int:
        return hash(self.text)


class Send(msgspec.Struct, frozen=True):
    """Write ``text`` to ``backend`` on this connection's link to it."""

    backend: BackendId
    text: str


#: why a turn was left: its client connection closed or was lost, or the router is stopping
TurnEnd = Literal["client_gone", "stopping"]


class CancelTurn(msgspec.Struct, frozen=True):
    """Write ``text``, a ``session/cancel`` of ``session_id``, to ``backend`` on this
    connection's link to it, which sends it before it closes: the client connection that
    sent the session's ``session/prompt`` is gone (``why``) before its answer, and no
    other client connection of this router has the session attached there."""

    session_id: SessionId
    backend: BackendId
    text: str
    why: TurnEnd


def cancel_turn(session_id: SessionId, backend: BackendId, why: TurnEnd) -> CancelTurn:
    """The router's ``session/cancel`` of ``session_id``'s turn on ``backend``."""
    text = encode_notification(acp.SESSION_CANCEL, {"sessionId": session_id})
    return CancelTurn(session_id, backend, text, why)


# -- links -------------------------------------------------------------------------------------


class OpenLink(msgspec.Struct, frozen=True):
    """Open this connection's link to ``backend``: replay ``initialize`` (and the accepted
    ``authenticate``), then send ``first`` before anything routed there."""

    backend: BackendId
    initialize: Request
    authenticate: Request | None = None
    first: tuple[str, ...] = ()


class CloseLink(msgspec.Struct, frozen=True):
    """Close this connection's link to ``backend`` quietly: nothing was ever routed on it,
    so nothing is owed (a link opened ahead that the call did not need)."""

    backend: BackendId
    reason: str


# -- work that waits on the pool ---------------------------------------------------------------


class Initialize(msgspec.Struct, frozen=True):
    """Answer the client's ``initialize``: the shell brings what the pool advertises and
    the pool's only backend (:meth:`~router.core.routes.ClientRoutes.initialized`)."""

    request: Request


class Place(msgspec.Struct, frozen=True):
    """Choose the backend a new session would go to now, for ``request`` (a
    ``session/new``, or an ``authenticate`` on a connection with no link yet); then
    :meth:`~router.core.routes.ClientRoutes.placed`, or ``fail``."""

    request: Request


class Locate(msgspec.Struct, frozen=True):
    """Find where ``session_id`` lives, skipping the backends in ``tried`` (they answered
    this call ``-32002``); then :meth:`~router.core.routes.ClientRoutes.located`, or
    ``fail``. The router's own calls (a failover's resume) are ``internal``; ``claimed``
    is the home the client's hinted id named (:mod:`router.core.hinted_ids`), asked first
    by this locate only (:attr:`router.core.locate.Snapshot.claimed`)."""

    request: Request
    session_id: SessionId
    tried: tuple[BackendId, ...] = ()
    internal: bool = False
    claimed: BackendId | None = None


class Query(enum.Enum):
    """The pool-wide requests the router answers itself."""

    STATUS = "status"  # session/status
    LIST = "list"  # session/list


class AskPool(msgspec.Struct, frozen=True):
    """Answer ``request`` from the whole pool (``query``); then ``answer`` or ``fail``."""

    query: Query
    request: Request
    session_id: SessionId | None = None


class AwaitBackend(msgspec.Struct, frozen=True):
    """``sessions`` lost their link to ``backend`` and wait for a failover: once the
    backend is known to be back, or gone, or the wait is over, the shell hands its health
    to :meth:`~router.core.routes.ClientRoutes.backend_known`."""

    backend: BackendId
    sessions: tuple[SessionId, ...]


# -- what the router learned -------------------------------------------------------------------


class Attach(msgspec.Struct, frozen=True):
    """``session_id`` is now routed to ``backend`` on this connection."""

    session_id: SessionId
    backend: BackendId


class Detach(msgspec.Struct, frozen=True):
    """``session_id`` is no longer routed to ``backend`` on this connection."""

    session_id: SessionId
    backend: BackendId


Change = Attach | Detach


class Learned(msgspec.Struct, frozen=True):
    """An answer shows ``session_id`` living on ``backend`` (a location worth keeping);
    ``created``: it made the session there (a new id lives nowhere else)."""

    session_id: SessionId
    backend: BackendId
    created: bool = False


class MovedAway(msgspec.Struct, frozen=True):
    """``sessions`` are resumed elsewhere because ``backend`` was given up: should it come
    back as the same process, it is asked about them first (a fence)."""

    backend: BackendId
    sessions: tuple[SessionId, ...]


class Released(msgspec.Struct, frozen=True):
    """``session_id`` was closed through this router: it weighs on no backend now."""

    session_id: SessionId


class NotThere(msgspec.Struct, frozen=True):
    """``backend`` answered a forwarded resume of ``session_id`` with ``-32002``: the
    location hint was wrong, and the backend is to be skipped for a while."""

    session_id: SessionId
    backend: BackendId


#: What a forwarded ``session/resume`` or ``session/load`` came to (a metric label).
ResumeResult = Literal["ok", "not_found", "error", "link_lost"]


class ResumeSent(msgspec.Struct, frozen=True):
    """A resume or load goes out; ``retry``: located again after a ``-32002``."""

    retry: bool = False


class Resumed(msgspec.Struct, frozen=True):
    """A resume or load forwarded to ``backend`` came to ``result``."""

    backend: BackendId
    result: ResumeResult


class FailedOver(msgspec.Struct, frozen=True):
    """A failover's resume came to ``result``: ``ok``, ``failed`` or ``timeout``."""

    result: Literal["ok", "failed", "timeout"]
    session_id: SessionId | None = None


class Abandoned(msgspec.Struct, frozen=True):
    """``backend`` answered a ``session/new`` the router had placed elsewhere when
    ``backend`` left it unanswered: the session it made there (``session_id``) is
    nobody's, and is closed (on its control link)."""

    backend: BackendId
    session_id: SessionId


class Forwarded(msgspec.Struct, frozen=True):
    """An observed client ``request`` goes to ``backend`` now (again, after a
    ``-32002``). Made only for the requests the shell said it observes."""

    request: Request
    backend: BackendId


class Answered(msgspec.Struct, frozen=True):
    """An observed client ``request`` got its one answer (it comes just before in the
    same tuple), or its client left first (``gone``): what the request log and the
    request's span say of it. ``backend``: where it was last sent (None: the router
    answered it itself); ``error``: the answer's JSON-RPC error code (None: a result);
    ``session_id``: the session it is about, or the one it made. Made only for the
    requests the shell said it observes, exactly once each."""

    request: Request
    session_id: SessionId | None
    backend: BackendId | None
    error: int | None = None
    gone: bool = False


class Dropped(msgspec.Struct, frozen=True):
    """A frame was ignored, for ``reason`` (logged at debug level)."""

    reason: str


class Limited(msgspec.Struct, frozen=True):
    """A request was refused by a rate limit of the client's budget
    (:class:`~router.core.quotas.Budget`): ``kind`` what it limits, ``scope`` whose limit
    it was (counted by the shell)."""

    kind: Literal["sessions", "locates"]
    scope: str


#: what a call in flight is waiting on (the ``kind`` label of the late-answer metric)
Awaited = Literal["status", "list", "locate", "backend"]


class Late(msgspec.Struct, frozen=True):
    """An answer to a call the connection abandoned (the router is stopping, or closes
    it) came in: it is dropped quietly, and counted by what the call awaited (``kind``)."""

    kind: Awaited


Effect = (
    Reply
    | Notify
    | Deliver
    | Send
    | CancelTurn
    | OpenLink
    | CloseLink
    | Initialize
    | Place
    | Locate
    | AskPool
    | AwaitBackend
    | Attach
    | Detach
    | Learned
    | MovedAway
    | Released
    | NotThere
    | ResumeSent
    | Resumed
    | FailedOver
    | Abandoned
    | Forwarded
    | Answered
    | Dropped
    | Late
    | Limited
)

#: what every entry point of the core returns
Effects = tuple[Effect, ...]

NOTHING: Effects = ()
