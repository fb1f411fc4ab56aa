"""What ``acp-router connect`` puts back on a new router connection, sans-I/O.

:class:`EditorState` watches the frames the bridge passes each way and keeps what a
router connection holds for the editor: its ``initialize`` and last accepted
``authenticate``, the sessions it has attached, the requests it still awaits answers
to, and the agent's requests it has not answered yet. When the connection is lost,
:meth:`EditorState.lost` answers every awaited request once, with a retryable error.
:class:`Reattach` then replays the editor's state on the new connection, under ids
of its own, step by step: ``initialize``; then ``authenticate``; then every session
at once (``session/resume`` when the router offers it, ``session/load`` for a session
the editor loaded). The answers are the bridge's, not the editor's: it never sees
them, nor the history a replayed ``session/load`` sends again.

Nothing here reads a clock or does I/O.
"""

from __future__ import annotations

import enum
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Final

from router.protocol import acp
from router.protocol.errors import BackendLinkLost
from router.protocol.ids import SessionId
from router.protocol.jsonrpc import (
    Message,
    Notification,
    Request,
    RequestId,
    Response,
    encode_error,
    encode_request,
)
from router.protocol.splice import replace_id

#: the bridge's own request ids start so (the router reserves ``acp-router:``); no
#: editor request is in flight on a connection while they are, so they cannot collide
REPLAY_ID_PREFIX: Final = "acp-bridge:"
#: sessions remembered for the replay (the oldest attached are forgotten first)
MAX_SESSIONS: Final = 4096
#: agent requests awaiting the editor's answer (the oldest are forgotten first)
MAX_ASKED: Final = 4096


class Attach(enum.Enum):
    """How a session is attached again: as the editor did, or as the router allows."""

    RESUME = acp.SESSION_RESUME
    LOAD = acp.SESSION_LOAD


@dataclass(frozen=True, slots=True)
class Attached:
    """A session the editor attached, and the params that attach it again."""

    how: Attach
    params: dict[str, Any]


class ReplayRefused(Exception):
    """The router refused the replayed ``initialize`` or ``authenticate``: retrying will
    not help."""


class EditorState:
    """What one editor holds on its router connection."""

    def __init__(self) -> None:
        self.initialize: Request | None = None
        self.authenticate: Request | None = None
        self.sessions: OrderedDict[SessionId, Attached] = OrderedDict()
        #: editor requests sent on this connection and not answered yet
        self._owed: dict[RequestId, Request] = {}
        #: agent requests delivered on this connection and not answered yet
        self._asked: OrderedDict[RequestId, None] = OrderedDict()

    @property
    def owes(self) -> bool:
        """Whether any editor request still awaits its answer."""
        return bool(self._owed)

    def sending(self, message: Message) -> bool:
        """An editor frame about to go out; False when it must be dropped instead: an
        answer to an agent request made on an earlier connection (its id meant
        something there only)."""
        if isinstance(message, Request):
            self._owed[message.id] = message
        elif isinstance(message, Response):
            if message.id is None or message.id not in self._asked:
                return False
            del self._asked[message.id]
        return True

    def received(self, message: Message) -> None:
        """A frame from the router (each goes on to the editor)."""
        if isinstance(message, Request):
            self._asked[message.id] = None
            while len(self._asked) > MAX_ASKED:
                self._asked.popitem(last=False)
        elif isinstance(message, Response) and message.id is not None:
            request = self._owed.pop(message.id, None)
            if request is not None:
                self._settle(request, message)

    def lost(self, reason: str, unsent: Iterable[Message] = ()) -> list[str]:
        """The connection is gone: the answers owed for every request sent on it (and for
        ``unsent`` ones that will not be), each a retryable ``-32013`` given once. The
        agent's questions asked on it are void."""
        lost = BackendLinkLost(
            "The router connection was lost before it answered", {"reason": reason}
        )
        owed = [*self._owed.values(), *(m for m in unsent if isinstance(m, Request))]
        self._owed.clear()
        self._asked.clear()
        return [encode_error(request.id, lost) for request in owed]

    def forget(self, session_id: SessionId) -> None:
        self.sessions.pop(session_id, None)

    def _settle(self, request: Request, response: Response) -> None:
        method = request.method
        if method == acp.INITIALIZE and response.ok:
            self.initialize = request
        elif method == acp.AUTHENTICATE and response.ok:
            self.authenticate = request
        elif (outcome := acp.session_outcome(request, response)) is not None:
            change, session_id = outcome
            if change is acp.SessionOutcome.RELEASED:
                self.forget(session_id)
            else:  # a session made here comes back by a resume
                how = Attach(method) if method in acp.ATTACHING else Attach.RESUME
                self._attach(session_id, how, request)

    def _attach(self, session_id: SessionId, how: Attach, request: Request) -> None:
        params = request.params if isinstance(request.params, dict) else {}
        self.sessions.pop(session_id, None)
        self.sessions[session_id] = Attached(how, {**params, "sessionId": session_id})
        while len(self.sessions) > MAX_SESSIONS:
            self.sessions.popitem(last=False)


class Reattach:
    """One replay of an editor's state on a new connection.

    :meth:`start` gives the first step's frames; each of the router's answers to them
    goes to :meth:`answered`, which gives the next step's frames once a step is fully
    answered. :attr:`done` then. Frames the router sends meanwhile that are not answers
    to the replay go to the editor as usual, except what :meth:`mutes`.
    """

    def __init__(self, editor: EditorState) -> None:
        self._editor = editor
        self._next_id = 0
        #: replay id -> the request it replays
        self._pending: dict[str, Request] = {}
        #: sessions being loaded again: their history is not sent to the editor twice
        self._loading: dict[str, SessionId] = {}
        self._steps: list[str] = []
        #: the router's answer to the replayed initialize
        self._advertised: Any = None
        #: sessions the router would not attach again, and why (for the log)
        self.dropped: list[tuple[SessionId, str]] = []

    @property
    def done(self) -> bool:
        return not self._pending and not self._steps

    def owns(self, response: Response) -> bool:
        return isinstance(response.id, str) and response.id in self._pending

    def mutes(self, message: Message) -> bool:
        """Whether ``message`` is history a replayed ``session/load`` sends again."""
        return (
            isinstance(message, Notification)
            and message.method == acp.SESSION_UPDATE
            and acp.session_id_of(message) in self._loading.values()
        )

    def start(self) -> list[str]:
        if self._editor.initialize is None:  # nothing was set up: nothing to replay
            return []
        self._steps = ["authenticate", "sessions"]
        return [self._send(self._editor.initialize)]

    def answered(self, response: Response) -> list[str]:
        """Take the answer to a replayed request; the next step's frames, if any.

        Raises:
            ReplayRefused: the router refused the replayed initialize or authenticate.
        """
        request = self._pending.pop(str(response.id))
        self._loading.pop(str(response.id), None)
        if request.method in (acp.INITIALIZE, acp.AUTHENTICATE) and response.error is not None:
            refusal = f"{response.error.code} {response.error.message}"
            raise ReplayRefused(f"the router refused the replayed {request.method}: {refusal}")
        if request.method == acp.INITIALIZE:
            self._advertised = response.result
        elif response.error is not None:
            session_id = acp.session_id_of(request)
            assert session_id is not None
            self._editor.forget(session_id)
            self.dropped.append((session_id, f"{response.error.code} {response.error.message}"))
        frames: list[str] = []
        while not self._pending and self._steps and not frames:
            frames = self._step(self._steps.pop(0))
        return frames

    def _step(self, name: str) -> list[str]:
        if name == "authenticate":
            auth = self._editor.authenticate
            return [] if auth is None else [self._send(auth)]
        return [frame for frame in map(self._attach, list(self._editor.sessions.items())) if frame]

    def _attach(self, item: tuple[SessionId, Attached]) -> str | None:
        session_id, attached = item
        how = self._how(attached.how)
        if how is None:
            self._editor.forget(session_id)
            self.dropped.append((session_id, "the router offers neither resume nor load"))
            return None
        request_id = self._new_id()
        frame = encode_request(request_id, how.value, attached.params)
        self._pending[request_id] = Request(request_id, how.value, attached.params, frame)
        if how is Attach.LOAD:
            self._loading[request_id] = session_id
        return frame

    def _how(self, wanted: Attach) -> Attach | None:
        """``wanted`` when the router offers it, else the other way when it does."""
        result = self._advertised if isinstance(self._advertised, dict) else {}
        agent = result.get("agentCapabilities")
        offered = {
            Attach.RESUME: acp.has_session_capability(result, "resume"),
            Attach.LOAD: isinstance(agent, dict) and agent.get("loadSession") is True,
        }
        if offered[wanted]:
            return wanted
        return next((how for how, ok in offered.items() if ok), None)

    def _send(self, request: Request) -> str:
        request_id = self._new_id()
        self._pending[request_id] = request
        return replace_id(request.text, request_id)

    def _new_id(self) -> str:
        self._next_id += 1
        return f"{REPLAY_ID_PREFIX}{self._next_id}"
