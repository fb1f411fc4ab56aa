"""The identifiers the router passes around, as distinct types.

They are all strings or integers on the wire; as ``NewType``s a session id handed where
a backend id belongs (or a router-assigned request id where the agent's own belongs) is
a type error, not a misrouted frame.
"""

from __future__ import annotations

import secrets
from typing import Final, NewType

#: An ACP ``sessionId``, as the agent that created the session chose it.
SessionId = NewType("SessionId", str)

#: A backend's stable id from the configuration (hashed for placement, a metric label).
BackendId = NewType("BackendId", str)

#: The id the router gives an agent→client request before the client sees it, so that
#: requests from two backends never collide on one client connection.
RoutedId = NewType("RoutedId", int)

#: A client connection's ``Acp-Connection-Id`` (ACP's transport RFD): the router's own,
#: returned on a WebSocket's 101 and on Streamable HTTP's answer to ``initialize``.
ConnectionId = NewType("ConnectionId", str)


#: The router's own ids begin so, the one place the prefix is written: the request ids of
#: its link handshakes, forwarded ``authenticate`` and failover resumes, what an orphaned
#: session waits behind, the session its liveness probes name. A client may not use one,
#: in a request or in a ``$/cancel_request``, so that no answer meant for the router can be
#: taken for the client's, and no client can cancel what the router asked.
RESERVED_ID_PREFIX: Final = "acp-router:"


def reserved_id(name: str) -> str:
    """The router's own id ``name`` (``acp-router:name``)."""
    return RESERVED_ID_PREFIX + name


def is_reserved(request_id: object) -> bool:
    """Whether ``request_id`` is one of the router's own ids."""
    return isinstance(request_id, str) and request_id.startswith(RESERVED_ID_PREFIX)


def new_connection_id() -> ConnectionId:
    """A fresh connection id: 192 random bits, so that knowing one tells nothing of another."""
    return ConnectionId(secrets.token_urlsafe(24))
