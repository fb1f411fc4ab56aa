"""Streamable HTTP's event streams, sans-I/O: on which of one connection's server-sent
event streams each frame to the client leaves, and the frames held for a stream the
client has not opened yet.

A Streamable HTTP connection (the ACP transport RFD) has one connection-scoped stream
and one stream per session, each opened by the client with a ``GET``. The rules this
module keeps:

1. A request's answer goes where the client will look for it: on the stream of the
   session its POST named in ``Acp-Session-Id``, except the answers to
   ``session/new``, ``session/load``, ``session/resume`` and ``session/fork``, and to
   any request without the header, which go on the connection stream (the client may
   not have the session's stream yet).
2. An agent's request or notification goes on the stream of the session its
   ``params.sessionId`` names, when the connection knows that session; anything else
   on the connection stream.
3. A session is known to the connection once an answer names it
   (``result.sessionId``: new, fork), a POST attaches it (load, resume) or the client
   opens its stream. Frames for a known session whose stream is not open are held
   until the client opens it, with one exception: a session the client attached
   without opening its stream first. The RFD's client opens the stream before it
   sends ``session/load``; one that did not (the Python SDK's, which opens a session's
   stream when a frame naming it arrives) would never see them held, so that
   session's frames go on the connection stream until its stream opens.
4. ``session/prompt``, ``session/cancel``, ``session/set_mode``,
   ``session/set_config_option`` and ``session/close`` are POSTed with
   ``Acp-Session-Id`` (400 without it) for a session the connection knows (404
   otherwise); a header that disagrees with ``params.sessionId`` is a 400.
5. Every table is bounded: held frames per stream, and their characters over the
   connection and over every connection (past any bound the connection ends: the
   client is not reading, or all of them hold as much as they may), sessions per
   connection (the least recently used one with nothing open or held makes room; a
   stream past the bound is a 429), answers awaited (past the bound an answer goes on
   the connection stream).

A stream is held by one ``GET`` at a time, named by a number (its ``reader``); a
second ``GET`` for the same stream displaces the first. Nothing here writes, waits or
reads a clock: the shell (:mod:`router.server.door.streamable_http`) does, and asks here
first.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Final

from router.core.quotas import ByteBudget
from router.protocol import acp
from router.protocol.ids import SessionId
from router.protocol.jsonrpc import Message, Request, RequestId, Response

#: Which stream: a session's, or None for the connection-scoped one.
StreamKey = SessionId | None

#: Methods a client sends only for a session it has (rule 4).
SESSION_POSTS: Final = frozenset(
    {
        acp.SESSION_PROMPT,
        acp.SESSION_CANCEL,
        acp.SESSION_CLOSE,
        "session/set_mode",
        "session/set_config_option",
    }
)

#: Requests answered on the connection stream even when their POST names a session (rule 1):
#: those that make a session or attach one.
ANSWERED_ON_CONNECTION: Final = acp.CREATING | acp.ATTACHING


@dataclass(frozen=True, slots=True)
class Write:
    """Write the frame on stream ``key`` now: the ``GET`` ``reader`` has it open."""

    key: StreamKey
    reader: int


@dataclass(frozen=True, slots=True)
class Held:
    """The frame waits for stream ``key`` to open."""

    key: StreamKey


@dataclass(frozen=True, slots=True)
class Overflow:
    """Stream ``key`` holds as many frames as it may (``shared``: every connection
    together holds as many bytes as they may): end the connection."""

    key: StreamKey
    shared: bool = False


Delivery = Write | Held | Overflow


@dataclass(frozen=True, slots=True)
class Rejected:
    """Answer the HTTP request with ``status``; ``text`` says why."""

    status: int
    text: str


@dataclass(frozen=True, slots=True)
class Opened:
    """A ``GET`` now holds the stream as ``reader``; the ``GET`` it ``displaced`` ends."""

    reader: int
    displaced: int | None


@dataclass(slots=True)
class _Stream:
    held: deque[str] = field(default_factory=deque)
    #: the GET holding it, and whether that GET has written every held frame yet
    reader: int | None = None
    flowing: bool = False
    #: frames wait for it while it is closed (rule 3); False: they take the connection stream
    waited_for: bool = True


class EventStreams:
    """One Streamable HTTP connection's streams: where frames go, what waits."""

    def __init__(
        self,
        *,
        max_held: int,
        max_held_chars: int,
        max_sessions: int,
        max_awaited: int,
        budget: ByteBudget | None = None,
    ) -> None:
        self.max_held = max_held
        #: characters held over all the connection's streams at most
        self.max_held_chars = max_held_chars
        self.held_chars = 0
        #: what every connection holds together (a character counted as a byte)
        self.budget = budget
        self.max_sessions = max_sessions
        self.max_awaited = max_awaited
        self._connection = _Stream()
        #: known sessions, least recently used first
        self._sessions: OrderedDict[SessionId, _Stream] = OrderedDict()
        #: requests whose answers go on a session's stream (rule 1), by the client's id
        self._awaited: dict[RequestId, SessionId] = {}
        self._readers = itertools.count(1)
        #: streams a GET holds now
        self.open_streams = 0

    # -- client -> router: a POST ------------------------------------------------------------

    def post(self, message: Message | None, header: str | None) -> Rejected | None:
        """Check a POSTed frame (``message`` None: not JSON-RPC, the routing core answers
        it) with its ``Acp-Session-Id`` header, and note where its answer goes; why it
        is refused, or None."""
        if message is None or isinstance(message, Response):
            return None
        session = SessionId(header) if header is not None else None
        named = acp.session_id_of(message)
        if message.method in SESSION_POSTS:
            if session is None:
                return Rejected(400, f"{message.method} needs the Acp-Session-Id header")
            if session not in self._sessions:
                return Rejected(404, "no such session on this connection")
        if session is not None and named is not None and named != session:
            return Rejected(400, "Acp-Session-Id and params.sessionId differ")
        if message.method in acp.ATTACHING and named is not None:
            self._attaching(named)
        if isinstance(message, Request):
            self._await_answer(message, session)
        return None

    def _attaching(self, session: SessionId) -> None:
        stream = self._known(session)
        if stream is not None and stream.reader is None:
            stream.waited_for = False  # rule 3's exception

    def _await_answer(self, request: Request, session: SessionId | None) -> None:
        if session is None or request.method in ANSWERED_ON_CONNECTION:
            return
        if len(self._awaited) < self.max_awaited or request.id in self._awaited:
            self._awaited[request.id] = session

    # -- router -> client: a frame ------------------------------------------------------------

    def deliver(
        self, text: str, message: Message | None = None, answers: RequestId | None = None
    ) -> Delivery:
        """Where the frame ``text`` goes now: ``message`` is what was parsed of a
        backend's frame; ``answers`` the request a reply the router made answers (neither:
        a frame for the connection's stream)."""
        key = self._key(message, answers)
        stream = self._connection if key is None else self._sessions[key]
        if stream.flowing:
            assert stream.reader is not None
            return Write(key, stream.reader)
        if len(stream.held) >= self.max_held or self.held_chars + len(text) > self.max_held_chars:
            return Overflow(key)
        if self.budget is not None and not self.budget.take(len(text)):
            return Overflow(key, shared=True)
        stream.held.append(text)
        self.held_chars += len(text)
        return Held(key)

    def _key(self, message: Message | None, answers: RequestId | None) -> StreamKey:
        if message is None:
            session = self._awaited.pop(answers, None) if answers is not None else None
        elif isinstance(message, Response):
            session = self._awaited.pop(message.id, None) if message.id is not None else None
            created = message.member("result", "sessionId")
            if isinstance(created, str):
                self._known(SessionId(created))
        else:
            session = acp.session_id_of(message)
        if session is None:
            return None
        stream = self._sessions.get(session)
        if stream is None or (stream.reader is None and not stream.waited_for):
            return None
        self._sessions.move_to_end(session)
        return session

    # -- a GET --------------------------------------------------------------------------------

    def attach(self, key: StreamKey) -> Opened | Rejected:
        """A ``GET`` opens stream ``key`` (a session the connection does not know yet
        becomes known: the RFD's client opens it before ``session/load``). It takes
        the held frames (:meth:`take`) before new ones flow to it."""
        stream = self._connection if key is None else self._known(key)
        if stream is None:
            return Rejected(429, "too many session streams on this connection")
        displaced = stream.reader
        if displaced is None:
            self.open_streams += 1
        stream.reader = next(self._readers)
        stream.flowing = False
        stream.waited_for = True
        return Opened(stream.reader, displaced)

    def take(self, key: StreamKey, reader: int) -> str | None:
        """The next held frame for ``reader`` to write; None when none is left (frames
        then flow to it as they come) or it no longer holds the stream."""
        stream = self._stream(key, reader)
        if stream is None:
            return None
        if stream.held:
            text = stream.held.popleft()
            self._given_back(len(text))
            return text
        stream.flowing = True
        return None

    def release(self, key: StreamKey, reader: int) -> bool:
        """The ``GET`` ``reader`` has ended; frames for its stream are held again. False
        when it no longer held the stream (displaced, or released already)."""
        stream = self._stream(key, reader)
        if stream is None:
            return False
        stream.reader = None
        stream.flowing = False
        self.open_streams -= 1
        return True

    def drop(self) -> None:
        """The connection has ended: its held frames go, their bytes back to the budget."""
        for stream in (self._connection, *self._sessions.values()):
            stream.held.clear()
        self._given_back(self.held_chars)

    def _given_back(self, chars: int) -> None:
        self.held_chars -= chars
        if self.budget is not None:
            self.budget.give(chars)

    def _stream(self, key: StreamKey, reader: int) -> _Stream | None:
        stream = self._connection if key is None else self._sessions.get(key)
        return stream if stream is not None and stream.reader == reader else None

    def _known(self, session: SessionId) -> _Stream | None:
        """The session's stream, made known (rule 3); None when the table is full of
        sessions with a stream open or frames held."""
        stream = self._sessions.get(session)
        if stream is not None:
            self._sessions.move_to_end(session)
            return stream
        if len(self._sessions) >= self.max_sessions and not self._evict():
            return None
        stream = self._sessions[session] = _Stream()
        return stream

    def _evict(self) -> bool:
        for session, stream in self._sessions.items():
            if stream.reader is None and not stream.held:
                del self._sessions[session]
                return True
        return False
