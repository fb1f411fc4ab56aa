"""Who may open the front door, sans-I/O: the decisions the router makes on a WebSocket
upgrade, before it reads any ACP frame.

Rules this module keeps:

1. A request with an ``Origin`` header comes from a browser page; it is refused (403)
   unless that origin is allowed, so a web page cannot drive a router on the user's
   machine or network with the user's ambient reach. No ``Origin``: not a browser, allowed.
2. With credentials configured, the ``Authorization: Bearer <token>`` header must hold
   one of the tokens (401 otherwise). Every known token is compared, each in constant
   time over digests of equal length, so the answer's timing tells neither which token
   nor how much of one matched.
3. A token is never kept in a decision or a log line: a client is known by its
   :data:`Principal`, a fingerprint of its token.

Nothing here reads a clock, a file or a socket: the shell brings the headers and the
token set (re-read from wherever it lives) and carries out the decision.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
from collections.abc import Iterable
from dataclasses import dataclass
from typing import NewType
from urllib.parse import urlsplit

#: Who a client is: a fingerprint of the token it presented (never the token itself).
Principal = NewType("Principal", str)

#: The principal of every client when no credentials are configured (an open door).
ANONYMOUS = Principal("anonymous")

_BEARER = "bearer "


def principal_of(token: str) -> Principal:
    return Principal(hashlib.sha256(b"acp-router principal\x00" + token.encode()).hexdigest()[:32])


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


class AuthOutcome(enum.Enum):
    """How a client's credentials went (the ``outcome`` label of ``acp_router_auth_total``)."""

    OK = "ok"
    MISSING = "missing"  # no Authorization header, or not a Bearer one
    WRONG = "wrong"  # a Bearer token that is not one of ours
    OPEN = "open"  # no credentials configured: everyone is let in


@dataclass(frozen=True, slots=True)
class Credentials:
    """The tokens the router accepts, kept as digests."""

    digests: tuple[bytes, ...]
    #: who the tokens are (a connection whose principal is not here came with a token
    #: that is no longer accepted)
    principals: frozenset[Principal] = frozenset()

    @classmethod
    def of(cls, tokens: Iterable[str]) -> Credentials:
        unique = set(tokens)
        return cls(
            tuple(sorted({_digest(token) for token in unique})),
            frozenset(principal_of(token) for token in unique),
        )

    def admits(self, principal: Principal) -> bool:
        """Whether a client that came as ``principal`` would be let in now."""
        return principal in self.principals

    def __len__(self) -> int:
        return len(self.digests)

    def check(self, authorization: str | None) -> tuple[AuthOutcome, Principal | None]:
        """Read an ``Authorization`` header value: the outcome and, when OK, who it is."""
        token = bearer_token(authorization)
        if token is None:
            return AuthOutcome.MISSING, None
        presented = _digest(token)
        matched = False
        for digest in self.digests:  # no early exit: every token costs the same
            matched |= hmac.compare_digest(presented, digest)
        if not matched:
            return AuthOutcome.WRONG, None
        return AuthOutcome.OK, principal_of(token)


def bearer_token(authorization: str | None) -> str | None:
    """The token of ``Bearer <token>`` (the scheme is case-insensitive, RFC 6750), or None."""
    if authorization is None or authorization[: len(_BEARER)].lower() != _BEARER:
        return None
    token = authorization[len(_BEARER) :].strip()
    return token or None


def origin_allowed(origin: str | None, allowed: frozenset[str]) -> bool:
    """Rule 1. Origins compare by scheme, host and port, case-insensitively."""
    if origin is None:
        return True
    return "*" in allowed or normal_origin(origin) in allowed


def normal_origin(origin: str) -> str:
    """``scheme://host[:port]`` in lower case, the default port dropped ("null" stays)."""
    try:
        parts = urlsplit(origin.strip())
        port = parts.port
    except ValueError:
        return origin
    scheme, host = parts.scheme.lower(), (parts.hostname or "").lower()
    if not scheme or not host:
        return origin
    if ":" in host:
        host = f"[{host}]"
    default = {"http": 80, "https": 443}.get(scheme)
    return f"{scheme}://{host}" if port in (None, default) else f"{scheme}://{host}:{port}"


# -- the decision --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Admitted:
    principal: Principal
    auth: AuthOutcome


@dataclass(frozen=True, slots=True)
class Denied:
    """The door turns the client away: answer with HTTP ``status``; ``reason`` is the
    metric label."""

    status: int
    reason: str
    text: str
    auth: AuthOutcome | None = None


Admission = Admitted | Denied


@dataclass(frozen=True, slots=True)
class DoorPolicy:
    allowed_origins: frozenset[str]

    @classmethod
    def of(cls, allowed_origins: Iterable[str]) -> DoorPolicy:
        return cls(frozenset(o if o == "*" else normal_origin(o) for o in allowed_origins))

    def admit(
        self, origin: str | None, authorization: str | None, credentials: Credentials | None
    ) -> Admission:
        """Rules 1 and 2, in that order; ``credentials`` None means the door is open."""
        if not origin_allowed(origin, self.allowed_origins):
            return Denied(403, "forbidden_origin", "this Origin may not open the router\n")
        if credentials is None:
            return Admitted(ANONYMOUS, AuthOutcome.OPEN)
        outcome, principal = credentials.check(authorization)
        if principal is None:
            return Denied(401, "unauthorized", "a valid Bearer token is required\n", outcome)
        return Admitted(principal, outcome)
