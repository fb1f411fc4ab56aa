"""The bookkeeping of ``acp-router host``, sans-I/O: one stdio agent process shared by
every WebSocket client, with the session table it answers ``session/status`` from
(:mod:`router.host.owners`).

Methods take parsed messages and return the frames to write (:class:`ToAgent`,
:class:`ToClient`); nothing here reads a clock or does I/O.

Ids are kept apart like this:

* **Client → agent requests** get a host-assigned integer id (one counter for the
  agent process), so two clients that both start at id 0 never collide at the agent;
  the agent's answer gets the client's own id back. ``$/cancel_request`` from a
  client is rewritten to name the host id.
* **Agent → client requests** keep the agent's id (the agent numbers them uniquely
  for its one connection, and each goes to exactly one client); the host records
  which client it went to and accepts the answer only from that client.
* The host's own ``initialize`` uses a string id no client request can get.

Agent → client traffic for a session goes to its owner (:mod:`router.host.owners`), or
is refused (requests) or dropped (notifications) while nobody owns it.

Clients get the agent's ``initialize`` result with ``_meta.instanceId`` set to the
shell's nonce for the agent process. An error the agent answers to a request that
starts or attaches a session, and the ``-32013`` answers owed when it dies, carry what
it wrote to stderr (:class:`~router.host.stderr.StderrTail`) in ``data.agentStderr``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from router import __version__
from router.host.owners import ClientId, SessionOwners
from router.host.stderr import StderrTail
from router.protocol import acp
from router.protocol.acp import ProbeResult
from router.protocol.errors import (
    BackendLinkLost,
    ErrorObject,
    InternalError,
    InvalidParams,
    InvalidRequest,
    JsonRpcError,
    TooManyInFlight,
    TooManySessions,
)
from router.protocol.ids import SessionId
from router.protocol.jsonrpc import (
    Message,
    Notification,
    Request,
    RequestId,
    Response,
    encode_error,
    encode_request,
    encode_result,
    is_request_id,
)
from router.protocol.splice import replace_id, replace_param

#: the id of the host's own ``initialize`` to the agent
HANDSHAKE_ID: Final = "acp-router-host:initialize"
HOST_INFO: Final = {"name": "acp-router-host", "title": "acp-router host", "version": __version__}
#: where an error the host passes on carries the agent's last stderr lines
STDERR_DATA_KEY: Final = "agentStderr"
#: requests whose failure the agent explains on stderr, if anywhere
STARTING: Final = acp.CREATING | acp.ATTACHING


@dataclass(frozen=True, slots=True)
class ToAgent:
    """Write ``text`` to the agent's stdin (one line)."""

    text: str


@dataclass(frozen=True, slots=True)
class ToClient:
    """Send ``text`` to WebSocket client ``client``."""

    client: ClientId
    text: str


Action = ToAgent | ToClient


@dataclass(frozen=True, slots=True)
class HostLimits:
    #: sessions in memory the host keeps track of; past it, new ones are refused
    max_sessions: int = 10_000
    #: closed sessions remembered as ``inactive`` (the oldest are forgotten first)
    max_remembered: int = 10_000
    #: requests one client may have at the agent at once
    max_in_flight_per_client: int = 1024
    #: requests at the agent at once, including ones whose client has gone
    max_in_flight: int = 16_384
    #: agent → client requests awaiting an answer
    max_agent_requests: int = 1024


@dataclass(frozen=True, slots=True)
class _Call:
    """A client request at the agent, under a host id."""

    client: ClientId
    request: Request
    session_id: SessionId | None
    #: stderr lines the agent had written when the request went to it
    stderr_mark: int


class Multiplexer:
    """Everything the host knows about its agent process and its clients."""

    def __init__(
        self,
        limits: HostLimits = HostLimits(),
        aliases: Mapping[str, ProbeResult] = acp.DEFAULT_STATUS_ALIASES,
    ) -> None:
        self.limits = limits
        #: the agent's initialize result, once it answered; None while it is (re)starting
        self.agent_result: dict[str, Any] | None = None
        #: names the agent process in the initialize result clients get (a nonce per process)
        self.instance_id = ""
        #: the agent process's stderr, as the shell reads it
        self.stderr = StderrTail()
        self._owners = SessionOwners(limits.max_sessions, limits.max_remembered, aliases)
        self.clients: set[ClientId] = set()
        self._initialized: set[ClientId] = set()
        self._next_client = 0
        self._calls: dict[int, _Call] = {}
        self._client_calls: dict[ClientId, dict[RequestId, int]] = {}
        self._agent_requests: dict[RequestId, ClientId] = {}
        self._next_id = 0

    @property
    def sessions(self) -> dict[SessionId, ClientId | None]:
        """Session id -> owning client (None: in memory, nobody attached)."""
        return self._owners.owners

    # -- the agent process -----------------------------------------------------------------------

    def handshake(self, client_capabilities: Mapping[str, Any]) -> str:
        """The ``initialize`` the host sends a freshly started agent."""
        params = {
            "protocolVersion": acp.PROTOCOL_VERSION,
            "clientCapabilities": dict(client_capabilities),
            "clientInfo": HOST_INFO,
        }
        return encode_request(HANDSHAKE_ID, acp.INITIALIZE, params)

    def agent_initialized(self, response: Response, instance_id: str, stderr: StderrTail) -> None:
        """Take the agent's answer to :meth:`handshake`; ``instance_id`` is a nonce new for
        this process, ``stderr`` the tail of its stderr.

        Raises:
            InternalError: the agent refused ``initialize`` or answered nonsense.
        """
        if response.error is not None or not isinstance(response.result, dict):
            raise InternalError(f"the agent did not initialize: {response.text[:200]}")
        self.agent_result = response.result
        self.instance_id = instance_id
        self.stderr = stderr

    @property
    def agent_has_status(self) -> bool:
        return self.agent_result is not None and acp.has_session_capability(
            self.agent_result, "status"
        )

    @property
    def restorable(self) -> bool:
        """Whether the agent can bring a session it let go back into memory."""
        result = self.agent_result or {}
        agent = result.get("agentCapabilities")
        loads = isinstance(agent, dict) and agent.get("loadSession") is True
        return loads or acp.has_session_capability(result, "resume")

    def agent_lost(self) -> list[Action]:
        """The agent process ended: its sessions are gone; answer what it never will."""
        said = self.stderr.last()
        lost = BackendLinkLost(
            "The agent process exited before it answered",
            {STDERR_DATA_KEY: said} if said is not None else {},
        )
        actions: list[Action] = [
            ToClient(call.client, encode_error(call.request.id, lost))
            for call in self._calls.values()
            if call.client in self.clients
        ]
        self.agent_result = None
        self._owners.clear()
        self._calls.clear()
        for calls in self._client_calls.values():
            calls.clear()
        self._agent_requests.clear()
        return actions

    # -- clients -------------------------------------------------------------------------------

    def client_joined(self) -> ClientId:
        client = self._next_client
        self._next_client += 1
        self.clients.add(client)
        self._client_calls[client] = {}
        return client

    def client_left(self, client: ClientId) -> list[Action]:
        """A client disconnected: its sessions stay in memory, owned by nobody.

        Its requests still at the agent run to the end (their answers are dropped); the
        agent's requests awaiting it are answered with an error.
        """
        self.clients.discard(client)
        self._initialized.discard(client)
        self._client_calls.pop(client, None)
        self._owners.client_left(client)
        gone = InternalError("The client that was asked disconnected")
        orphaned = [rid for rid, owner in self._agent_requests.items() if owner == client]
        for request_id in orphaned:
            del self._agent_requests[request_id]
        return [ToAgent(encode_error(request_id, gone)) for request_id in orphaned]

    def receive_client(self, client: ClientId, message: Message) -> list[Action]:
        if isinstance(message, Request):
            try:
                return self._client_request(client, message)
            except JsonRpcError as exc:
                return [ToClient(client, encode_error(message.id, exc))]
        if isinstance(message, Notification):
            return self._client_notification(client, message)
        if message.id is not None and self._agent_requests.get(message.id) == client:
            del self._agent_requests[message.id]
            return [ToAgent(message.text)]
        return []  # a reply to nothing this client was asked

    def _client_request(self, client: ClientId, request: Request) -> list[Action]:
        if self.agent_result is None:
            raise BackendLinkLost("The agent process is restarting", {})
        calls = self._client_calls[client]
        if request.id in calls:
            raise InvalidRequest(f"request id {request.id!r} is already in flight")
        if request.method == acp.INITIALIZE:
            self._initialized.add(client)
            return [ToClient(client, encode_result(request.id, self.advertised()))]
        if client not in self._initialized:
            raise InvalidRequest(f"send initialize before {request.method}")
        session_id = acp.session_id_of(request)
        if request.method in acp.SESSION_SCOPED and session_id is None:
            raise InvalidParams(f"{request.method} needs params.sessionId as a string")
        if request.method == acp.SESSION_STATUS and not self.agent_has_status:
            assert session_id is not None
            return [ToClient(client, encode_result(request.id, self._owners.status(session_id)))]
        if request.method in acp.CREATING or (
            request.method in acp.ATTACHING and session_id not in self._owners
        ):
            self._check_room(session_id)
        return [self._forward(client, request, session_id)]

    def _check_room(self, session_id: SessionId | None) -> None:
        if self._owners.full:
            raise TooManySessions(None, {"sessionId": session_id} if session_id else None)

    def _forward(self, client: ClientId, request: Request, session_id: SessionId | None) -> ToAgent:
        calls = self._client_calls[client]
        if len(calls) >= self.limits.max_in_flight_per_client:
            raise TooManyInFlight()
        if len(self._calls) >= self.limits.max_in_flight:
            raise TooManyInFlight("Too many requests in flight at the agent")
        host_id = self._next_id
        self._next_id += 1
        self._calls[host_id] = _Call(client, request, session_id, self.stderr.count)
        calls[request.id] = host_id
        if request.method in acp.ATTACHING and session_id is not None:
            self._owners.loading(session_id, client)
        return ToAgent(replace_id(request.text, host_id))

    def _client_notification(self, client: ClientId, note: Notification) -> list[Action]:
        if note.method != acp.CANCEL_REQUEST:
            return [ToAgent(note.text)]
        named = note.param("requestId")
        host_id = self._client_calls.get(client, {}).get(named) if is_request_id(named) else None
        if host_id is None:
            return []  # it names nothing this client has at the agent
        return [ToAgent(replace_param(note.text, "requestId", host_id))]

    # -- from the agent ----------------------------------------------------------------------------

    def receive_agent(self, message: Message) -> list[Action]:
        if isinstance(message, Response):
            return self._agent_response(message)
        if isinstance(message, Request):
            return self._agent_request(message)
        return self._agent_notification(message)

    def _agent_response(self, response: Response) -> list[Action]:
        call = self._calls.pop(response.id, None) if isinstance(response.id, int) else None
        if call is None:
            return []  # an answer to nothing in flight
        calls = self._client_calls.get(call.client)
        if calls is not None:
            calls.pop(call.request.id, None)
        if call.session_id is not None:
            self._owners.loaded(call.session_id, call.client)
        self._settle(call, response)
        if call.client not in self.clients:
            return []  # its client went away; the session's bookkeeping is done
        if call.request.method == acp.SESSION_STATUS:
            assert call.session_id is not None
            answer = self._owners.translated_status(call.request.id, call.session_id, response)
            return [ToClient(call.client, answer)]
        if call.request.method in STARTING and response.error is not None:
            return [ToClient(call.client, self._explained(call, response.error))]
        return [ToClient(call.client, replace_id(response.text, call.request.id))]

    def _explained(self, call: _Call, error: ErrorObject) -> str:
        """The agent's refusal to start or attach a session, with what it wrote to stderr
        since the request went to it in ``data.agentStderr`` (when ``data`` is an object
        or absent; anything else the agent put there is left as it is)."""
        said = self.stderr.since(call.stderr_mark)
        if said is None or not isinstance(error.data, dict | None):
            return encode_error(call.request.id, error)
        data = {**(error.data or {}), STDERR_DATA_KEY: said}
        return encode_error(call.request.id, ErrorObject(error.code, error.message, data))

    def _settle(self, call: _Call, response: Response) -> None:
        outcome = acp.session_outcome(call.request, response)
        if outcome is None:
            return
        change, session_id = outcome
        if change is acp.SessionOutcome.HELD:
            owner = call.client if call.client in self.clients else None
            epoch = acp.epoch_of(call.request.param("_meta"))
            self._owners.hold(session_id, owner, epoch)
        else:
            remember = response.ok and call.request.method != acp.SESSION_DELETE
            self._owners.release(session_id, remember=remember and self.restorable)

    def _owner_of(self, message: Request | Notification) -> ClientId | None:
        session_id = acp.session_id_of(message)
        if session_id is not None:
            owner = self._owners.owner(session_id)
        else:  # request-scoped (e.g. elicitation/create naming the request it serves)
            named = message.param("requestId")
            call = self._calls.get(named) if isinstance(named, int) else None
            owner = call.client if call is not None else None
        return owner if owner in self.clients else None

    def _agent_request(self, request: Request) -> list[Action]:
        client = self._owner_of(request)
        if client is None:
            refused = InternalError(f"No client is attached to answer {request.method}")
            return [ToAgent(encode_error(request.id, refused))]
        if len(self._agent_requests) >= self.limits.max_agent_requests:
            busy = TooManyInFlight("Too many agent requests awaiting clients")
            return [ToAgent(encode_error(request.id, busy))]
        self._agent_requests[request.id] = client
        return [ToClient(client, request.text)]

    def _agent_notification(self, note: Notification) -> list[Action]:
        if note.method == acp.CANCEL_REQUEST:
            named = note.param("requestId")
            client = self._agent_requests.get(named) if is_request_id(named) else None
        else:
            self._owners.adopt_child(note)
            self._owners.note_state(note)
            client = self._owner_of(note)
        return [] if client is None else [ToClient(client, note.text)]

    # -- initialize ------------------------------------------------------------------------------

    def advertised(self) -> dict[str, Any]:
        """The initialize result clients get: the agent's, plus ``session/status`` and
        ``_meta.instanceId`` (the host's nonce for this agent process; the rest of any
        ``_meta`` the agent sent is kept)."""
        assert self.agent_result is not None, "clients are served only once the agent is up"
        result = acp.with_status_capability(self.agent_result)
        meta = _object(result.get("_meta"))
        return {**result, "_meta": {**meta, acp.INSTANCE_META_KEY: self.instance_id}}


def _object(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}
