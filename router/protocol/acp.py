"""What acp-router knows about ACP itself, sans-I/O: method names, which methods are
session-scoped and where their ``sessionId`` lives, capability markers, and how to
read a ``session/status`` answer.

Everything else in an ACP message is opaque to the router and is forwarded as it
came.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Final

from router.protocol.ids import SessionId
from router.protocol.jsonrpc import UPDATE_KIND, Notification, Request, Response

PROTOCOL_VERSION: Final = 1

#: where a backend that reports a per-process nonce puts it: ``_meta`` of its
#: ``initialize`` result (the reference agent and ``acp-router host`` do; the router's
#: health reads it to see a restarted process)
INSTANCE_META_KEY: Final = "instanceId"

#: where a backend may report when an active session last did anything (its last
#: prompt, turn or attach): ``_meta`` of a ``session/status`` result, milliseconds since
#: the Unix epoch. The reference agent does; when two backends report one session
#: active, every router replica reads the same times and keeps the same copy.
LAST_ACTIVITY_META_KEY: Final = "lastActivity"

#: a session copy's epoch, a fencing token (docs/routing.md, "Split brain found is split
#: brain ended"): the router puts one in ``params._meta`` of every resume or load it
#: locates, above any epoch a copy of the session reported; an agent that keeps it with
#: the session (the reference agent and ``acp-router host`` do) reports its copy's in
#: ``_meta`` of its ``session/status`` results. Of two active copies the one with the
#: higher epoch is the session's home for every replica.
EPOCH_META_KEY: Final = "acp-router/epoch"

#: The transport RFD's headers: the connection (on initialize's 200 and a WebSocket's
#: 101, then on every HTTP request of the connection), and the session a POST or an
#: event stream is about.
CONNECTION_ID_HEADER: Final = "Acp-Connection-Id"
SESSION_ID_HEADER: Final = "Acp-Session-Id"

# client -> agent
INITIALIZE: Final = "initialize"
AUTHENTICATE: Final = "authenticate"
SESSION_NEW: Final = "session/new"
SESSION_LOAD: Final = "session/load"
SESSION_RESUME: Final = "session/resume"
SESSION_LIST: Final = "session/list"
SESSION_CLOSE: Final = "session/close"
SESSION_PROMPT: Final = "session/prompt"
SESSION_CANCEL: Final = "session/cancel"
SESSION_STATUS: Final = "session/status"
SESSION_FORK: Final = "session/fork"
SESSION_ARCHIVE: Final = "session/archive"
SESSION_DELETE: Final = "session/delete"
CANCEL_REQUEST: Final = "$/cancel_request"

# agent -> client
SESSION_UPDATE: Final = "session/update"
REQUEST_PERMISSION: Final = "session/request_permission"

# session/update kinds the router reads
SUBAGENT_UPDATE: Final = "subagent_update"
STATE_UPDATE: Final = "state_update"

#: Client->agent methods whose ``params.sessionId`` names the session they act on.
#: (Agent->client methods carry one too, but the router routes those by link, not by id.)
SESSION_SCOPED: Final = frozenset(
    {
        SESSION_LOAD,
        SESSION_RESUME,
        SESSION_CLOSE,
        SESSION_PROMPT,
        SESSION_CANCEL,
        SESSION_STATUS,
        SESSION_DELETE,
        SESSION_ARCHIVE,
        "session/set_mode",
        "session/set_config_option",
        "session/set_model",
        SESSION_FORK,
    }
)

#: Methods that attach a session to the connection that sends them.
ATTACHING: Final = frozenset({SESSION_LOAD, SESSION_RESUME})

#: Methods that end a session's life in memory, like ``session/close``.
RELEASING: Final = frozenset({SESSION_CLOSE, SESSION_ARCHIVE, SESSION_DELETE})

#: Methods whose result names a session they created (``result.sessionId``), on the
#: backend that answered.
CREATING: Final = frozenset({SESSION_NEW, SESSION_FORK})

#: ACP's "Resource not found"; the RFD's answer for an unknown session.
RESOURCE_NOT_FOUND: Final = -32002
METHOD_NOT_FOUND: Final = -32601


def session_id_of(message: Request | Notification) -> SessionId | None:
    """The ``params.sessionId`` of a session-scoped message, when it is a string."""
    value = message.param("sessionId")
    return SessionId(value) if isinstance(value, str) else None


class SessionOutcome(enum.Enum):
    """What an answered request did to the session it names."""

    HELD = "held"  # made (new, fork) or attached (load, resume): the caller has it now
    RELEASED = "released"  # closed, archived or deleted (or the agent knew it no more)


def session_outcome(
    request: Request, response: Response
) -> tuple[SessionOutcome, SessionId] | None:
    """What ``response`` to ``request`` did to a session, as ACP's methods say, or None:
    a session made or attached is held; one closed, archived or deleted is released, as
    it is when the agent answers ``-32002`` (it has no such session)."""
    method = request.method
    if method in CREATING:
        created = response.member("result", "sessionId") if response.ok else None
        return (SessionOutcome.HELD, SessionId(created)) if isinstance(created, str) else None
    session_id = session_id_of(request)
    if session_id is None:
        return None
    if method in ATTACHING and response.ok:
        return SessionOutcome.HELD, session_id
    gone = response.error is not None and response.error.code == RESOURCE_NOT_FOUND
    if method in RELEASING and (response.ok or gone):
        return SessionOutcome.RELEASED, session_id
    return None


def announced_child(note: Notification) -> SessionId | None:
    """The child session a ``session/update`` carrying a ``subagent_update`` names.

    The parent session (``params.sessionId``) created and owns the child
    (``params.update.sessionId``); the first such update announces it, before any
    message naming the child.
    """
    if note.method != SESSION_UPDATE:
        return None
    text = note.text  # asked of every update an agent streams: nearly all are not this kind
    if SUBAGENT_UPDATE not in text and "\\u" not in text:
        return None  # a JSON string could hide a letter of the kind only as a \u escape
    if not note.member_is(UPDATE_KIND, SUBAGENT_UPDATE):
        return None
    child = note.member("params", "update", "sessionId")
    return SessionId(child) if isinstance(child, str) else None


# -- capabilities --------------------------------------------------------------------------------


def session_capabilities(initialize_result: Any) -> dict[str, Any]:
    """The session capabilities of an initialize result, or ``{}``: v1's
    ``agentCapabilities.sessionCapabilities``, or v2's ``capabilities.session``."""
    if not isinstance(initialize_result, dict):
        return {}
    agent = initialize_result.get("agentCapabilities")
    caps = agent.get("sessionCapabilities") if isinstance(agent, dict) else None
    if caps is None:
        v2 = initialize_result.get("capabilities")
        caps = v2.get("session") if isinstance(v2, dict) else None
    return caps if isinstance(caps, dict) else {}


def has_session_capability(initialize_result: Any, name: str) -> bool:
    """True when the agent advertises ``sessionCapabilities.<name>`` as an object.

    The RFD: "an invalid value means the capability is unsupported", and markers are
    objects, so ``true`` or ``null`` do not count.
    """
    return isinstance(session_capabilities(initialize_result).get(name), dict)


def with_status_capability(initialize_result: dict[str, Any]) -> dict[str, Any]:
    """``initialize_result`` advertising ``session/status`` too, everything else as it was:
    v1 ``agentCapabilities.sessionCapabilities.status``, or v2 ``capabilities.session.status``
    for a result in the v2 layout."""
    session = {**session_capabilities(initialize_result), "status": {}}
    v2 = initialize_result.get("capabilities")
    if isinstance(v2, dict) and "agentCapabilities" not in initialize_result:
        return {**initialize_result, "capabilities": {**v2, "session": session}}
    agent = initialize_result.get("agentCapabilities")
    agent = dict(agent) if isinstance(agent, dict) else {}
    agent["sessionCapabilities"] = session
    return {**initialize_result, "agentCapabilities": agent}


def foreground_state(snapshot: Any) -> dict[str, Any] | None:
    """A v2 ``StateUpdate`` snapshot (``{"state": "running", ...}``) when well formed.

    A missing, null or malformed one means the agent is not reporting foreground state
    (never ``idle``): None.
    """
    if isinstance(snapshot, dict) and isinstance(snapshot.get("state"), str):
        return snapshot
    return None


# -- session/status answers ----------------------------------------------------------------------


class ProbeResult(enum.Enum):
    """What one backend said about one session."""

    ACTIVE = "active"  # in memory there
    INACTIVE = "inactive"  # known there (resumable) but not in memory
    NOT_FOUND = "not_found"  # -32002: unknown there
    UNKNOWN = "unknown"  # no usable answer: timeout, transport failure or another error


#: Status values in the wild, and what each means. Three dialects answer ``session/status``:
#: the RFD (``active``/``inactive``), the ACP schema and the TypeScript SDK's unstable
#: method (``open``/``saved``), and the RFD's first draft (``live``/``not_found``, where
#: ``not_found`` is an answer rather than the ``-32002`` error).
DEFAULT_STATUS_ALIASES: Final[Mapping[str, ProbeResult]] = MappingProxyType(
    {
        "active": ProbeResult.ACTIVE,
        "inactive": ProbeResult.INACTIVE,
        "open": ProbeResult.ACTIVE,
        "saved": ProbeResult.INACTIVE,
        "live": ProbeResult.ACTIVE,
        "not_found": ProbeResult.NOT_FOUND,
    }
)


def classify_status(
    response: Response,
    session_id: str,
    aliases: Mapping[str, ProbeResult] = DEFAULT_STATUS_ALIASES,
) -> ProbeResult:
    """Read a ``session/status`` response as the RFD says a client must.

    A status value means what ``aliases`` says; any value it does not list counts as
    ``inactive`` (so a future value is never read as permission to skip
    ``session/resume``). ``-32002`` is "unknown here" when its data names this session
    (``sessionId``, or ``uri`` as the SDK helpers write it) or names nothing; any
    other error is UNKNOWN.
    """
    if response.error is None:
        result = response.result
        status = result.get("status") if isinstance(result, dict) else None
        if not isinstance(status, str):
            return ProbeResult.UNKNOWN
        return aliases.get(status, ProbeResult.INACTIVE)
    if response.error.code == RESOURCE_NOT_FOUND and _names_session(
        response.error.data, session_id
    ):
        return ProbeResult.NOT_FOUND
    return ProbeResult.UNKNOWN


@dataclass(frozen=True, slots=True)
class StatusAnswer:
    """One backend's ``session/status`` answer, as read: what it means, and the v2
    foreground ``state`` snapshot an ``active`` answer carried (None: not reported)."""

    result: ProbeResult
    state: Mapping[str, Any] | None = None
    #: when it last did anything there (:data:`LAST_ACTIVITY_META_KEY`), if reported
    last_activity: float | None = None
    #: its copy's epoch (:data:`EPOCH_META_KEY`), if reported
    epoch: int | None = None


def read_status(
    response: Response,
    session_id: str,
    aliases: Mapping[str, ProbeResult] = DEFAULT_STATUS_ALIASES,
) -> StatusAnswer:
    """:func:`classify_status`, keeping a well-formed v2 ``state`` of an active session."""
    result = classify_status(response, session_id, aliases)
    body = response.result if response.error is None else None
    if not isinstance(body, dict):
        return StatusAnswer(result)
    meta = body.get("_meta")
    meta = meta if isinstance(meta, dict) else {}
    if result is ProbeResult.ACTIVE:
        state = foreground_state(body.get("state"))
        return StatusAnswer(result, state, _last_activity(meta), epoch_of(meta))
    return StatusAnswer(result, epoch=epoch_of(meta))


def _last_activity(meta: dict[str, Any]) -> float | None:
    value = meta.get(LAST_ACTIVITY_META_KEY)
    if isinstance(value, bool) or not isinstance(value, int | float) or value != value:
        return None  # not a number (NaN included)
    return float(value)


#: the largest epoch read (a JSON integer past it is no epoch: a double cannot hold it)
MAX_EPOCH: Final = 2**53


def epoch_of(meta: Any) -> int | None:
    """The epoch a ``_meta`` object carries (:data:`EPOCH_META_KEY`): a whole number from
    0 to :data:`MAX_EPOCH`; None when it carries none, or anything else there."""
    value = meta.get(EPOCH_META_KEY) if isinstance(meta, dict) else None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_EPOCH:
        return None
    return value


def _names_session(data: Any, session_id: str) -> bool:
    if not isinstance(data, dict):
        return True
    named = data.get("sessionId", data.get("uri"))
    return named is None or named == session_id
