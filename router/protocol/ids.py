"""The identifiers the router passes around, as distinct types.

They are all strings or integers on the wire; as ``NewType``s a session id handed where
a backend id belongs (or a router-assigned request id where the agent's own belongs) is
a type error, not a misrouted frame.
"""

from __future__ import annotations

import secrets
from typing import NewType

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


def new_connection_id() -> ConnectionId:
    """A fresh connection id: 192 random bits, so that knowing one tells nothing of another."""
    return ConnectionId(secrets.token_urlsafe(24))
