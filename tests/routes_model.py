"""Random traffic around one client connection's routing core: the client, the shell and
the backends each take steps (:class:`Model`), and every effect is carried out and
checked by the :class:`~tests.routes_ledger.Ledger`."""

from __future__ import annotations

from collections.abc import Callable

import orjson

from router.core.effects import (
    CloseLink,
    Deliver,
    Dropped,
    Effect,
    Effects,
    FailedOver,
    Forwarded,
    Initialize,
    Locate,
    MovedAway,
    NotThere,
    OpenLink,
    Place,
    Reply,
    Resumed,
    ResumeSent,
    Send,
)
from router.core.health import Health
from router.core.phases import Phase
from router.core.routes import Limits
from router.protocol import acp
from router.protocol.errors import LocateInconclusive, NoBackendAvailable
from router.protocol.ids import BackendId, SessionId
from router.protocol.jsonrpc import RequestId
from router.protocol.reading import parse
from tests.routes_driver import error, new_params, notification, request, result, sid
from tests.routes_ledger import (
    BACKENDS,
    IDS,
    MAX_AGENT_REQUESTS,
    MAX_SESSIONS,
    METHODS,
    SESSIONS,
    Ledger,
)


class Model(Ledger):
    """The client, the shell and the backends acting at random around one ClientRoutes.

    Each step takes three numbers that choose what it acts on among what exists then,
    and the ledger is checked after it; :meth:`finish` lets every backend go and has the
    shell give up on what is left, after which every request has had its one answer.
    """

    def step(self, action: Callable[[Model, int, int, int], None], x: int, y: int, z: int) -> None:
        self.dropped = 0
        self.moved = set()
        action(self, x, y, z)
        self._queues_settled()
        self.check()

    # -- the client ----------------------------------------------------------------------------

    def client_request(self, x: int, y: int, z: int) -> None:
        request_id, method, session = IDS[x % len(IDS)], METHODS[y % len(METHODS)], SESSIONS[z % 3]
        self.serial += 1
        text = request(request_id, method, new_params() | sid(session, _n=self.serial))
        unscoped = ("session/new", "session/list", "_vendor/x", "initialize", "authenticate")
        reserved = isinstance(request_id, str) and request_id.startswith("acp-router:")
        fresh = request_id not in self.open and not reserved
        # a status of an orphaned session is answered from the pool, never held
        scoped = method not in unscoped and not (
            method == "session/status" and session in self.orphans
        )
        expect_held = scoped and fresh and self._room() and self._is_held(session)
        linked = set(self.linked)
        observed = self.serial % 2 == 0  # the shell observes every other request
        if observed:
            self.observed.add(self.serial)
        effects = self.routes.receive_client(parse(text), observed=observed)
        if not fresh:  # reserved, or a refused duplicate: the open one is untouched
            refusal, *told = effects
            assert isinstance(refusal, Reply)
            decoded = orjson.loads(refusal.text)
            assert (decoded["id"], decoded["error"]["code"]) == (request_id, -32600)
            self.answers[self.serial] += 1
            assert len(told) == observed
            self.carry_out(tuple(told))
            return
        self.open[request_id] = self.serial
        assert (effects == ()) == expect_held, (effects, expect_held)
        if expect_held:
            assert self.routes.calls[request_id].held
            assert self.routes.calls[request_id].session_id == session
            self.waiting.add(request_id)
            self.queued.setdefault(session, []).append((self.serial, request_id, None))
            return
        self.carry_out(effects)
        if method == "authenticate" and self.auth_id == request_id:
            assert self.auth_waiting == linked  # every linked backend, and only those

    def client_cancels(self, x: int, y: int, z: int) -> None:
        self.serial += 1
        self.notes.add(self.serial)
        named: RequestId | None = None
        if z % 2:
            named = IDS[x % len(IDS)]
            note = notification("$/cancel_request", {"requestId": named, "_n": self.serial})
            call = self.routes.calls.get(named)
            backend = call.backend if call is not None else None
            held = call.session_id if call is not None and named in self.waiting else None
        else:
            session = SESSIONS[y % 3]
            note = notification("session/cancel", sid(session, _n=self.serial))
            backend = self.routes.attached().get(SessionId(session))
            held = SessionId(session) if self._is_held(session) else None
        room = self._room()
        effects = self.routes.receive_client(parse(note))
        if isinstance(named, str) and named.startswith("acp-router:"):
            (refusal,) = effects
            assert isinstance(refusal, Reply)
        elif held is not None and room:
            assert effects == ()
            self.queued.setdefault(held, []).append((self.serial, None, named))
        elif held is not None or backend is None:
            (drop,) = effects
            assert isinstance(drop, Dropped)
        else:
            assert effects == (Send(backend, note),)
        self.carry_out(effects)

    def client_answers_an_agent(self, x: int, y: int, z: int) -> None:
        if not self.agent_calls:
            return
        router_id = sorted(self.agent_calls)[x % len(self.agent_calls)]
        backend, original = self.agent_calls.pop(router_id)
        effects = self.routes.receive_client(parse(result(router_id, {"ok": router_id})))
        assert effects == (Send(BackendId(backend), result(original, {"ok": router_id})),)
        self.carry_out(effects)

    # -- the shell -----------------------------------------------------------------------------

    def shell_decides(self, x: int, y: int, z: int) -> None:
        """The shell carries out a piece of work: a placement or a locate finds a backend,
        the pool answers, or the work fails."""
        if not self.handles:
            return
        request_id = sorted(self.handles, key=repr)[x % len(self.handles)]
        work = self.handles.pop(request_id)
        routed = isinstance(work, Place | Locate)
        choices = [*BACKENDS, "fail"] if routed else ["answer", "fail"]
        if isinstance(work, Initialize):
            choices.append("only")  # a pool of one
        choice = choices[y % len(choices)]
        effects: Effects
        if choice == "fail":
            failure = LocateInconclusive() if routed else NoBackendAvailable()
            effects = self.routes.fail(request_id, failure)
        elif choice == "answer":
            effects = self.routes.answer(request_id, {})
        elif choice == "only":
            effects = self.routes.initialized(request_id, {}, BackendId(BACKENDS[z % 3]))
        elif isinstance(work, Place):
            effects = self.routes.placed(request_id, BackendId(choice))
            if work.request.method != "authenticate":
                assert _frames(effects) == [Send(BackendId(choice), work.request.text)]
        else:
            assert isinstance(work, Locate)
            effects = self.routes.located(request_id, BackendId(choice))
            sent: list[Effect] = [Send(BackendId(choice), work.request.text)]
            if work.request.method in acp.ATTACHING:
                sent.insert(0, ResumeSent(retry=bool(work.tried)))
            assert _frames(effects) == sent
        self.carry_out(effects)
        if isinstance(work, Place) and work.request.method == "authenticate" and choice != "fail":
            assert (self.auth_id, self.auth_waiting) == (request_id, {choice})
        assert request_id not in self.unused.values(), "an unused link outlived its call"

    def shell_opens_ahead(self, x: int, y: int, z: int) -> None:
        """The shell guesses where a resume being located will go and opens that link."""
        locating = sorted((i for i, w in self.handles.items() if isinstance(w, Locate)), key=repr)
        if not locating:
            return
        request_id, backend = locating[x % len(locating)], BACKENDS[y % 3]
        fresh = backend not in self.linked
        effects = self.routes.open_ahead(request_id, BackendId(backend))
        assert len(effects) == fresh
        assert all(isinstance(e, OpenLink) for e in effects)
        joins = self.auth_id is not None
        self.carry_out(effects)
        if fresh and not joins:
            self.unused[backend] = request_id

    def shell_fails_over(self, x: int, y: int, z: int) -> None:
        """A backend's health is known after a link to it was lost ([failover]): its
        orphans are resumed where they live now, or, unknown still, given up."""
        if not self.awaits:
            return
        known = self.awaits.pop(x % len(self.awaits))
        health = (Health.UNKNOWN, Health.UP, Health.GONE)[y % 3]
        orphans = [s for s in known.sessions if s in self.orphans]
        effects = self.routes.backend_known(known.backend, known.sessions, health)
        if health is Health.UNKNOWN:
            timeouts = [e for e in effects if isinstance(e, FailedOver)]
            assert timeouts == [FailedOver("timeout", s) for s in orphans]
            self.orphans -= set(orphans)
        else:
            if health is Health.GONE:  # a fence first: it may come back as the same process
                fence, *effects_ = effects
                assert fence == MovedAway(known.backend, known.sessions)
            else:
                effects_ = list(effects)
            assert [e.session_id for e in effects_ if isinstance(e, Locate)] == orphans
            for locate in effects_:
                assert isinstance(locate, Locate)
                assert locate.internal
                assert locate.request.method == "session/resume"
                assert locate.request.param("sessionId") == locate.session_id
                assert str(locate.request.id).startswith("acp-router:failover:")
        self.carry_out(effects)
        again = self.routes.backend_known(known.backend, known.sessions, health)
        assert not any(isinstance(e, Locate | FailedOver) for e in again)  # once

    # -- backends ------------------------------------------------------------------------------

    def backend_answers(self, x: int, y: int, z: int) -> None:
        waiting = sorted((i for i, c in self.routes.calls.items() if c.backend), key=repr)
        if not waiting:
            return
        request_id = waiting[x % len(waiting)]
        call = self.routes.calls[request_id]
        assert call.backend is not None
        outcome = ("ok", "not_found", "error")[y % 3]
        session = call.session_id
        if outcome == "ok":
            text = result(request_id, sid(SESSIONS[z % 3]))
            if call.request.method == "session/new":
                session = SessionId(SESSIONS[z % 3])
        else:
            text = error(request_id, -32002 if outcome == "not_found" else -32603)
        before = self.routes.attached()
        phase = self.routes.sessions.phase(session) if session is not None else None
        effects = self.routes.receive_backend(call.backend, parse(text))
        self._check_attachment(call.request.method, outcome, call.backend, session, before, phase)
        if effects and isinstance(effects[-1], Locate) and effects[-1].request == call.request:
            assert outcome == "not_found"
            assert call.request.method in acp.ATTACHING
            assert session is not None
            assert effects == (
                Resumed(call.backend, "not_found"),
                NotThere(session, call.backend),
                Locate(call.request, session, (*call.tried, call.backend), call.internal),
            )
            self.relocated[request_id] += 1
            assert self.relocated[request_id] < Limits().max_resume_attempts, "unbounded"
        elif request_id in self.internal:  # never delivered to the client
            assert not any(isinstance(e, Deliver) for e in effects)
            ended = FailedOver("ok" if outcome == "ok" else "failed", session)
            assert ended in effects
        else:
            assert next(e for e in effects if isinstance(e, Deliver)) == Deliver(text)
        self.carry_out(effects)

    def _check_attachment(
        self,
        method: str,
        outcome: str,
        backend: str,
        session: str | None,
        before: dict[SessionId, BackendId],
        phase: Phase | None,
    ) -> None:
        after = self.routes.attached()
        closed = method == "session/close" and outcome in ("ok", "not_found")
        if closed and session is not None and before.get(SessionId(session)) == backend:
            assert after == {s: b for s, b in before.items() if s != session}
        elif outcome != "ok" or session is None:
            assert after == before
        elif method in ("session/resume", "session/load") or (
            # a session made is routed unless it is routed otherwise (held)
            method == "session/new" and phase in (Phase.DETACHED, Phase.ATTACHED)
        ):
            room = session in before or len(before) < MAX_SESSIONS
            expected = (before | {SessionId(session): BackendId(backend)}) if room else before
            assert after == expected
        else:
            assert after == before

    def backend_answers_the_round(self, x: int, y: int, z: int) -> None:
        """A backend the authenticate round waits on accepts or refuses it."""
        if self.auth_id is None:
            return
        backend = sorted(self.auth_waiting)[x % len(self.auth_waiting)]
        routed_id = orjson.loads(self.auth_text)["id"]
        accepts = y % 3 != 0
        text = result(routed_id, {}) if accepts else error(routed_id, -32000)
        effects = self.routes.receive_backend(BackendId(backend), parse(text))
        self.auth_waiting.discard(backend)
        request_id = self.auth_id
        if accepts and self.auth_waiting:
            (drop,) = effects
            assert isinstance(drop, Dropped)
        else:
            answer, *told = effects
            assert isinstance(answer, Deliver)
            assert orjson.loads(answer.text)["id"] == request_id
            assert len(told) == (self.open[request_id] in self.observed)
        self.carry_out(effects)
        if self.routes.auth.round is None and accepts:
            assert self.routes.authenticate is not None
            assert self.routes.authenticate.id == request_id

    def backend_answers_nothing_in_flight(self, x: int, y: int, z: int) -> None:
        backend, request_id = BACKENDS[x % 3], IDS[y % len(IDS)]
        call = self.routes.calls.get(request_id)
        answers_the_round = (
            backend in self.auth_waiting and request_id == orjson.loads(self.auth_text)["id"]
        )
        if (call is None or call.backend != backend) and not answers_the_round:
            effects = self.routes.receive_backend(BackendId(backend), parse(result(request_id, {})))
            assert len(effects) == 1
            assert isinstance(effects[0], Dropped)
            self.carry_out(effects)

    def agent_request(self, x: int, y: int, z: int) -> None:
        backend, original = BACKENDS[x % 3], IDS[y % len(IDS)]
        if backend not in self.linked:
            return  # only a backend with a link sends anything
        effects = self.routes.receive_backend(BackendId(backend), parse(request(original, "fs/x")))
        self.unused.pop(backend, None)  # a link that carries a request is in use
        (effect,) = effects
        if len(self.agent_calls) >= MAX_AGENT_REQUESTS:
            assert isinstance(effect, Send)
            assert effect.backend == backend
        else:
            assert isinstance(effect, Deliver)
            router_id = orjson.loads(effect.text)["id"]
            assert router_id not in self.agent_calls
            self.agent_calls[router_id] = (backend, original)
        self.carry_out(effects)

    def backend_lost(self, x: int, y: int, z: int) -> None:
        backend = BACKENDS[x % 3]
        failed = {i for i, c in self.routes.calls.items() if c.backend == backend}
        if backend in self.auth_waiting and self.auth_id is not None:
            failed.add(self.auth_id)  # the round waits on it
        self.withdrawing = {r for r, (b, _) in self.agent_calls.items() if b == backend}
        self.agent_calls = {r: e for r, e in self.agent_calls.items() if e[0] != backend}
        self.linked.discard(backend)
        self.unused.pop(backend, None)
        effects = self.routes.backend_lost(BackendId(backend))
        for answer in effects:
            if isinstance(answer, Reply) and orjson.loads(answer.text).get("id") in failed:
                assert answer.error == -32013
        self.carry_out(effects)
        assert not self.withdrawing, "an agent request of the link was not withdrawn"
        assert not failed & set(self.open), "a call on the link was not answered"
        assert all(c.backend != backend for c in self.routes.calls.values())
        assert backend not in self.routes.attached().values()

    def finish(self) -> None:
        # Every backend goes away: whatever was forwarded has its one answer now ...
        for backend in range(len(BACKENDS)):
            self.step(Model.backend_lost, backend, 0, 0)
        for serial in self.forwarded - set(self.open.values()):
            assert self.answers[serial] == 1
        # ... and the rest waits on the shell, or behind a call that waits on the shell
        # (or on a failover the shell has not decided yet).
        assert set(self.open) == (set(self.handles) - set(self.internal)) | self.waiting
        while self.awaits or self.handles:  # the shell gives up on each, one at a time
            if self.awaits:
                self.step(Model.shell_fails_over, 0, 0, 0)  # unknown still: given up
            else:
                request_id = sorted(self.handles, key=repr)[0]
                del self.handles[request_id]
                self.moved = set()
                self.carry_out(self.routes.fail(request_id, NoBackendAvailable()))
                self._queues_settled()
                self.check()
        assert not self.waiting
        assert self._held_notes() == 0
        assert list(self.routes.calls) == []
        assert sorted(self.answers) == sorted(
            n for n in range(1, self.serial + 1) if n not in self.notes
        )
        assert set(self.answers.values()) <= {1}


def _frames(effects: Effects) -> list[Effect]:
    """``effects`` without the links opened and closed, and the forwards told (the
    ledger checks those), on the way."""
    return [e for e in effects if not isinstance(e, OpenLink | CloseLink | Forwarded)]


STEPS = (
    *(Model.client_request,) * 4,
    *(Model.shell_decides,) * 3,
    *(Model.backend_answers,) * 3,
    Model.shell_opens_ahead,
    Model.backend_answers_the_round,
    Model.client_cancels,
    Model.client_answers_an_agent,
    Model.backend_answers_nothing_in_flight,
    Model.agent_request,
    Model.backend_lost,
)
