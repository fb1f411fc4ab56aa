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

The router may also let go of a session while the connection stays up: when the agent
that held it was restarted, say, its next request is answered ``-32010`` ("send
session/resume first"). :class:`Reattachments` keeps that answer from the editor,
attaches the session again the same way (one :class:`Reattach` of that session alone)
and sends the request once more: a request answered ``-32010`` never ran (the router
answers it before forwarding; the reference agent, before a turn starts, or says
``data.turnStarted`` when a turn it had started lost its session, and then the editor
gets the retryable ``-32013`` instead of a second run).

Nothing here reads a clock or does I/O.
"""

from __future__ import annotations

import enum
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Final

from router.protocol import acp
from router.protocol.errors import BackendLinkLost, ErrorObject, SessionNotAttached
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
from router.protocol.reading import parse
from router.protocol.splice import replace_id

#: the bridge's own request ids start so (the router reserves its own,
#: :data:`router.protocol.ids.RESERVED_ID_PREFIX`), and skip any id an editor request in
#: flight uses
REPLAY_ID_PREFIX: Final = "acp-bridge:"
#: sessions remembered for the replay (the oldest attached are forgotten first)
MAX_SESSIONS: Final = 4096
#: agent requests awaiting the editor's answer (the oldest are forgotten first)
MAX_ASKED: Final = 4096


class AttachMethod(enum.Enum):
    """The method that attaches a session again: as the editor did, or as the router allows."""

    RESUME = acp.SESSION_RESUME
    LOAD = acp.SESSION_LOAD


@dataclass(frozen=True, slots=True)
class Reattachable:
    """A session the editor attached, and the params that attach it again."""

    how: AttachMethod
    params: dict[str, Any]


class ReplayRefused(Exception):
    """The router refused the replayed ``initialize`` or ``authenticate``: retrying will
    not help."""


class EditorState:
    """What one editor holds on its router connection."""

    def __init__(self) -> None:
        self.initialize: Request | None = None
        #: the router's answer to it (what it offers: resume, load)
        self.advertised: Any = None
        self.authenticate: Request | None = None
        self.sessions: OrderedDict[SessionId, Reattachable] = OrderedDict()
        self._next_id = 0
        #: editor requests sent on this connection and not answered yet
        self._owed: dict[RequestId, Request] = {}
        #: agent requests delivered on this connection and not answered yet
        self._asked: OrderedDict[RequestId, None] = OrderedDict()

    @property
    def owes(self) -> bool:
        """Whether any editor request still awaits its answer."""
        return bool(self._owed)

    def owed(self, request_id: RequestId | None) -> Request | None:
        """The editor request that awaits the answer ``request_id``, if any."""
        return None if request_id is None else self._owed.get(request_id)

    def new_id(self) -> str:
        """A request id of the bridge's own, none the editor awaits an answer to."""
        while True:
            self._next_id += 1
            request_id = f"{REPLAY_ID_PREFIX}{self._next_id}"
            if request_id not in self._owed:
                return request_id

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
            self.advertised = response.result
        elif method == acp.AUTHENTICATE and response.ok:
            self.authenticate = request
        elif (outcome := acp.session_outcome(request, response)) is not None:
            change, session_id = outcome
            if change is acp.SessionOutcome.RELEASED:
                self.forget(session_id)
            else:  # a session made here comes back by a resume
                how = AttachMethod(method) if method in acp.ATTACHING else AttachMethod.RESUME
                self._attach(session_id, how, request)

    def _attach(self, session_id: SessionId, how: AttachMethod, request: Request) -> None:
        params = request.params if isinstance(request.params, dict) else {}
        self.sessions.pop(session_id, None)
        self.sessions[session_id] = Reattachable(how, {**params, "sessionId": session_id})
        while len(self.sessions) > MAX_SESSIONS:
            self.sessions.popitem(last=False)


class Reattach:
    """One replay of the editor's state: all of it on a new connection, or (``only``) one
    session on the connection it has.

    :meth:`start` gives the first step's frames; each of the router's answers to them
    goes to :meth:`answered`, which gives the next step's frames once a step is fully
    answered. :attr:`done` then. Frames the router sends meanwhile that are not answers
    to the replay go to the editor as usual, except what :meth:`mutes`.
    """

    def __init__(self, editor: EditorState, only: SessionId | None = None) -> None:
        self._editor = editor
        self._only = only
        #: replay id -> the request it replays
        self._pending: dict[str, Request] = {}
        #: sessions being loaded again: their history is not sent to the editor twice
        self._loading: dict[str, SessionId] = {}
        self._steps: list[str] = []
        #: sessions the router would not attach again, and why (for the log); those it
        #: refused for good (not ``data.retryable``) are forgotten
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
        if self._only is not None:
            return self._step("sessions")
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
            self._editor.advertised = response.result
        elif response.error is not None:
            session_id = acp.session_id_of(request)
            assert session_id is not None
            if not retryable(response.error):
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
        sessions = self._editor.sessions
        if self._only is None:
            chosen = list(sessions.items())
        else:
            chosen = [(self._only, sessions[self._only])] if self._only in sessions else []
        return [frame for frame in map(self._attach, chosen) if frame]

    def _attach(self, item: tuple[SessionId, Reattachable]) -> str | None:
        session_id, attached = item
        how = self._how(attached.how)
        if how is None:
            self._editor.forget(session_id)
            self.dropped.append((session_id, "the router offers neither resume nor load"))
            return None
        request_id = self._editor.new_id()
        frame = encode_request(request_id, how.value, attached.params)
        self._pending[request_id] = Request(request_id, how.value, attached.params, frame)
        if how is AttachMethod.LOAD:
            self._loading[request_id] = session_id
        return frame

    def _how(self, wanted: AttachMethod) -> AttachMethod | None:
        """``wanted`` when the router offers it, else the other way when it does."""
        result = self._editor.advertised if isinstance(self._editor.advertised, dict) else {}
        agent = result.get("agentCapabilities")
        offered = {
            AttachMethod.RESUME: acp.has_session_capability(result, "resume"),
            AttachMethod.LOAD: isinstance(agent, dict) and agent.get("loadSession") is True,
        }
        if offered[wanted]:
            return wanted
        return next((how for how, ok in offered.items() if ok), None)

    def _send(self, request: Request) -> str:
        request_id = self._editor.new_id()
        self._pending[request_id] = request
        return replace_id(request.text, request_id)


@dataclass(frozen=True, slots=True)
class Steps:
    """What the bridge does with a frame from the router instead of passing it on."""

    to_router: list[str]
    to_editor: list[str]


@dataclass(frozen=True, slots=True)
class _Held:
    """An editor request answered ``-32010``, held while its session is attached again."""

    request: Request
    answer: Response


#: editor requests held at once (more get their ``-32010`` as it came)
MAX_HELD: Final = 4096


class Reattachments:
    """Sessions the router let go of while the connection stayed up, attached again.

    An answer ``-32010`` to an editor request for a session the editor has attached (and
    that is not itself an answer to a request sent again) is held, and the session is
    attached again (:class:`Reattach` with ``only``); meanwhile more such answers for it
    wait too. Once it is attached, each held request is sent again, once; if the router
    would not attach it, each gets the router's refusal when that is retryable (the
    editor may try again), else its own ``-32010`` as it came. One per connection.
    """

    def __init__(self, editor: EditorState) -> None:
        self._editor = editor
        self._running: dict[SessionId, Reattach] = {}
        self._held: dict[SessionId, list[_Held]] = {}
        #: editor requests sent again, whose next answer goes to the editor as it is
        self._resent: set[RequestId] = set()

    def take(self, message: Message) -> Steps | None:
        """What to do with ``message`` from the router instead of passing it to the
        editor; None: pass it on, as usual."""
        if isinstance(message, Notification):
            muted = any(run.mutes(message) for run in self._running.values())
            return Steps([], []) if muted else None
        if not isinstance(message, Response) or message.id is None:
            return None
        for attaching, run in self._running.items():
            if run.owns(message):
                run.answered(message)
                return self._finish(attaching, message)
        if message.id in self._resent:
            self._resent.discard(message.id)
            return None
        request = self._editor.owed(message.id)
        detached = None if request is None else self._detached(request, message)
        if request is None or detached is None:
            return None
        return self._hold(detached, _Held(request, message))

    def _detached(self, request: Request, answer: Response) -> SessionId | None:
        """The session ``answer`` says is not attached, when it is one to attach again."""
        error = answer.error
        session_id = acp.session_id_of(request)
        if error is None or error.code != SessionNotAttached.code or session_id is None:
            return None
        if request.method in acp.ATTACHING | acp.RELEASING:
            return None
        held = sum(len(waiting) for waiting in self._held.values())
        return session_id if session_id in self._editor.sessions and held < MAX_HELD else None

    def _hold(self, session_id: SessionId, held: _Held) -> Steps:
        self._held.setdefault(session_id, []).append(held)
        if session_id in self._running:
            return Steps([], [])
        run = Reattach(self._editor, only=session_id)
        self._running[session_id] = run
        return Steps(run.start(), [])

    def _finish(self, session_id: SessionId, response: Response) -> Steps:
        del self._running[session_id]
        held = self._held.pop(session_id, [])
        if response.ok:
            again = [h for h in held if not _turn_started(h.answer)]
            self._resent.update(h.request.id for h in again)
            cut = [self._answer(h, _cut_short(h.request)) for h in held if h not in again]
            return Steps([h.request.text for h in again], cut)
        refusal = response.error
        assert refusal is not None
        answers = [
            self._answer(h, encode_error(h.request.id, refusal) if retryable(refusal) else None)
            for h in held
        ]
        return Steps([], answers)

    def _answer(self, held: _Held, text: str | None) -> str:
        """The editor's answer to a held request: ``text``, or the one it got."""
        answer = held.answer if text is None else parse(text)
        self._editor.received(answer)
        return answer.text


def retryable(error: ErrorObject) -> bool:
    """Whether an error says trying again may help (the router's ``data.retryable``)."""
    return isinstance(error.data, dict) and error.data.get("retryable") is True


def _turn_started(answer: Response) -> bool:
    data = answer.error.data if answer.error is not None else None
    return isinstance(data, dict) and data.get("turnStarted") is True


def _cut_short(request: Request) -> str:
    lost = BackendLinkLost(
        "The session moved to another agent instance while the request ran",
        {"reason": "the session moved during the request; it is attached again: send it again"},
    )
    return encode_error(request.id, lost)
