"""The agent's answer to each ACP method it implements.

Session state lives in two places: the :class:`SessionTable` (what this process has in
memory, and which connections are attached) and the :class:`SessionStore` (every
session any instance sharing the folder created). ``session/status`` reads both and
changes neither.

A session in memory is held under a store lease. When another instance resumes it, the
lease moves there: this instance notices on the session's next write, prompt or resume,
drops its copy (``session/prompt`` then answers :class:`SessionMoved`, -32010) and
never appends to that file again; meanwhile ``session/status`` says ``inactive``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from router import __version__
from router.agent import params
from router.agent.connection import Connection, FrameSink
from router.agent.paging import DEFAULT_PAGE_SIZE, paginate
from router.agent.sessions import ConnectionId, LiveSession, SessionTable
from router.agent.store import Message, SessionStore, Speaker, StoredSession
from router.agent.turns import TurnScope, parse_command, run_turn
from router.protocol import acp
from router.protocol.errors import (
    AuthRequired,
    InvalidParams,
    MethodNotFound,
    SessionMoved,
    SessionNotFound,
)
from router.protocol.jsonrpc import Notification, Request

logger = logging.getLogger(__name__)

#: How long ``session/close`` waits for a cancelled turn to end before answering.
CLOSE_GRACE = 5.0

AGENT_NAME = "acp-router-reference-agent"
AGENT_TITLE = "acp-router reference agent"

_Method = Callable[[Connection, dict[str, Any]], Awaitable[Any]]


#: what ``--require-auth`` guards: everything that makes, reaches or changes a session
#: (``session/status`` and ``session/list`` stay open: a router's probes ask them)
GUARDED = frozenset(
    {
        acp.SESSION_NEW,
        acp.SESSION_LOAD,
        acp.SESSION_RESUME,
        acp.SESSION_CLOSE,
        acp.SESSION_PROMPT,
    }
)


@dataclass(frozen=True, slots=True)
class AgentSettings:
    agent_id: str
    idle_timeout: float
    page_size: int = DEFAULT_PAGE_SIZE
    #: with a method id, the agent offers that one auth method and answers the
    #: :data:`GUARDED` methods -32000 until a connection has authenticated with it
    auth_method: str | None = None
    #: advertise and answer ``session/status`` (off: like every agent before the RFD)
    status: bool = True


class Agent:
    """The reference agent: one per process, shared by all its connections."""

    def __init__(self, settings: AgentSettings, store: SessionStore) -> None:
        self.settings = settings
        self.store = store
        self.sessions = SessionTable(settings.idle_timeout)
        self._connection_ids = itertools.count(1)
        self._authenticated: set[ConnectionId] = set()
        self._methods: dict[str, _Method] = {
            acp.INITIALIZE: self.initialize,
            acp.SESSION_NEW: self.new_session,
            acp.SESSION_LOAD: self.load_session,
            acp.SESSION_RESUME: self.resume_session,
            acp.SESSION_LIST: self.list_sessions,
            acp.SESSION_CLOSE: self.close_session,
            acp.SESSION_PROMPT: self.prompt,
        }
        if settings.auth_method is not None:  # offers no auth method otherwise: -32601
            self._methods[acp.AUTHENTICATE] = self.authenticate
        if settings.status:
            self._methods[acp.SESSION_STATUS] = self.session_status
        #: this process, told apart from a restart of it in ``initialize``'s ``_meta``
        self.instance_id = uuid.uuid4().hex

    # -- connections -----------------------------------------------------------------------

    def open_connection(self, sink: FrameSink) -> Connection:
        connection = Connection(ConnectionId(next(self._connection_ids)), sink, self)
        self.sessions.connection_opened(connection.id)
        return connection

    def close_connection(self, connection: Connection) -> None:
        """Give up the connection's awaited replies and detach it from its sessions."""
        connection.close()
        self.sessions.connection_closed(connection.id)
        self._authenticated.discard(connection.id)

    def shutdown(self) -> None:
        self.sessions.cancel_turns()

    async def handle_request(self, connection: Connection, request: Request) -> Any:
        method = self._methods.get(request.method)
        if method is None:
            raise MethodNotFound(request.method)
        if request.method in GUARDED and not self._may_use_sessions(connection):
            raise AuthRequired(None, {"authMethods": [self.settings.auth_method]})
        return await method(connection, params.as_object(request.params))

    def _may_use_sessions(self, connection: Connection) -> bool:
        return self.settings.auth_method is None or connection.id in self._authenticated

    def handle_notification(self, connection: Connection, notification: Notification) -> None:
        """``session/cancel`` ends the turn of a session attached here; others are ignored."""
        if notification.method != acp.SESSION_CANCEL:
            return
        session_id = params.session_id(params.as_object(notification.params))
        session = self.sessions.attached(session_id, connection.id)
        if session is not None and session.turn is not None:
            session.turn.cancel()

    # -- methods ---------------------------------------------------------------------------

    async def initialize(self, connection: Connection, p: dict[str, Any]) -> Any:
        params.protocol_version(p)  # checked; v1 is the only version this agent speaks
        return {
            "protocolVersion": acp.PROTOCOL_VERSION,
            "agentCapabilities": {
                "loadSession": True,
                "promptCapabilities": {"image": False, "audio": False, "embeddedContext": False},
                "sessionCapabilities": self._session_capabilities(),
            },
            "agentInfo": {"name": AGENT_NAME, "title": AGENT_TITLE, "version": __version__},
            "authMethods": self._auth_methods(),
            "_meta": {acp.INSTANCE_META_KEY: self.instance_id},
        }

    def _auth_methods(self) -> list[dict[str, Any]]:
        method = self.settings.auth_method
        if method is None:
            return []
        return [{"id": method, "name": method, "description": "the method id is the key"}]

    async def authenticate(self, connection: Connection, p: dict[str, Any]) -> Any:
        """Accept exactly the method id ``--require-auth`` names."""
        method_id = params.optional_str(p, "methodId")
        if method_id != self.settings.auth_method:
            logger.info("connection %d: authenticate refused (%r)", connection.id, method_id)
            raise AuthRequired(
                "Authentication failed: unknown auth method", {"methodId": method_id}
            )
        self._authenticated.add(connection.id)
        return {}

    def _session_capabilities(self) -> dict[str, Any]:
        capabilities: dict[str, Any] = {"list": {}, "resume": {}, "close": {}}
        if self.settings.status:
            capabilities["status"] = {}
        return capabilities

    async def new_session(self, connection: Connection, p: dict[str, Any]) -> Any:
        cwd = params.cwd(p)
        params.mcp_servers(p, required=True)
        session_id = f"sess_{uuid.uuid4().hex}"
        self.sessions.check_room()
        lease = self.store.create(session_id, cwd, datetime.now(UTC))
        session = self.sessions.add(lease, cwd, needs_title=True)
        self.sessions.attach(session, connection.id)
        logger.info("session %s created in %s", session_id, cwd)
        return {"sessionId": session_id}

    async def load_session(self, connection: Connection, p: dict[str, Any]) -> Any:
        session_id = params.session_id(p)
        params.cwd(p)
        params.mcp_servers(p, required=True)
        session = self._take(session_id)
        stored = self._stored(session_id)  # read once it is ours: nobody else appends now
        self._keep_epoch(session, p)
        self.sessions.attach(session, connection.id)
        logger.info("session %s loaded (%d messages to replay)", session_id, len(stored.history))
        for message in stored.history:
            await connection.notify(acp.SESSION_UPDATE, _replayed(session_id, message))
        return {}

    async def resume_session(self, connection: Connection, p: dict[str, Any]) -> Any:
        session_id = params.session_id(p)
        params.cwd(p)
        params.mcp_servers(p, required=False)
        session = self._take(session_id)
        self._keep_epoch(session, p)
        self.sessions.attach(session, connection.id)
        logger.info("session %s resumed", session_id)
        return {}

    def _keep_epoch(self, session: LiveSession, p: dict[str, Any]) -> None:
        """Keep the epoch a resume or load carries (``_meta``), when it is above the
        session's: the router's fencing token, which ``session/status`` reports."""
        epoch = acp.epoch_of(p.get("_meta"))
        if epoch is not None and epoch > session.epoch:
            self.store.set_epoch(session.lease, epoch)
            session.epoch = epoch

    async def list_sessions(self, connection: Connection, p: dict[str, Any]) -> Any:
        cwd = params.optional_str(p, "cwd")
        cursor = params.optional_str(p, "cursor")
        page = paginate(
            self.store.list_sessions(), cwd=cwd, cursor=cursor, page_size=self.settings.page_size
        )
        return page.to_result()

    async def close_session(self, connection: Connection, p: dict[str, Any]) -> Any:
        session_id = params.session_id(p)
        session = self.sessions.remove(session_id, by=connection.id)
        if session is None and not self.store.exists(session_id):
            raise SessionNotFound(session_id)
        if session is not None and session.turn is not None:
            session.turn.cancel()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(CLOSE_GRACE):
                    await session.turn.finished.wait()
        logger.info("session %s closed", session_id)
        return {}

    async def session_status(self, connection: Connection, p: dict[str, Any]) -> Any:
        """The RFD's ``session/status``: active, inactive or -32002. No side effects."""
        session_id = params.session_id(p)
        session = self.sessions.get(session_id)
        if session is not None and self.store.holds(session.lease):
            meta = {
                acp.LAST_ACTIVITY_META_KEY: round(session.last_activity),
                acp.EPOCH_META_KEY: session.epoch,
            }
            return {"status": "active", "_meta": meta}
        if self.store.exists(session_id):
            return {
                "status": "inactive",
                "_meta": {acp.EPOCH_META_KEY: self.store.epoch(session_id)},
            }
        raise SessionNotFound(session_id)

    async def prompt(self, connection: Connection, p: dict[str, Any]) -> Any:
        """One turn. Everything up to its start runs before the first ``await``, so a
        ``session/cancel`` read right behind this prompt finds the turn running
        (:mod:`router.agent.connection`)."""
        session = self._attached(connection, params.session_id(p))
        prompt = params.prompt(p)
        command = parse_command(prompt)
        if not self.store.holds(session.lease):
            self.sessions.drop_moved(session)
            raise SessionMoved(session.session_id)
        turn = self.sessions.begin_turn(session, connection.id)
        scope = TurnScope(self.settings.agent_id, self.store, session, turn, connection)
        try:
            stop_reason = await run_turn(scope, prompt, command)
        except SessionMoved:
            self.sessions.drop_moved(session)
            raise
        finally:
            self.sessions.end_turn(session, turn)
        return {"stopReason": stop_reason.value}

    # -- lookups -----------------------------------------------------------------------------

    def _stored(self, session_id: str) -> StoredSession:
        stored = self.store.load(session_id)
        if stored is None:
            raise SessionNotFound(session_id)
        return stored

    def _take(self, session_id: str) -> LiveSession:
        """The session in memory under a lease this instance holds (not attached yet).

        A copy whose lease another instance took is dropped; the session is then taken
        back from the store, from whichever instance had it.
        """
        session = self.sessions.get(session_id)
        if session is not None:
            if self.store.holds(session.lease):
                return session
            self.sessions.drop_moved(session)
        self.sessions.check_room()
        lease = self.store.take(session_id)
        stored = self.store.load(session_id) if lease is not None else None
        if lease is None or stored is None:
            raise SessionNotFound(session_id)
        needs_title = stored.info.title is None and not stored.history
        epoch = self.store.epoch(session_id)
        return self.sessions.add(lease, stored.info.cwd, needs_title=needs_title, epoch=epoch)

    def _attached(self, connection: Connection, session_id: str) -> LiveSession:
        session = self.sessions.attached(session_id, connection.id)
        if session is not None:
            return session
        if self.sessions.let_go(session_id, connection.id):
            raise SessionMoved(session_id)  # it was attached here: resume it again
        if self.sessions.get(session_id) is None and not self.store.exists(session_id):
            raise SessionNotFound(session_id)
        raise InvalidParams(
            f"session {session_id} is not loaded on this connection: call session/resume first",
            {"sessionId": session_id},
        )


def _replayed(session_id: str, message: Message) -> dict[str, Any]:
    kind = "user_message_chunk" if message.speaker is Speaker.USER else "agent_message_chunk"
    update = {"sessionUpdate": kind, "content": {"type": "text", "text": message.text}}
    return {"sessionId": session_id, "update": update}
