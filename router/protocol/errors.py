"""The one exception tree of acp-router.

Every error the router or the reference agent can answer a JSON-RPC request with
is a :class:`JsonRpcError` carrying its code, so exactly one function
(:meth:`JsonRpcError.to_error`) turns an error into a reply::

    AcpRouterError
    ├── ConfigError                     a bad configuration file or flag (not JSON-RPC)
    ├── BackendRefused                  a backend's own error to a request the router made
    │                                   for a client: answered in the backend's words
    └── JsonRpcError                    anything answered as a JSON-RPC error object
        ├── ProtocolError               the peer broke JSON-RPC itself
        │   ├── ParseError              -32700, the frame is not JSON
        │   └── InvalidRequest          -32600, JSON but not a JSON-RPC message
        │       └── NestingTooDeep      -32600, JSON nested deeper than the router reads
        ├── MethodNotFound              -32601
        ├── InvalidParams               -32602
        ├── InternalError               -32603
        ├── AuthRequired                -32000, ACP's "Authentication required"
        ├── SessionNotFound             -32002, data.sessionId (ACP "Resource not found")
        └── RoutingError                acp-router's own codes, -32010..-32019
            ├── SessionNotAttached      -32010, resume the session on this connection first
            │   └── SessionMoved        -32010, another instance took the session: resume it again
            ├── NoBackendAvailable      -32011, retryable: no backend is up
            ├── LocateInconclusive      -32012, retryable: a backend did not answer the probe
            ├── BackendLinkLost         -32013, retryable: the backend went away mid-request
            │   ├── HandshakeRefused    the backend refused a replayed handshake step: its
            │   │                       own error answers the link's requests instead
            │   └── RouterStopping      the router is stopping: reconnect and resume
            ├── TooManyInFlight         -32014, retryable: this connection's request limit
            ├── RateLimited             -32014, retryable: a rate limit, data.limit says which
            │   ├── TooManyNewSessions  new sessions per minute (address, process)
            │   └── TooManyLocates      locates per minute (connection, principal or address)
            ├── TooManySessions         -32015, this connection's session limit
            └── TurnInProgress          -32016, retryable: the session has a prompt turn running
                                        (the reference agent's answer to a second prompt)

Router codes sit in the implementation-defined range and avoid the codes ACP and
its proposals already use (-32000 auth required, -32001, -32002, -32003).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal


@dataclass(frozen=True, slots=True)
class ErrorObject:
    """A JSON-RPC error object as a peer sent it (a backend's own error, read from its
    answer): code, message and data, whatever they are."""

    code: int
    message: str
    data: Any = None


class AcpRouterError(Exception):
    """Root of every error raised on purpose by acp-router."""


class ConfigError(AcpRouterError):
    """A configuration value is missing or wrong; the message names the key."""


class BackendRefused(AcpRouterError):
    """A backend answered a request the router made on a client's behalf (a page of
    ``session/list``) with an error. The client gets that error as the backend said it,
    code and all (:attr:`error`), with ``data.backend`` naming the backend."""

    def __init__(self, backend: str, error: ErrorObject) -> None:
        data = dict(error.data) if isinstance(error.data, dict) else {}
        if error.data is not None and not isinstance(error.data, dict):
            data["detail"] = error.data
        data["backend"] = backend
        super().__init__(f"{backend}: {error.message}")
        self.error = ErrorObject(error.code, error.message, data)


class JsonRpcError(AcpRouterError):
    """An error that is answered to the peer as a JSON-RPC error object."""

    code: ClassVar[int] = -32603
    default_message: ClassVar[str] = "Internal error"

    def __init__(self, message: str | None = None, data: dict[str, Any] | None = None) -> None:
        self.message = message or self.default_message
        self.data = data
        super().__init__(self.message)

    def to_error(self) -> dict[str, Any]:
        """The JSON-RPC error object for this error."""
        error: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.data is not None:
            error["data"] = self.data
        return error


class ProtocolError(JsonRpcError):
    """The peer sent something that is not valid JSON-RPC 2.0.

    ``request_id`` is the id of the offending request when it could be read, so the
    error reply can name it (JSON-RPC 2.0 §5: otherwise the reply's id is null).
    """

    request_id: int | str | None = None


class ParseError(ProtocolError):
    code = -32700
    default_message = "Parse error"


class InvalidRequest(ProtocolError):
    code = -32600
    default_message = "Invalid request"


class NestingTooDeep(InvalidRequest):
    """Legal JSON nested deeper than the router reads (about a thousand levels on 3.11): refused
    at once, never decoded (:mod:`router.protocol.jsontext`)."""


class MethodNotFound(JsonRpcError):
    code = -32601
    default_message = "Method not found"

    def __init__(self, method: str) -> None:
        super().__init__(f"Method not found: {method}", {"method": method})


class InvalidParams(JsonRpcError):
    code = -32602
    default_message = "Invalid params"


class InternalError(JsonRpcError):
    code = -32603
    default_message = "Internal error"


class AuthRequired(JsonRpcError):
    """ACP's "Authentication required": ``authenticate`` first, with a method offered."""

    code = -32000
    default_message = "Authentication required"


class SessionNotFound(JsonRpcError):
    """ACP's "Resource not found" for a session id nobody knows."""

    code = -32002
    default_message = "Resource not found"

    def __init__(self, session_id: str) -> None:
        super().__init__("Resource not found", {"sessionId": session_id})
        self.session_id = session_id


class RoutingError(JsonRpcError):
    """The router could not route a request."""

    retryable: ClassVar[bool] = False

    def __init__(self, message: str | None = None, data: dict[str, Any] | None = None) -> None:
        payload = dict(data or {})
        payload["retryable"] = self.retryable
        super().__init__(message, payload)


class SessionNotAttached(RoutingError):
    code = -32010
    default_message = "Session is not attached to this connection: send session/resume first"

    def __init__(self, session_id: str, message: str | None = None) -> None:
        super().__init__(message, {"sessionId": session_id})


class SessionMoved(SessionNotAttached):
    """An agent instance lost a session it held: another instance sharing the store
    resumed it (the reference agent's fence). Resume it again to reach the instance that has it now.

    ``turn_started``: it was lost during a turn that had begun (``data.turnStarted``), so
    the prompt ran in part; otherwise the request did not run at all."""

    def __init__(self, session_id: str, *, turn_started: bool = False) -> None:
        message = f"session {session_id} moved to another instance: send session/resume again"
        super().__init__(session_id, message)
        if turn_started:
            assert self.data is not None
            self.data["turnStarted"] = True


class NoBackendAvailable(RoutingError):
    code = -32011
    retryable = True
    default_message = "No agent backend is available"


class LocateInconclusive(RoutingError):
    code = -32012
    retryable = True
    default_message = (
        "Could not tell where the session is: an agent backend did not answer; retry later"
    )


class BackendLinkLost(RoutingError):
    code = -32013
    retryable = True
    default_message = "The agent backend connection was lost before it answered"


class HandshakeRefused(BackendLinkLost):
    """A backend answered a step the router replayed to open a link (``initialize``,
    ``authenticate``) with an error, so the link does not open.

    Nothing routed to the link reached the backend; its requests are answered with the
    backend's own error (``refusal``), not with a retryable -32013: a client whose
    credentials a backend refuses must hear that, not retry forever.
    """

    def __init__(self, backend: str, step: str, refusal: ErrorObject) -> None:
        reason = f"the backend refused the replayed {step}: {refusal.message}"
        super().__init__(None, {"backend": backend, "reason": reason})
        self.refusal = refusal


class RouterStopping(BackendLinkLost):
    """The router is stopping (a rolling restart): what was still in flight when the
    client's connection closes gets this, retryable: reconnect (to another replica) and
    resume."""

    default_message = "The router is stopping: reconnect and resume the session"

    def __init__(self) -> None:
        super().__init__(None, {"reason": "the router is stopping"})


class TooManyInFlight(RoutingError):
    code = -32014
    retryable = True
    default_message = "Too many requests in flight on this connection"


class RateLimited(RoutingError):
    """A rate limit of the router's: ``data.limit`` says which (its :attr:`scope`),
    ``data.retryAfterMs`` when to retry; :attr:`kind` names what it limits."""

    code = -32014
    retryable = True
    kind: ClassVar[Literal["sessions", "locates"]]

    def __init__(self, scope: str, retry_after_ms: int) -> None:
        super().__init__(None, {"limit": scope, "retryAfterMs": retry_after_ms})
        self.scope = scope


class TooManyNewSessions(RateLimited):
    """A session rate limit (of the client's address, or of the process)."""

    kind = "sessions"
    default_message = "Too many new sessions: retry later"


class TooManyLocates(RateLimited):
    """A locate rate limit (resumes, loads, statuses: each may ask every backend; of the
    connection, and of its principal or address)."""

    kind = "locates"
    default_message = "Too many session lookups: retry later"


class TooManySessions(RoutingError):
    code = -32015
    default_message = "Too many sessions attached to this connection"


class TurnInProgress(RoutingError):
    """A ``session/prompt`` for a session whose turn is still running (one turn at a time):
    send it again once that turn has ended, or after ``session/cancel`` has ended it."""

    code = -32016
    retryable = True

    def __init__(self, session_id: str) -> None:
        message = (
            f"session {session_id} has a prompt turn running: send the prompt again after"
            " it ends, or after session/cancel"
        )
        super().__init__(message, {"sessionId": session_id})
