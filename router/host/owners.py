"""The sessions of ``acp-router host``'s agent process, sans-I/O: each with the client
it belongs to, what ``session/status`` answers of it, and the closed ones remembered
(:mod:`router.host.multiplex` keeps the rest of the host's bookkeeping).

A session belongs to the client that last created, loaded, resumed or forked it (its
*owner*); one whose client left stays in memory, owned by nobody. It stays ``active``
while the agent process runs, until ``session/close``, ``session/archive`` or
``session/delete`` succeeds (or fails with ``-32002``); one closed is then remembered as
``inactive`` when the agent can load or resume it.

The host keeps each session's epoch, the fencing token a router sends with each resume
or load (``_meta``; docs/routing.md, "Split brain found is split brain ended"), for as
long as it knows the session, and reports it in every ``session/status`` answer, so a
stdio agent that knows nothing of epochs takes part in the rule.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

from router.protocol import acp
from router.protocol.acp import ProbeResult
from router.protocol.errors import SessionNotFound
from router.protocol.ids import SessionId
from router.protocol.jsonrpc import Notification, RequestId, Response, encode_error, encode_result

#: the host's number for one of its WebSocket clients
ClientId = int


class SessionOwners:
    """The sessions in the agent's memory and their owners, the closed ones remembered
    (the oldest forgotten first), each one's last v2 state snapshot, and who is loading
    or resuming one right now."""

    def __init__(
        self, max_sessions: int, max_remembered: int, aliases: Mapping[str, ProbeResult]
    ) -> None:
        self._max_sessions = max_sessions
        self._max_remembered = max_remembered
        #: the agent's own words for its sessions' status, in RFD values
        self._aliases = aliases
        #: session id -> owning client (None: in memory, nobody attached)
        self.owners: dict[SessionId, ClientId | None] = {}
        self._remembered: OrderedDict[SessionId, None] = OrderedDict()
        #: the last v2 ``state_update`` snapshot of each session in memory
        self._states: dict[SessionId, dict[str, Any]] = {}
        #: sessions being loaded or resumed right now, and by which client
        self._loading: dict[SessionId, ClientId] = {}
        #: the highest epoch a resume or load of each known session carried
        self._epochs: dict[SessionId, int] = {}

    def __contains__(self, session_id: object) -> bool:
        return session_id in self.owners

    @property
    def full(self) -> bool:
        """Whether the agent holds as many sessions as the host keeps track of."""
        return len(self.owners) >= self._max_sessions

    def clear(self) -> None:
        """The agent process ended: its sessions are gone."""
        self.owners.clear()
        self._remembered.clear()
        self._loading.clear()
        self._states.clear()
        self._epochs.clear()

    def client_left(self, client: ClientId) -> None:
        """``client`` disconnected: its sessions stay in memory, owned by nobody."""
        for session_id, owner in self.owners.items():
            if owner == client:
                self.owners[session_id] = None
        for session_id in [s for s, loader in self._loading.items() if loader == client]:
            del self._loading[session_id]

    def loading(self, session_id: SessionId, client: ClientId) -> None:
        """``client`` is loading or resuming the session (its traffic goes there now)."""
        self._loading[session_id] = client

    def loaded(self, session_id: SessionId, client: ClientId) -> None:
        """``client``'s load or resume of the session was answered."""
        if self._loading.get(session_id) == client:
            del self._loading[session_id]

    def owner(self, session_id: SessionId) -> ClientId | None:
        """The client a session's traffic goes to: the one loading or resuming it right now
        (a load replays history before its answer), else the one that holds it."""
        loading = self._loading.get(session_id)
        return loading if loading is not None else self.owners.get(session_id)

    def hold(self, session_id: SessionId, owner: ClientId | None, epoch: int | None = None) -> None:
        """The session is in the agent's memory, held by ``owner``; ``epoch``: the one the
        request that put it there carried (kept when it is above the session's)."""
        self._remembered.pop(session_id, None)
        self.owners[session_id] = owner
        if epoch is not None and epoch > self._epochs.get(session_id, 0):
            self._epochs[session_id] = epoch

    def release(self, session_id: SessionId, *, remember: bool) -> None:
        """The session left the agent's memory; ``remember``: as ``inactive``."""
        self.owners.pop(session_id, None)
        self._states.pop(session_id, None)
        self._remembered.pop(session_id, None)
        if remember:
            self._remembered[session_id] = None
            while len(self._remembered) > self._max_remembered:
                forgotten, _ = self._remembered.popitem(last=False)
                self._epochs.pop(forgotten, None)
        else:
            self._epochs.pop(session_id, None)

    def _meta(self, session_id: SessionId, meta: Any = None) -> dict[str, Any]:
        """``meta`` (the agent's own, if it is an object) with the session's epoch."""
        kept = meta if isinstance(meta, dict) else {}
        return {**kept, acp.EPOCH_META_KEY: self._epochs.get(session_id, 0)}

    def status(self, session_id: SessionId) -> dict[str, Any]:
        """The host's answer from what it saw (RFD values).

        Raises:
            SessionNotFound: the host never saw the session, or the agent that had it died.
        """
        meta = self._meta(session_id)
        if session_id in self.owners:
            state = self._states.get(session_id)
            active = {"status": "active", "_meta": meta}
            return active if state is None else {**active, "state": state}
        if session_id in self._remembered:
            return {"status": "inactive", "_meta": meta}
        raise SessionNotFound(session_id)

    def translated_status(
        self, request_id: RequestId, session_id: SessionId, response: Response
    ) -> str:
        """The agent's own ``session/status`` answer in RFD values, whatever its dialect;
        its ``_meta`` (with the session's epoch) and a well-formed v2 ``state`` (on
        ``active``) pass through."""
        result = response.result if isinstance(response.result, dict) else {}
        extra: dict[str, Any] = {"_meta": self._meta(session_id, result.get("_meta"))}
        match acp.classify_status(response, session_id, self._aliases):
            case ProbeResult.ACTIVE:
                state = acp.foreground_state(result.get("state"))
                if state is not None:
                    extra["state"] = state
                return encode_result(request_id, {"status": "active", **extra})
            case ProbeResult.INACTIVE:
                return encode_result(request_id, {"status": "inactive", **extra})
            case ProbeResult.NOT_FOUND:
                return encode_error(request_id, SessionNotFound(session_id))
            case ProbeResult.UNKNOWN:
                try:
                    return encode_result(request_id, self.status(session_id))
                except SessionNotFound as exc:
                    return encode_error(request_id, exc)

    def adopt_child(self, note: Notification) -> None:
        """A ``subagent_update`` announcing a child: it is in memory, owned like its parent."""
        child, parent = acp.announced_child(note), acp.session_id_of(note)
        if child is None or parent is None or child in self.owners:
            return
        if not self.full:
            self.hold(child, self.owner(parent))

    def note_state(self, note: Notification) -> None:
        """Keep a session's last v2 ``state_update`` as its foreground snapshot."""
        session_id = acp.session_id_of(note)
        update = note.param("update") if note.method == acp.SESSION_UPDATE else None
        if (
            session_id in self.owners
            and isinstance(update, dict)
            and update.get("sessionUpdate") == acp.STATE_UPDATE
        ):
            assert session_id is not None
            snapshot = acp.foreground_state(
                {k: v for k, v in update.items() if k != "sessionUpdate"}
            )
            if snapshot is None:
                self._states.pop(session_id, None)
            else:
                self._states[session_id] = snapshot
