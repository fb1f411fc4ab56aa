"""Session ownership (``[auth] bind_sessions``), sans-I/O: session ids that carry their
own proof of whose they are.

With binding on, a client never sees an agent's session id. It sees the *sealed* id
``<agent id>.<mac>``, where the MAC (HMAC-SHA256, 128 bits, base64url) covers the
agent's id and the :data:`~router.core.frontdoor.Principal` of the token that created
the session, keyed by a secret every replica shares. Rules this module keeps:

1. Every ``params.sessionId`` a client sends, in any request or notification, must be
   a sealed id that opens under the client's own principal; it is opened to the
   agent's id before anything routes it. One that does not open is answered exactly as
   an unknown session: ``-32002``, ``data.sessionId`` the id as sent. The decision
   needs no agent and no table, so it is the same on every replica and after a restart,
   and it is taken the same way whether the session exists or not (no oracle).
2. Every session id going to the client (``params.sessionId`` of agent notifications
   and requests, ``result.sessionId`` of a response, ``data.sessionId`` of an error) is
   sealed for the client's principal. The router's own error replies are sealed the
   same way; a refusal under rule 1 is not (it names the id exactly as it came).
3. Only the ``sessionId`` values change, spliced into the frame's text: everything
   else is forwarded as it came. The parsed message keeps the agent's ids, so the
   routing core sees agent ids only.
4. ``session/list`` cannot be answered: the router cannot tell whose a listed session
   is. It is not advertised, and asking gets ``-32601``.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import hmac
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from router.core.frontdoor import Principal
from router.protocol import acp
from router.protocol.errors import MethodNotFound, SessionNotFound
from router.protocol.ids import SessionId
from router.protocol.jsonrpc import Message, Notification, Request, Response
from router.protocol.splice import replace_parsed_member

SEPARATOR = "."
MAC_BYTES = 16
MAC_CHARS = 22  # base64url of 16 bytes, unpadded

#: the id a client knows a session by, from the agent's id
Rename = Callable[[str], str]


def _same(session_id: str) -> str:
    return session_id


_PARAMS_ID = ("params", "sessionId")
_RESULT_ID = ("result", "sessionId")
_ERROR_ID = ("error", "data", "sessionId")


def _mac(secret: bytes, principal: Principal, session_id: str) -> str:
    # ids may hold lone surrogates (an agent's cut mid-emoji, or a client's): any text seals
    message = principal.encode() + b"\x00" + session_id.encode(errors="surrogatepass")
    digest = hmac.new(secret, message, hashlib.sha256).digest()[:MAC_BYTES]
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


#: Sealing is pure and the same few ids are sealed on every update: remember the last
#: ones (opening is not cached, so ids a client makes up cannot push these out).
_cached_mac = functools.lru_cache(maxsize=4096)(_mac)


@dataclass(frozen=True, slots=True)
class SessionSeal:
    """Seals and opens session ids with ``secret`` (the same on every replica)."""

    secret: bytes

    def seal(self, principal: Principal, session_id: str) -> str:
        return f"{session_id}{SEPARATOR}{_cached_mac(self.secret, principal, session_id)}"

    def open(self, principal: Principal, sealed: str) -> SessionId | None:
        """The agent's id inside ``sealed``, if it was sealed for ``principal``."""
        session_id, separator, mac = sealed.rpartition(SEPARATOR)
        if not separator or len(mac) != MAC_CHARS or not mac.isascii():
            return None  # a MAC is base64url: any other character (a lone surrogate) is none
        expected = _mac(self.secret, principal, session_id)
        if not hmac.compare_digest(mac.encode(), expected.encode()):
            return None
        return SessionId(session_id)


@dataclass(frozen=True, slots=True)
class Ownership:
    """One client connection's side of the seal: whose it is, and the frames it crosses."""

    seal: SessionSeal
    principal: Principal

    # -- client -> router (rule 1) ---------------------------------------------------------------

    def inbound(self, message: Message) -> Message:
        """The message with its session id opened.

        Raises:
            SessionNotFound: the id is not sealed for this principal (data: the id as sent).
            MethodNotFound: ``session/list`` (rule 4).
        """
        if isinstance(message, Response):
            return message
        if message.method == acp.SESSION_LIST:
            raise MethodNotFound(message.method)
        sealed = message.param("sessionId")
        if not isinstance(sealed, str):
            return message  # no id, or not a string: nothing to open (the core judges it)
        session_id = self.seal.open(self.principal, sealed)
        if session_id is None:
            raise SessionNotFound(sealed)
        return message.with_param("sessionId", session_id)

    # -- router -> client (rule 2) ---------------------------------------------------------------

    def outbound(self, message: Message, rename: Rename = _same) -> Message:
        """A backend's message with the session ids in its text sealed (rule 3: the
        parsed fields keep the agent's ids for the core); ``rename`` gives the id the
        client knows a session by before it is sealed (:mod:`router.core.hinted_ids`)."""
        if isinstance(message, Request | Notification):
            return self._sealed(message, _PARAMS_ID, message.param("sessionId"), rename)
        if not message.ok:
            return self._sealed(message, _ERROR_ID, message.member(*_ERROR_ID), rename)
        return self._sealed(message, _RESULT_ID, message.member(*_RESULT_ID), rename)

    def _sealed(
        self, message: Message, path: tuple[str, ...], session_id: Any, rename: Rename
    ) -> Message:
        if not isinstance(session_id, str):
            return message
        sealed = self.seal.seal(self.principal, rename(session_id))
        return message.with_text(replace_parsed_member(message.text, path, sealed))

    def reply(self, text: str, session_id: str | None, rename: Rename = _same) -> str:
        """A reply the router made itself, whose error names ``session_id`` in ``data``,
        with that id sealed (spliced in place: the rest of the text as it was)."""
        if session_id is None:
            return text
        sealed = self.seal.seal(self.principal, rename(session_id))
        return replace_parsed_member(text, _ERROR_ID, sealed)

    @staticmethod
    def capabilities(capabilities: dict[str, Any]) -> dict[str, Any]:
        """What the router advertises, without ``session/list`` (rule 4)."""
        agent = capabilities.get("agentCapabilities")
        if not isinstance(agent, dict):
            return capabilities
        session = agent.get("sessionCapabilities")
        if not isinstance(session, dict) or "list" not in session:
            return capabilities
        session = {k: v for k, v in session.items() if k != "list"}
        return {**capabilities, "agentCapabilities": {**agent, "sessionCapabilities": session}}
