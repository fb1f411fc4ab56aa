"""A ledger of what one client connection's routing core (router.core.routes) told its
shell and its client, carried out as the shell would and checked against the core: the
bookkeeping under :class:`tests.routes_model.Model`."""

from __future__ import annotations

from collections import Counter
from typing import Any

import orjson

from router.core.effects import (
    Answered,
    AskPool,
    Attach,
    AwaitBackend,
    CloseLink,
    Deliver,
    Detach,
    Dropped,
    Effect,
    Effects,
    FailedOver,
    Forwarded,
    Initialize,
    Locate,
    MovedAway,
    Notify,
    OpenLink,
    Place,
    Reply,
    Send,
)
from router.core.phases import Phase
from router.core.routes import ClientRoutes, Limits
from router.protocol import acp
from router.protocol.ids import SessionId
from router.protocol.jsonrpc import RequestId
from router.protocol.reading import parse
from tests.routes_driver import request

BACKENDS = ("a", "b", "c")
IDS: tuple[RequestId, ...] = (0, 1, 2, 3, 4, 5, 6, "0", "a", "acp-router:authenticate:1")
SESSIONS = ("s1", "s2", "s3")
#: weighted towards the methods that place, locate, attach and detach
METHODS = (
    *("session/new",) * 3,
    *("session/prompt",) * 3,
    *("session/resume",) * 3,
    "session/load",
    *("session/close",) * 2,
    "session/status",
    "session/list",
    "_vendor/x",
    "initialize",
    "authenticate",
)
MAX_IN_FLIGHT = 5
MAX_SESSIONS = 2
MAX_AGENT_REQUESTS = 3

Work = Initialize | Place | Locate | AskPool
Queued = tuple[int, RequestId | None, RequestId | None]


class Ledger:
    """The client and the shell around one ClientRoutes: what the core told them, kept
    and checked.

    Each client frame is a *serial* (carried in its params as ``_n``); ``open`` maps the
    request ids in flight to theirs, and every answer the client can see is counted
    against the serial it answers. Every effect the core returns is carried out in order
    (:meth:`carry_out`), as the shell would, and checked on the way: a frame goes only on
    a link opened before it, an unused link ahead is the only kind closed, frames of one
    session leave the core in the order they came (``left``), frames that waited come
    back once, in order (``queued``). :meth:`check` holds the ledger against the core.
    """

    def __init__(self, *, failover: bool = False) -> None:
        limits = Limits(MAX_IN_FLIGHT, MAX_SESSIONS, MAX_AGENT_REQUESTS, failover=failover)
        self.routes = ClientRoutes(limits)
        self.attached: Counter[str] = Counter()
        self.serial = 0
        self.open: dict[RequestId, int] = {}
        self.answers: Counter[int] = Counter()
        self.notes: set[int] = set()  # serials of notifications (they get no answer)
        self.forwarded: set[int] = set()  # serials of requests sent to a backend
        self.on_wire: set[int] = set()  # serials of requests a backend has yet to answer
        self.gone: set[int] = set()  # serials of frames that left the core
        self.left: dict[str, list[int]] = {}  # session -> serials, in the order they left
        #: work the shell has yet to do (a locate, a placement...), by request id
        self.handles: dict[RequestId, Work] = {}
        self.relocated: Counter[RequestId] = Counter()
        self.waiting: set[RequestId] = set()  # client requests held behind their session
        #: per session, the frames waiting behind it, in arrival order: (serial, the
        #: request's id or None for a notification, the request a $/cancel_request names)
        self.queued: dict[str, list[Queued]] = {}
        self.moved: set[int] = set()  # serials that left the core in the current step
        self.holders: dict[RequestId, str] = {}  # resume/load/close in flight -> its session
        #: [failover]: the backends' health the shell waits for, and the sessions orphaned
        self.awaits: list[AwaitBackend] = []
        self.orphans: set[str] = set()
        #: the resumes the router made to fail sessions over, in flight -> their session
        self.internal: dict[RequestId, str] = {}
        self.agent_calls: dict[int, tuple[str, RequestId]] = {}
        self.withdrawing: set[int] = set()  # agent requests of a link being lost
        #: the links the shell holds, as the core's effects made them
        self.linked: set[str] = set()
        #: links opened ahead that nothing was sent on yet, and the call each was for
        self.unused: dict[str, RequestId] = {}
        #: the authenticate round in flight: the client's id, and the backends it waits on
        self.auth_id: RequestId | None = None
        self.auth_waiting: set[str] = set()
        self.auth_text = ""
        self.dropped = 0  # Dropped effects in the current step
        #: serials of the requests the shell observes, and how often each was told answered
        self.observed: set[int] = set()
        self.told: Counter[int] = Counter()
        #: the forward the core told of last: the backend and text of the Send to follow
        self.forwarding: tuple[str, str] | None = None
        init = request("init", "initialize", {})
        assert isinstance(self.routes.receive_client(parse(init))[0], Initialize)
        assert isinstance(self.routes.initialized("init", {})[0], Reply)

    # -- the shell carries out the effects -------------------------------------------------------

    def carry_out(self, effects: Effects) -> None:
        for effect in effects:
            self._carry_out(effect)

    def _carry_out(self, effect: Effect) -> None:
        match effect:
            case OpenLink():
                self._opened(effect)
            case CloseLink(backend):
                assert backend in self.unused, "closed a link that carried frames"
                self.linked.discard(backend)
                del self.unused[backend]
            case Send(backend, text):
                assert backend in self.linked, f"sent to {backend} with no link"
                self.unused.pop(backend, None)
                self._sent(backend, text)
            case Reply(text=text, answers=answers, error=code):
                self._replied(text, answers, code)
            case Notify(text):  # an agent request the client was answering is withdrawn
                frame = orjson.loads(text)
                assert frame["method"] == "$/cancel_request"
                self.withdrawing.remove(frame["params"]["requestId"])
            case MovedAway(_, sessions):  # the fence of a backend given up: its orphans
                assert set(sessions) <= set(SESSIONS)
            case Deliver(text):
                frame = orjson.loads(text)
                if "method" not in frame:  # a backend's answer (agent requests: their step)
                    self._answered(frame["id"])
            case Initialize(call) | Place(call) | AskPool(_, call) | Locate(call):
                self._work(call.id, call.text, effect)
            case AwaitBackend(_, sessions):
                assert all(self.routes.sessions.phase(s) is Phase.ORPHANED for s in sessions)
                self.orphans |= set(sessions)
                self.awaits.append(effect)
            case Attach(_, backend):
                self.attached[backend] += 1
            case Detach(_, backend):
                self.attached[backend] -= 1
            case FailedOver(outcome, session):
                if outcome != "timeout":  # a failover's resume ended: the client saw nothing
                    (request_id,) = [i for i, s in self.internal.items() if s == session]
                    del self.internal[request_id]
                    self._settled(request_id)
            case Dropped():
                self.dropped += 1
            case Forwarded(call, backend):
                assert _serial(call.text) in self.observed, "told of an unobserved request"
                assert self.forwarding is None, "told of a forward that never went"
                self.forwarding = (backend, call.text)
            case Answered(call, _, _, _, gone):
                serial = _serial(call.text)
                assert serial in self.observed
                assert not gone
                assert self.answers[serial] == 1, "told answered before (or without) its answer"
                self.told[serial] += 1
                assert self.told[serial] == 1, "told answered twice"
            case _:  # Learned, Released, NotThere, ResumeSent, Resumed: the shell's records
                pass

    def _opened(self, link: OpenLink) -> None:
        assert link.backend not in self.linked, "a second link to one backend"
        self.linked.add(link.backend)
        assert link.initialize == self.routes.initialize
        assert link.authenticate == self.routes.authenticate
        if link.first:
            assert self.auth_id is not None, "a first frame with no round in flight"
            assert link.first == (self.auth_text,)
            self.auth_waiting.add(link.backend)
        else:
            assert self.auth_id is None, "a link opened during a round skipped it"

    def _sent(self, backend: str, text: str) -> None:
        """A frame went to ``backend``: the client's, or one the router made."""
        frame = orjson.loads(text)
        method, request_id = frame.get("method"), frame.get("id")
        if method is None:  # an answer to an agent request (checked by its step)
            return
        if method == "authenticate":
            self._round(backend, text)
        elif isinstance(request_id, str) and request_id.startswith("acp-router:failover:"):
            assert self.routes.calls[request_id].backend == backend
            return
        elif request_id is not None:
            call = self.routes.calls[request_id]
            assert (call.backend, call.request.text) == (backend, text)
            told = (backend, text) if frame["params"]["_n"] in self.observed else None
            assert self.forwarding == told, "an observed request's forward not told, or told wrong"
            self.forwarding = None
            assert self.open[request_id] == frame["params"]["_n"]
            assert frame["params"]["_n"] not in self.on_wire, "a request sent twice"
            self.on_wire.add(frame["params"]["_n"])
            self.forwarded.add(frame["params"]["_n"])
            self.waiting.discard(request_id)
        else:
            assert frame["params"]["_n"] not in self.gone, "a notification sent twice"
        self.moved.add(frame["params"]["_n"])
        self._left(frame, located=False)

    def _round(self, backend: str, text: str) -> None:
        """The client's ``authenticate`` going out under a router id, to every target."""
        if self.auth_id is None:
            serial = orjson.loads(text)["params"]["_n"]
            (self.auth_id,) = [i for i, n in self.open.items() if n == serial]
            self.auth_text = text
            self.gone.add(serial)
        assert text == self.auth_text
        assert orjson.loads(text)["id"] != self.auth_id  # under a router id
        self.auth_waiting.add(backend)

    def _work(self, request_id: RequestId, text: str, work: Effect) -> None:
        assert isinstance(work, Work)
        assert request_id not in self.handles
        self.handles[request_id] = work
        if isinstance(work, Locate) and work.internal:
            if request_id not in self.internal:  # a failover starts
                self.internal[request_id] = work.session_id
                self.orphans.discard(work.session_id)
            return
        frame = orjson.loads(text)
        assert self.open[request_id] == frame["params"]["_n"]
        self.on_wire.discard(frame["params"]["_n"])  # answered -32002: located again
        self.waiting.discard(request_id)
        self.moved.add(frame["params"]["_n"])
        self._left(frame, located=isinstance(work, Locate))

    def _left(self, frame: dict[str, Any], *, located: bool) -> None:
        """A client frame left the core: note its place in its session's order, and
        whether it holds its session now (a resume or load, or a close being located)."""
        serial = frame["params"]["_n"]
        if serial in self.gone:  # a resume located again, or a located call sent
            return
        self.gone.add(serial)
        method = frame["method"]
        if method not in acp.SESSION_SCOPED:
            return
        session = frame["params"]["sessionId"]
        if method == "session/status" and session in self.orphans:
            return  # read-only: it need not wait for a failover, and does not
        self.left.setdefault(session, []).append(serial)
        if "id" in frame and (method in acp.ATTACHING or (method in acp.RELEASING and located)):
            self.holders[frame["id"]] = session

    def _replied(self, text: str, answers: RequestId | None, code: int | None) -> None:
        frame = orjson.loads(text)
        assert code == (frame["error"]["code"] if "error" in frame else None)
        assert answers == frame["id"]  # what it answers, said as data
        if frame["id"] is None:  # a $/cancel_request naming one of the router's ids
            assert code == -32600
        else:
            self._answered(frame["id"])

    def _answered(self, request_id: RequestId) -> None:
        serial = self.open.pop(request_id)
        self.on_wire.discard(serial)
        self.moved.add(serial)
        self.answers[serial] += 1
        assert self.answers[serial] == 1, f"request {request_id!r} answered twice"
        self.waiting.discard(request_id)
        if request_id == self.auth_id:
            self.auth_id, self.auth_waiting = None, set()
        self._settled(request_id)

    def _settled(self, request_id: RequestId) -> None:
        """A call is over: nothing waits on it, and no unused link ahead outlived it."""
        assert request_id not in self.handles
        self.holders.pop(request_id, None)
        self.relocated.pop(request_id, None)
        assert request_id not in self.unused.values(), "an unused link outlived its call"

    def _queues_settled(self) -> None:
        """What became of the frames that waited, once a step is over. When a session's
        holder settled, its frames were routed again in order: each left (seen in the
        effects), or was dropped (a notification with nowhere to go), or waits again
        behind a frame before it that holds the session anew."""
        dropped = 0
        for session, queue in self.queued.items():
            moved = any(serial in self.moved for serial, _, _ in queue)
            if not queue or not (moved or not self.routes.sessions.holding(SessionId(session))):
                continue  # its holder is still in flight: nothing was routed again
            kept: list[Queued] = []
            holds = False  # a frame routed again holds the session anew
            for entry in queue:
                serial, request_id, named = entry
                if serial in self.moved:
                    holds = holds or request_id in self.holders
                elif request_id is not None:
                    assert holds, f"{request_id!r} neither left nor waits behind a holder"
                    kept.append(entry)
                elif holds if named is None else self._held(named):
                    kept.append(entry)
                else:
                    dropped += 1
            self.queued[session] = kept
        assert dropped <= self.dropped

    def _held(self, request_id: RequestId) -> bool:
        call = self.routes.calls.get(request_id)
        return call is not None and call.held

    def _held_notes(self) -> int:
        return sum(1 for q in self.queued.values() for _, request_id, _ in q if request_id is None)

    def _is_held(self, session: str) -> bool:
        """Whether a frame for ``session`` waits: a resume/load/close of it in flight holds
        it, or it waits for a failover (or its failover's resume)."""
        return (
            session in self.holders.values()
            or session in self.orphans
            or session in self.internal.values()
        )

    def _room(self) -> bool:
        return len(self.open) + len(self.internal) + self._held_notes() < MAX_IN_FLIGHT

    # -- checks --------------------------------------------------------------------------------

    def check(self) -> None:
        routes = self.routes
        assert set(routes.calls) == set(self.open) | set(self.internal)
        for request_id, call in routes.calls.items():
            unrouted = request_id in self.handles or call.held or request_id == self.auth_id
            assert (call.backend is None) == unrouted
            assert call.held == (request_id in self.waiting)
        assert routes.held_notifications == self._held_notes()
        queued = {r for q in self.queued.values() for _, r, _ in q if r is not None}
        assert queued == self.waiting
        assert set(self.answers.values()) <= {1}
        assert +self.attached == Counter(routes.attached().values())
        assert all(count >= 0 for count in self.attached.values())
        assert len(routes.attached()) <= MAX_SESSIONS
        for session, serials in self.left.items():
            assert serials == sorted(set(serials)), f"{session}'s frames left out of order"
        for session in SESSIONS:
            assert routes.sessions.holding(SessionId(session)) == self._is_held(session)
        orphaned = {s for s in SESSIONS if routes.sessions.phase(SessionId(s)) is Phase.ORPHANED}
        assert orphaned == self.orphans
        assert self.linked == set(routes.links.linked())
        assert self.auth_id == (None if routes.auth.round is None else routes.auth.round.request.id)
        assert self.forwarding is None
        assert {s for s in self.observed if self.answers[s]} == set(+self.told)


def _serial(text: str) -> int:
    serial: int = orjson.loads(text)["params"]["_n"]
    return serial
