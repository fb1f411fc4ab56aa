"""The sessions this agent process has in memory, their attached connections and turns.

A session stays in memory while a connection is attached or a turn runs; once neither
holds, an idle timer starts, and when it fires the session is evicted (it stays in the
store, so it is then ``inactive``). Lookups never touch the timer: ``session/status``
must have no side effects.

A session runs one turn at a time: a second ``session/prompt`` meanwhile is refused
with the retryable :class:`TurnInProgress`. A turn whose connection closes is cancelled
(as ``session/cancel`` would): in ACP v1 a turn ends with the answer to its
``session/prompt``, and that answer (like the turn's permission requests) can only go
to the connection that sent the prompt, so once it is gone nobody can see the turn end,
and it would only hold the session against the client's retry. The session itself
stays, as after any disconnect.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator
from typing import NewType

from router.agent.store import Lease
from router.protocol.errors import InternalError, TurnInProgress
from router.protocol.jsonrpc import Response

logger = logging.getLogger(__name__)

ConnectionId = NewType("ConnectionId", int)

#: Most sessions one agent process holds in memory at once.
MAX_LIVE_SESSIONS = 10_000


class Turn:
    """One running ``session/prompt`` turn, cancelled cooperatively.

    ``cancel()`` makes :meth:`pause` return early and :meth:`wait_reply` return None, so
    the turn can end with ``stopReason: cancelled`` instead of being torn down.
    """

    def __init__(self, connection_id: ConnectionId) -> None:
        self.connection_id = connection_id
        self.finished = asyncio.Event()
        self._cancelled = asyncio.Event()
        self._replies: set[asyncio.Future[Response | None]] = set()

    @property
    def is_cancelled(self) -> bool:
        return self._cancelled.is_set()

    def cancel(self) -> None:
        self._cancelled.set()
        for reply in self._replies:
            if not reply.done():
                reply.set_result(None)

    async def pause(self, seconds: float) -> bool:
        """Sleep up to ``seconds``; True when the turn was cancelled meanwhile."""
        try:
            async with asyncio.timeout(seconds):
                await self._cancelled.wait()
        except TimeoutError:
            return False
        return True

    async def wait_reply(
        self, reply: asyncio.Future[Response | None], seconds: float
    ) -> Response | None:
        """The client's reply, or None when the turn is cancelled or ``seconds`` pass."""
        if self.is_cancelled:
            return None
        self._replies.add(reply)
        try:
            async with asyncio.timeout(seconds):
                return await reply
        except TimeoutError:
            return None
        finally:
            self._replies.discard(reply)


class LiveSession:
    """A session in memory, held under ``lease`` (see :mod:`router.agent.store`).

    ``needs_title`` is true until its first text prompt.
    """

    def __init__(self, lease: Lease, cwd: str, *, needs_title: bool, epoch: int = 0) -> None:
        self.lease = lease
        #: the highest epoch a resume of it carried (:mod:`router.agent.store`, "Epochs")
        self.epoch = epoch
        self.session_id = lease.session_id
        self.cwd = cwd
        self.needs_title = needs_title
        self.connections: set[ConnectionId] = set()
        self.turn: Turn | None = None
        self.idle_timer: asyncio.TimerHandle | None = None
        #: when it last did anything (taken, attached, a turn begun or ended): wall-clock
        #: milliseconds, what ``session/status`` reports in ``_meta.lastActivity``
        self.last_activity = _now_ms()

    def touch(self) -> None:
        self.last_activity = _now_ms()

    @property
    def is_idle(self) -> bool:
        return not self.connections and self.turn is None


class SessionTable:
    """Sessions in memory by id, with idle eviction after ``idle_timeout`` seconds."""

    def __init__(self, idle_timeout: float, max_sessions: int = MAX_LIVE_SESSIONS) -> None:
        self._idle_timeout = idle_timeout
        self._max_sessions = max_sessions
        self._sessions: dict[str, LiveSession] = {}
        self._open_connections: set[ConnectionId] = set()
        #: per open connection, the sessions let go of (closed by another connection, or
        #: taken by another instance) while it had them attached: its next request for one
        #: is told to resume it again (-32010), not that it never resumed it
        self._let_go: dict[ConnectionId, set[str]] = {}

    def get(self, session_id: str) -> LiveSession | None:
        """The session if it is in memory. No side effects."""
        return self._sessions.get(session_id)

    def attached(self, session_id: str, connection_id: ConnectionId) -> LiveSession | None:
        """The session if it is in memory and attached to ``connection_id``."""
        session = self._sessions.get(session_id)
        return session if session is not None and connection_id in session.connections else None

    def __iter__(self) -> Iterator[LiveSession]:
        return iter(list(self._sessions.values()))

    def check_room(self) -> None:
        """Raise InternalError when no more sessions fit in memory."""
        if len(self._sessions) >= self._max_sessions:
            raise InternalError(f"this agent already holds {self._max_sessions} sessions")

    def add(self, lease: Lease, cwd: str, *, needs_title: bool, epoch: int = 0) -> LiveSession:
        """Put a session taken under ``lease`` in memory (it starts idle until attached)."""
        self.check_room()
        session = LiveSession(lease, cwd, needs_title=needs_title, epoch=epoch)
        self._sessions[session.session_id] = session
        return session

    def connection_opened(self, connection_id: ConnectionId) -> None:
        self._open_connections.add(connection_id)

    def connection_closed(self, connection_id: ConnectionId) -> None:
        """Detach a closed connection from every session it was attached to, and cancel
        the turns its prompts started."""
        self._open_connections.discard(connection_id)
        self._let_go.pop(connection_id, None)
        for session in self:
            if session.turn is not None and session.turn.connection_id == connection_id:
                session.turn.cancel()
            if connection_id in session.connections:
                session.connections.discard(connection_id)
                self._start_idle_timer_if_idle(session)

    def attach(self, session: LiveSession, connection_id: ConnectionId) -> None:
        """Attach an open connection (a closed one is not attached: nobody would detach it)."""
        session.touch()
        if connection_id in self._open_connections:
            session.connections.add(connection_id)
            self._let_go.get(connection_id, set()).discard(session.session_id)
            _stop_idle_timer(session)
        else:
            self._start_idle_timer_if_idle(session)

    def remove(self, session_id: str, by: ConnectionId | None = None) -> LiveSession | None:
        """Drop a session from memory (it becomes ``inactive``); its turn is left running.
        The other connections it was attached to (not ``by``, the one closing it) are told
        so on their next request for it (:meth:`let_go`)."""
        session = self._sessions.pop(session_id, None)
        if session is not None:
            _stop_idle_timer(session)
            for connection_id in session.connections - {by}:
                let_go = self._let_go.setdefault(connection_id, set())
                if len(let_go) < self._max_sessions:
                    let_go.add(session_id)
        return session

    def let_go(self, session_id: str, connection_id: ConnectionId) -> bool:
        """Whether ``session_id`` was let go of while ``connection_id`` had it attached
        (closed by another connection, or taken by another instance), and not resumed
        on it since."""
        return session_id in self._let_go.get(connection_id, ())

    def drop_moved(self, session: LiveSession) -> None:
        """Forget ``session``: another instance took it. Its turn, if any, is cancelled."""
        if self._sessions.get(session.session_id) is session:
            self.remove(session.session_id)
        if session.turn is not None:
            session.turn.cancel()
        logger.info("session %s moved to another instance: dropped from memory", session.session_id)

    def begin_turn(self, session: LiveSession, connection_id: ConnectionId) -> Turn:
        if session.turn is not None:
            raise TurnInProgress(session.session_id)
        session.turn = Turn(connection_id)
        session.touch()
        _stop_idle_timer(session)
        return session.turn

    def end_turn(self, session: LiveSession, turn: Turn) -> None:
        session.touch()
        if session.turn is turn:
            session.turn = None
        turn.finished.set()
        self._start_idle_timer_if_idle(session)

    def cancel_turns(self) -> None:
        """Ask every running turn to end (on shutdown)."""
        for session in self:
            if session.turn is not None:
                session.turn.cancel()

    def _start_idle_timer_if_idle(self, session: LiveSession) -> None:
        if self._sessions.get(session.session_id) is not session or not session.is_idle:
            return
        _stop_idle_timer(session)
        loop = asyncio.get_running_loop()
        session.idle_timer = loop.call_later(self._idle_timeout, self._evict, session)

    def _evict(self, session: LiveSession) -> None:
        session.idle_timer = None
        if self._sessions.get(session.session_id) is session and session.is_idle:
            del self._sessions[session.session_id]
            logger.info("session %s evicted after idle timeout", session.session_id)


def _now_ms() -> float:
    return time.time() * 1000


def _stop_idle_timer(session: LiveSession) -> None:
    if session.idle_timer is not None:
        session.idle_timer.cancel()
        session.idle_timer = None
