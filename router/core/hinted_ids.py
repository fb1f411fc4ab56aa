"""Session ids that say where their session lives (``router.hinted_ids``), sans-I/O.

For a session the router placed, the client gets ``<agent's id>@<home>.<check>``: ``home``
is the backend's id (base64url), ``check`` a short checksum of both, so that an agent's
own id that happens to hold an ``@`` is not taken for a hinted one. Any replica, a fresh
one after a restart included, reads the home from the id alone and asks that backend
first: one probe where a cold locate asks the whole pool. The home is only a claim
(anyone can make one: no secret is needed, and the session may have moved since), so it
serves that frame's locate alone (:mod:`router.core.locate`): asked first, believed only
as far as the home's ``active`` answer, and remembered only once a backend confirms it. A
forged one plants nothing and costs what any id nobody knows costs: a locate, within its
sender's budget.

Agents never see these ids: :class:`HintedSessions` opens them on the way in and puts
them back on the way out, splicing the ``sessionId`` members of the frame's text (as
:mod:`router.core.ownership` does), so the core routes agents' ids only. A client keeps
the id it was given for the whole life of the session, wherever the session moves;
sessions made directly on agents keep their own ids and are located as always.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
from collections import OrderedDict
from typing import Any

from router.protocol.ids import BackendId, SessionId
from router.protocol.jsonrpc import Message, Notification, Request
from router.protocol.splice import replace_parsed_member

HOME = "@"
CHECK = "."
CHECK_CHARS = 6

_BASE64URL = re.compile(r"[A-Za-z0-9_-]+")

_PARAMS_ID = ("params", "sessionId")
_RESULT_ID = ("result", "sessionId")
_ERROR_ID = ("error", "data", "sessionId")


def _check(session_id: str, home: str) -> str:
    text = f"{session_id}{HOME}{home}".encode(errors="surrogatepass")  # ids may hold any
    digest = hashlib.blake2b(text, digest_size=6).digest()
    return base64.urlsafe_b64encode(digest).decode()[:CHECK_CHARS]


def hinted(session_id: str, backend: str) -> str:
    """The id a client gets for ``session_id``, which lives on ``backend``."""
    home = base64.urlsafe_b64encode(backend.encode()).rstrip(b"=").decode()
    return f"{session_id}{HOME}{home}{CHECK}{_check(session_id, home)}"


def read(client_id: str) -> tuple[SessionId, BackendId] | None:
    """The agent's id and the home inside a hinted id; None for any other id."""
    rest, separator, check = client_id.rpartition(CHECK)
    if not separator or len(check) != CHECK_CHARS:
        return None
    session_id, separator, home = rest.rpartition(HOME)
    if not separator or not session_id or not _BASE64URL.fullmatch(home):
        return None  # a home is base64url: a forged one with any other character is no home
    if _check(session_id, home) != check:
        return None
    try:
        backend = base64.urlsafe_b64decode(home + "=" * (-len(home) % 4)).decode()
    except (binascii.Error, UnicodeDecodeError):
        return None
    return SessionId(session_id), BackendId(backend)


class HintedSessions:
    """One client connection's side: which id the client knows each session by.

    Bounded: the ``limit`` sessions used last (an id the client sends again is read
    from the id itself, so forgetting one costs nothing but the lookup).
    """

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._known: OrderedDict[SessionId, str] = OrderedDict()

    def _remember(self, session_id: SessionId, client_id: str) -> None:
        self._known[session_id] = client_id
        self._known.move_to_end(session_id)
        while len(self._known) > self._limit:
            self._known.popitem(last=False)

    # -- client -> router ----------------------------------------------------------------------

    def inbound(self, message: Message) -> tuple[Message, BackendId | None]:
        """The message with a hinted ``params.sessionId`` opened, and the home it named."""
        if not isinstance(message, Request | Notification):
            return message, None
        client_id = message.param("sessionId")
        opened = read(client_id) if isinstance(client_id, str) else None
        if opened is None:
            return message, None
        session_id, home = opened
        self._remember(session_id, client_id)
        return message.with_param("sessionId", session_id), home

    # -- router -> client ----------------------------------------------------------------------

    def learn(self, message: Message, backend: BackendId) -> None:
        """A backend's answer that names a session in ``result.sessionId`` (it created
        one): the client knows it by a hinted id, its home ``backend``."""
        if isinstance(message, Request | Notification) or not message.ok:
            return
        created = message.member(*_RESULT_ID)
        if isinstance(created, str) and SessionId(created) not in self._known:
            self._remember(SessionId(created), hinted(created, backend))

    def outbound(self, message: Message) -> Message:
        """A backend's message (after :meth:`learn`) with its session ids spliced as the
        client knows them; the parsed fields keep the agent's ids."""
        if isinstance(message, Request | Notification):
            return self._known_as(message, _PARAMS_ID, message.param("sessionId"))
        if not message.ok:
            return self._known_as(message, _ERROR_ID, message.member(*_ERROR_ID))
        return self._known_as(message, _RESULT_ID, message.member(*_RESULT_ID))

    def _known_as(self, message: Message, path: tuple[str, ...], session_id: Any) -> Message:
        if not isinstance(session_id, str):
            return message
        client_id = self.client_id(session_id)
        if client_id == session_id:
            return message
        return message.with_text(replace_parsed_member(message.text, path, client_id))

    def client_id(self, session_id: str) -> str:
        """The id the client knows ``session_id`` by."""
        return self._known.get(SessionId(session_id), session_id)

    def reply(self, text: str, session_id: str | None) -> str:
        """A reply the router made, whose error names ``session_id`` in ``data``, with that
        id as the client knows it (spliced in place, as :meth:`outbound` does)."""
        if session_id is None:
            return text
        client_id = self.client_id(session_id)
        return (
            text if client_id == session_id else replace_parsed_member(text, _ERROR_ID, client_id)
        )
