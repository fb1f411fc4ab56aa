"""The pool of backends as the router's I/O shell sees it: control links, probes,
the locator (hint, fan-out, single-flight), pool-wide ``session/status`` and
``session/list``, and the capabilities the router advertises.

Decisions come from the sans-I/O core (:mod:`router.core.locate`,
:mod:`router.core.placement`, :mod:`router.core.listing`); this module only does the
waiting.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import time
import uuid
from collections.abc import AsyncIterator, Iterable
from typing import Any

import aiohttp

from router.core import listing
from router.core.health import BackendState, CameUp, Event, Health, transition
from router.core.locate import Located, LocationCache, Outcome, decide, pool_status
from router.core.placement import Node, Ranking, Spread
from router.core.routes import Attach, Change
from router.protocol import acp
from router.protocol.acp import ProbeResult
from router.protocol.errors import (
    BackendLinkLost,
    JsonRpcError,
    LocateInconclusive,
    NoBackendAvailable,
    SessionNotFound,
)
from router.protocol.ids import BackendId, SessionId
from router.server import log_context
from router.server.config import Settings
from router.server.control import ControlLink
from router.server.metrics import Metrics
from router.server.tls import backend_context

logger = logging.getLogger(__name__)

#: cap on locates running at once; more wait their turn instead of storming the pool
MAX_CONCURRENT_LOCATES = 256

#: a locate is shared by the resumes of one session that have tried the same backends
_LocateKey = tuple[SessionId, tuple[BackendId, ...]]


class Pool:
    def __init__(self, settings: Settings, metrics: Metrics, http: aiohttp.ClientSession) -> None:
        self.settings = settings
        self.aliases = settings.probe.aliases
        self.metrics = metrics
        self.ranking = Ranking(Node(BackendId(b.id), b.weight) for b in settings.backends)
        self._clock = time.monotonic
        self._grace = settings.control.down_grace_ms / 1000
        self._verify_after = settings.cache.verify_seconds
        self.links = {
            BackendId(b.id): ControlLink(
                b,
                settings.control,
                http,
                self._link_event,
                metrics,
                max_message_bytes=settings.router.max_message_bytes,
                connect_timeout=settings.router.connect_timeout_ms / 1000,
            )
            for b in settings.backends
        }
        self.cache = LocationCache(
            settings.cache.max_entries,
            settings.cache.ttl_seconds,
            self._clock,
            remember=settings.cache.remember_seconds,
        )
        started = self._clock()
        self.states = {backend: BackendState.starting(started) for backend in self.links}
        self.attached: dict[BackendId, int] = dict.fromkeys(self.links, 0)
        # a random salt: replicas break their ties differently
        self.spread = Spread(settings.placement.decay_seconds, salt=uuid.uuid4().hex)
        #: session -> backend -> how many connections of this router have it attached there
        self.attachments: dict[SessionId, dict[BackendId, int]] = {}
        self._inflight: dict[_LocateKey, asyncio.Task[Located]] = {}
        self._locate_slots = asyncio.Semaphore(MAX_CONCURRENT_LOCATES)
        self.ready_changed = asyncio.Event()
        #: pulsed whenever ``attached`` changes
        self.attached_changed = asyncio.Event()
        metrics.declare_backends(list(self.links))
        metrics.watch_cache(self.cache.__len__)
        metrics.watch_health(list(self.links), self.health)

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[Pool]:
        """Run every control link for the duration of the context."""
        async with asyncio.TaskGroup() as group:
            controls = [
                group.create_task(link.run(), name=f"control-{i}") for i, link in self.links.items()
            ]
            try:
                yield self
            finally:
                for control in controls:
                    control.cancel()
                for locate in self._inflight.values():
                    locate.cancel()

    def _link_event(self, link: ControlLink, event: Event) -> None:
        """A control link reported up, down or refused: move the backend's state."""
        backend = link.id
        before = self.states[backend]
        step = transition(before, event, now=self._clock(), grace=self._grace)
        self.states[backend] = step.state
        if isinstance(event, CameUp) or before.health is Health.UP:
            up = isinstance(event, CameUp)
            self.metrics.backend_up.labels(backend).set(1 if up else 0)
            self.metrics.backend_state_changes.labels(backend, "up" if up else "down").inc()
        if step.restarted:
            logger.warning("backend %s came back as a new process", backend)
            self.metrics.backend_restarts.labels(backend).inc()
        if step.lost_memory:
            if step.state.health is Health.GONE:
                logger.warning("backend %s is gone: its sessions are no longer in memory", backend)
                self.metrics.backend_state_changes.labels(backend, "gone").inc()
            self.cache.forget_backend(backend)
        self.ready_changed.set()
        self.ready_changed.clear()

    # -- membership ------------------------------------------------------------------------------

    def health(self, backend: BackendId) -> Health:
        """Up, unknown (down, but may still run sessions) or gone, as of now."""
        return self.states[backend].at(self._clock(), self._grace)

    def ready(self) -> list[BackendId]:
        """Backends that are up: probed, and new sessions may go there."""
        return [b for b in self.links if self.health(b) is Health.UP]

    def unreachable(self, backends: Iterable[BackendId] | None = None) -> list[BackendId]:
        """Backends that are down but not gone (:mod:`router.core.health`), in the given order."""
        ordered = self.links if backends is None else backends
        return [b for b in ordered if self.health(b) is Health.UNKNOWN]

    def order(self, session_id: SessionId) -> list[BackendId]:
        """Backends that are up, in the session's rendezvous order."""
        return [b for b in self.ranking.rank(session_id) if self.health(b) is Health.UP]

    def url(self, backend: BackendId) -> str:
        return self.links[backend].spec.url

    def tls(self, backend: BackendId) -> ssl.SSLContext | None:
        return backend_context(self.links[backend].spec)

    def place_new(self) -> BackendId:
        """A backend for a new session (:meth:`router.core.placement.Spread.place`)."""
        candidates = [node for node in self.ranking.nodes if self.links[node.id].up]
        backend = self.spread.place(candidates, self.attached, time.monotonic())
        if backend is None:
            raise NoBackendAvailable()
        return backend

    def record(self, changes: Iterable[Change]) -> None:
        """Count sessions attached to or detached from backends on some connection."""
        for change in changes:
            delta = 1 if isinstance(change, Attach) else -1
            self.attached[change.backend] += delta
            self.metrics.attached_sessions.labels(change.backend).set(self.attached[change.backend])
            where = self.attachments.setdefault(change.session_id, {})
            where[change.backend] = where.get(change.backend, 0) + delta
            if where[change.backend] <= 0:
                del where[change.backend]
            if not where:
                del self.attachments[change.session_id]
        self.attached_changed.set()
        self.attached_changed.clear()

    def attached_here(self, session_id: SessionId) -> dict[BackendId, ProbeResult]:
        """Backends the session is attached to on some connection of this router: it is
        active there, whether or not that backend can be probed."""
        return dict.fromkeys(self.attachments.get(session_id, ()), ProbeResult.ACTIVE)

    def learn(self, session_id: SessionId, backend: BackendId, *, created: bool) -> None:
        """A backend's answer shows ``session_id`` living there: remember it.

        A session it just ``created`` lives nowhere else (its id is new), which is as good
        as a fan-out that found it active only there.
        """
        hint = self.cache.hint(session_id)
        checked = hint.checked if hint is not None and hint.backend == backend else None
        self._remember(session_id, backend, self._clock() if created else checked)

    def _remember(self, session_id: SessionId, backend: BackendId, checked: float | None) -> None:
        lasting = not self.links[backend].supports("status")
        self.cache.put(session_id, backend, checked=checked, lasting=lasting)

    def capabilities(self) -> dict[str, Any]:
        """What the router advertises: the pool's common ground, plus what it answers itself."""
        return listing.merge_capabilities(
            [link.capabilities for link in self.links.values() if link.capabilities is not None]
        )

    # -- probes ----------------------------------------------------------------------------------

    async def probe(self, backend: BackendId, session_id: SessionId) -> acp.StatusAnswer:
        link = self.links[backend]
        started = time.perf_counter()
        try:
            response = await link.call(
                acp.SESSION_STATUS,
                {"sessionId": session_id},
                timeout=self.settings.probe.timeout_ms / 1000,
            )
            answer = acp.read_status(response, session_id, self.aliases)
        except (TimeoutError, BackendLinkLost):
            answer = acp.StatusAnswer(ProbeResult.UNKNOWN)
        self.metrics.probe_duration.labels(backend).observe(time.perf_counter() - started)
        self.metrics.probes.labels(backend, answer.result.value).inc()
        return answer

    async def probe_answers(
        self, backends: Iterable[BackendId], session_id: SessionId
    ) -> dict[BackendId, acp.StatusAnswer]:
        """Ask each of ``backends`` that can be asked, concurrently."""
        targets = [b for b in backends if self.links[b].supports("status")]
        answers = await asyncio.gather(*(self.probe(b, session_id) for b in targets))
        return dict(zip(targets, answers, strict=True))

    async def probe_many(
        self, backends: Iterable[BackendId], session_id: SessionId
    ) -> dict[BackendId, ProbeResult]:
        answers = await self.probe_answers(backends, session_id)
        return {backend: answer.result for backend, answer in answers.items()}

    # -- locate ------------------------------------------------------------------------------------

    async def locate(self, session_id: SessionId, tried: tuple[BackendId, ...] = ()) -> Located:
        """Where ``session_id`` should be resumed, skipping the backends in ``tried`` that
        already answered ``-32002`` to this resume. Concurrent calls share one locate."""
        key = (session_id, tried)
        task = self._inflight.get(key)
        if task is None:
            task = asyncio.create_task(self._locate(session_id, tried), name="locate")
            self._inflight[key] = task
            task.add_done_callback(lambda done: self._locate_done(key, done))
        # shield: a caller that goes away must not cancel the locate others wait on
        return await asyncio.shield(task)

    def _locate_done(self, key: _LocateKey, task: asyncio.Task[Located]) -> None:
        if self._inflight.get(key) is task:
            del self._inflight[key]
        if not task.cancelled():
            task.exception()  # retrieved: every waiter may have gone away

    async def _locate(self, session_id: SessionId, tried: tuple[BackendId, ...]) -> Located:
        # one locate serves every connection waiting on it: it is about the session only
        log_context.connection.set(None)
        log_context.session.set(session_id)
        started = time.perf_counter()
        outcome = "error"
        try:
            async with self._locate_slots:
                located = await self._probe_and_decide(session_id, tried)
            outcome = located.outcome.value
            return located
        except LocateInconclusive:
            outcome = "unknown_failed"
            raise
        except NoBackendAvailable:
            outcome = "no_backend"
            raise
        except SessionNotFound:
            outcome = "not_found"
            raise
        finally:
            self.metrics.locates.labels(outcome).inc()
            self.metrics.locate_duration.labels(outcome).observe(time.perf_counter() - started)

    async def _probe_and_decide(
        self, session_id: SessionId, tried: tuple[BackendId, ...]
    ) -> Located:
        answers = self.attached_here(session_id)
        hint = self.cache.hint(session_id)
        probeable = hint is not None and self.links[hint.backend].supports("status")
        if hint is not None and probeable and self.health(hint.backend) is Health.UP:
            answers |= await self.probe_many([hint.backend], session_id)
            if answers.get(hint.backend) is ProbeResult.ACTIVE:
                if hint.confirmed(self._clock(), self._verify_after):
                    self.metrics.locate_cache.labels("hit").inc()
                    self.metrics.fanout.observe(1)
                    self._remember(session_id, hint.backend, hint.checked)
                    return Located(hint.backend, Outcome.ACTIVE)
                # trusted for a while only: ask the rest too, so a second active is seen
                self.metrics.locate_cache.labels("verify").inc()
            else:
                self.metrics.locate_cache.labels("stale").inc()
        else:
            self.metrics.locate_cache.labels("miss").inc()
        order = self.order(session_id)  # ranked only when the pool is asked
        answers |= await self.probe_many([b for b in order if b not in answers], session_id)
        self.metrics.fanout.observe(len(answers))
        located = decide(
            order,
            answers,
            self.settings.router.policy,
            session_id=session_id,
            unreachable=self.unreachable(self.ranking.rank(session_id)),
            remembered=None if hint is None else hint.backend,
            tried=tried,
        )
        if located.split_brain:
            self.metrics.split_brain.inc()
            logger.warning(
                "split brain: session %s is active on %s; routing to %s",
                session_id,
                ", ".join(located.split_brain),
                located.backend,
            )
        checked = self._clock() if located.outcome is Outcome.ACTIVE else None
        self._remember(session_id, located.backend, checked)
        return located

    def forget(self, session_id: SessionId) -> None:
        self.cache.invalidate(session_id)

    # -- pool-wide requests ------------------------------------------------------------------------

    async def status(self, session_id: SessionId) -> dict[str, Any]:
        """The pool's ``session/status`` result: attached here counts as ``active`` (a
        backend without ``session/status`` cannot say so itself), a backend that is down
        but not gone as unknown. Where it is attached, only those backends are asked (for
        the v2 foreground ``state`` they report); otherwise every ready one is."""
        attached = self.attached_here(session_id)
        if not attached and not self.ready():
            raise NoBackendAvailable(None, {"sessionId": session_id})
        probed = await self.probe_answers(attached or self.ready(), session_id)
        answers = {backend: answer.result for backend, answer in probed.items()}
        if attached:
            answers |= attached
        else:
            answers |= dict.fromkeys(self.unreachable(), ProbeResult.UNKNOWN)
        states = {b: a.state for b, a in probed.items() if a.state is not None}
        return pool_status(answers, session_id=session_id, states=states)

    async def list_sessions(self, params: Any) -> dict[str, Any]:
        """``session/list`` over every backend that lists, merged behind one cursor."""
        page = listing.ListPage.from_params(params, self.ready())
        targets = [b for b in page.pending if b in self.links and self.links[b].supports("list")]
        answers = await asyncio.gather(
            *(self._list_one(b, page.backend_params(b)) for b in targets), return_exceptions=True
        )
        results: dict[BackendId, Any] = {}
        for backend, answer in zip(targets, answers, strict=True):
            if isinstance(answer, BaseException):
                if not isinstance(answer, Exception):
                    raise answer
                raise JsonRpcError(
                    f"session/list failed on backend {backend}: {answer}"
                ) from answer
            results[backend] = answer
        merged = page.merge(results)
        unlisted = [
            b for b in self.links if b not in self.ready() or not self.links[b].supports("list")
        ]
        if unlisted:  # their sessions are missing from the page: say whose
            merged["_meta"] = {"unlistedBackends": unlisted}
        return merged

    async def _list_one(self, backend: BackendId, params: dict[str, Any]) -> Any:
        response = await self.links[backend].call(
            acp.SESSION_LIST, params, timeout=max(self.settings.probe.timeout_ms / 1000, 5.0)
        )
        if response.error is not None:
            raise JsonRpcError(response.error.message)
        return response.result
