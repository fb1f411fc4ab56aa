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
from collections.abc import AsyncIterator, Iterable, Sequence
from typing import Any

import aiohttp

from router.core import latency, listing, membership
from router.core.health import BackendState, CameUp, Event, Health, transition
from router.core.locate import AdminState, Located, LocationCache, Outcome, decide, pool_status
from router.core.membership import Member, MembershipChange
from router.core.placement import Node, Ranking, Spread
from router.core.routes import Attach, Change
from router.protocol import acp
from router.protocol.acp import ProbeResult
from router.protocol.errors import (
    JsonRpcError,
    LocateInconclusive,
    NoBackendAvailable,
    SessionNotFound,
)
from router.protocol.ids import BackendId, SessionId
from router.server import fanout, log_context
from router.server.config import BackendSection, Settings
from router.server.control import ControlLink
from router.server.metrics import Metrics
from router.server.tls import backend_context

logger = logging.getLogger(__name__)

#: cap on locates running at once; more wait their turn instead of storming the pool
MAX_CONCURRENT_LOCATES = 256

#: a locate is shared by the resumes of one session that have tried the same backends
_LocateKey = tuple[SessionId, tuple[BackendId, ...]]


#: backends removed from the pool whose address is kept for client links still using
#: them; beyond this many, the oldest are forgotten
MAX_RETIRED = 1024


def member_of(spec: BackendSection) -> Member:
    """A backend as :mod:`router.core.membership` compares it."""
    return Member(
        BackendId(spec.id), spec.weight, (spec.url, spec.tls_ca, spec.tls_cert, spec.tls_key)
    )


class Pool:
    """The backends and what the router knows of them.

    Membership changes at run time (:meth:`set_static` on a reload, :meth:`set_discovered`
    from DNS). A backend that leaves stops getting placements, probes and locates at
    once, but the client connections that hold links to it keep them (and their
    sessions) until they end: its address stays known (:meth:`url`) for as long as
    anything may still use it.
    """

    def __init__(self, settings: Settings, metrics: Metrics, http: aiohttp.ClientSession) -> None:
        self.settings = settings
        self.aliases = settings.probe.aliases
        self.metrics = metrics
        self._http = http
        self._clock = time.monotonic
        self._grace = settings.control.down_grace_ms / 1000
        self._verify_after = settings.cache.verify_seconds
        self.links: dict[BackendId, ControlLink] = {}
        self.ranking = Ranking(())
        self.cache = LocationCache(
            settings.cache.max_entries,
            settings.cache.ttl_seconds,
            self._clock,
            remember=settings.cache.remember_seconds,
        )
        self.states: dict[BackendId, BackendState] = {}
        self.attached: dict[BackendId, int] = {}
        # a random salt: replicas break their ties differently
        self.spread = Spread(settings.placement.decay_seconds, salt=uuid.uuid4().hex)
        #: session -> backend -> how many connections of this router have it attached there
        self.attachments: dict[SessionId, dict[BackendId, int]] = {}
        #: backend -> how many client connections of this router hold a link to it
        self.pinned: dict[BackendId, int] = {}
        self._inflight: dict[_LocateKey, asyncio.Task[Located]] = {}
        self._locate_slots = asyncio.Semaphore(MAX_CONCURRENT_LOCATES)
        self.ready_changed = asyncio.Event()
        #: pulsed whenever ``attached`` changes
        self.attached_changed = asyncio.Event()
        #: pulsed whenever ``pinned`` changes
        self.pinned_changed = asyncio.Event()
        #: the configured backends, and those each discovery source found
        self._static: tuple[BackendSection, ...] = tuple(settings.backends)
        self._discovered: dict[str, tuple[BackendSection, ...]] = {}
        #: found by discovery once, no longer in DNS, not yet gone: no new placements
        self.leaving: set[BackendId] = set()
        #: backends an operator drained or put in maintenance (absent: ready)
        self.admin: dict[BackendId, AdminState] = {}
        #: how long each backend's last probe took
        self.probe_seconds: dict[BackendId, float] = {}
        #: their moving average (:mod:`router.core.latency`)
        self.probe_average: dict[BackendId, float] = {}
        #: the address of backends that left, for client links still open to them
        self._retired: dict[BackendId, BackendSection] = {}
        self._controls: dict[BackendId, asyncio.Task[None]] = {}
        self._group: asyncio.TaskGroup | None = None
        metrics.watch_cache(self.cache.__len__)
        self._apply(self._static)

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[Pool]:
        """Run every control link (those of backends that join later too) for the
        duration of the context."""
        async with asyncio.TaskGroup() as group:
            self._group = group
            for link in self.links.values():
                self._start(link)
            try:
                yield self
            finally:
                self._group = None
                for control in self._controls.values():
                    control.cancel()
                for locate in self._inflight.values():
                    locate.cancel()

    def _start(self, link: ControlLink) -> None:
        if self._group is not None:
            task = self._group.create_task(link.run(), name=f"control-{link.id}")
            self._controls[link.id] = task

    # -- membership changes ----------------------------------------------------------------------

    def set_static(self, settings: Settings) -> MembershipChange:
        """Take a reloaded configuration: its backends (with the discovered ones), its
        probe settings and its unknown policy (the caller has kept what needs a restart)."""
        self.settings = settings
        self.aliases = settings.probe.aliases
        self._static = tuple(settings.backends)
        return self._apply(self._members())

    def set_discovered(self, source: str, found: Sequence[BackendSection]) -> MembershipChange:
        """What DNS says ``source`` holds now. A backend found before and missing now
        is *leaving*: no new placements, but it is still probed and resumed on while it
        may hold sessions, and leaves the pool only once it is gone
        (:mod:`router.core.health`: refused, past the grace, or restarted)."""
        now = {BackendId(spec.id) for spec in found}
        kept = [
            spec
            for spec in self._discovered.get(source, ())
            if BackendId(spec.id) not in now and self.health(BackendId(spec.id)) is not Health.GONE
        ]
        leaving = {BackendId(spec.id) for spec in kept}
        for backend in sorted(leaving - self.leaving):
            logger.info(
                "backend %s left DNS: no new sessions; it stays in the pool until it is gone",
                backend,
            )
        self.leaving = (self.leaving - now) | leaving
        self._discovered[source] = (*found, *kept)
        return self._apply(self._members())

    def _members(self) -> list[BackendSection]:
        """The configured backends, then each source's, the first of an id winning."""
        members: dict[str, BackendSection] = {}
        for spec in (*self._static, *(s for found in self._discovered.values() for s in found)):
            members.setdefault(spec.id, spec)
        return list(members.values())

    def _apply(self, specs: Sequence[BackendSection]) -> MembershipChange:
        change = membership.diff(
            (member_of(link.spec) for link in self.links.values()), map(member_of, specs)
        )
        by_id = {BackendId(spec.id): spec for spec in specs}
        for backend in (*change.removed, *(m.id for m in change.replaced)):
            self._remove(backend)
        for member in (*change.replaced, *change.added):
            self._add(by_id[member.id])
        for member in change.reweighted:
            self.links[member.id].spec = by_id[member.id]
            self.metrics.backend_weight.labels(member.id).set(member.weight)
        # configuration order: placement breaks no tie by it, but listings follow it
        self.links = {backend: self.links[backend] for backend in by_id}
        self.ranking = Ranking(Node(backend, spec.weight) for backend, spec in by_id.items())
        if not change.empty:
            self.ready_changed.set()
            self.ready_changed.clear()
        return change

    def _add(self, spec: BackendSection) -> None:
        backend = BackendId(spec.id)
        link = ControlLink(
            spec,
            self.settings.control,
            self._http,
            self._link_event,
            self.metrics,
            max_message_bytes=self.settings.router.max_message_bytes,
            connect_timeout=self.settings.router.connect_timeout_ms / 1000,
        )
        self.links[backend] = link
        self._retired.pop(backend, None)
        self.states[backend] = BackendState.starting(self._clock())
        self.attached.setdefault(backend, 0)
        self.metrics.declare_backends([backend])
        self.metrics.attached_sessions.labels(backend).set(self.attached[backend])
        self.metrics.backend_weight.labels(backend).set(spec.weight)
        self.metrics.watch_health([backend], self.health)
        self._start(link)

    def _remove(self, backend: BackendId) -> None:
        link = self.links.pop(backend)
        control = self._controls.pop(backend, None)
        if control is not None:
            control.cancel()
        del self.states[backend]
        self.leaving.discard(backend)
        self.admin.pop(backend, None)
        self.probe_seconds.pop(backend, None)
        self.probe_average.pop(backend, None)
        self.cache.forget_backend(backend)
        self._retired[backend] = link.spec
        while len(self._retired) > MAX_RETIRED:
            del self._retired[next(iter(self._retired))]
        attached = self.attached.get(backend, 0) > 0
        if not attached:
            self.attached.pop(backend, None)
        self.metrics.forget_backend(backend, attached=attached)

    def _link_event(self, link: ControlLink, event: Event) -> None:
        """A control link reported up, down or refused: move the backend's state."""
        backend = link.id
        if self.links.get(backend) is not link:
            return  # a link the pool has let go of
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
        if backend in self.leaving and step.state.health is Health.GONE:
            logger.info("backend %s left DNS and is gone: out of the pool", backend)
            self._drop_leaving(backend)
        self.ready_changed.set()
        self.ready_changed.clear()

    def _drop_leaving(self, backend: BackendId) -> None:
        for source, found in self._discovered.items():
            self._discovered[source] = tuple(s for s in found if s.id != backend)
        self._apply(self._members())

    # -- membership ------------------------------------------------------------------------------

    def health(self, backend: BackendId) -> Health:
        """Up, unknown (down, but may still run sessions) or gone, as of now."""
        state = self.states.get(backend)
        return Health.GONE if state is None else state.at(self._clock(), self._grace)

    def ready(self) -> list[BackendId]:
        """Backends that are up: probed, and new sessions may go there."""
        return [b for b in self.links if self.health(b) is Health.UP]

    def unreachable(self, backends: Iterable[BackendId] | None = None) -> list[BackendId]:
        """Backends that are down but not gone (:mod:`router.core.health`), in the given order."""
        ordered = self.links if backends is None else backends
        return [b for b in ordered if self.health(b) is Health.UNKNOWN]

    def _ranked(self, session_id: SessionId) -> tuple[list[BackendId], list[BackendId]]:
        """The backends that are up and those down but not gone, each in the session's
        rendezvous order: one ranking, one health reading per backend."""
        now = self._clock()
        up: list[BackendId] = []
        unreachable: list[BackendId] = []
        for backend in self.ranking.rank(session_id):
            state = self.states.get(backend)
            health = Health.GONE if state is None else state.at(now, self._grace)
            if health is Health.UP:
                up.append(backend)
            elif health is Health.UNKNOWN:
                unreachable.append(backend)
        return up, unreachable

    def order(self, session_id: SessionId) -> list[BackendId]:
        """Backends that are up, in the session's rendezvous order."""
        return [b for b in self.ranking.rank(session_id) if self.health(b) is Health.UP]

    def only_backend(self) -> BackendId | None:
        """The pool's one backend, when it has one and it is up and open to sessions."""
        if len(self.links) != 1:
            return None
        return self._open_to_sessions(next(iter(self.links)))

    def _open_to_sessions(self, backend: BackendId) -> BackendId | None:
        if self.health(backend) is not Health.UP or self.admin.get(backend) is AdminState.MAINT:
            return None
        return backend

    def likely(self, session_id: SessionId) -> BackendId | None:
        """Where a resume of ``session_id`` will most likely go, known without asking
        anyone: a backend it is attached to here, else the hinted one, else the pool's
        only backend; None when there is no such guess or it is not up and open to the
        session (in maintenance)."""
        where = self.attachments.get(session_id)
        hint = self.cache.hint(session_id)
        if where:
            backend = next(iter(where))
        elif hint is not None:
            backend = hint.backend
        else:
            return self.only_backend()
        return self._open_to_sessions(backend)

    def _can_ask(self, backend: BackendId, capability: str) -> bool:
        """Whether ``backend`` is in the pool and advertises ``capability``."""
        link = self.links.get(backend)
        return link is not None and link.supports(capability)

    def spec(self, backend: BackendId) -> BackendSection:
        """The backend's table: a member's, or one that left the pool (client links to
        it stay open until their connections end)."""
        link = self.links.get(backend)
        return link.spec if link is not None else self._retired[backend]

    def url(self, backend: BackendId) -> str:
        return self.spec(backend).url

    def tls(self, backend: BackendId) -> ssl.SSLContext | None:
        return backend_context(self.spec(backend))

    def place_new(self) -> BackendId:
        """A backend for a new session (:meth:`router.core.placement.Spread.place`)."""
        draining = self.draining()
        candidates = [
            node
            for node in self.ranking.nodes
            if self.links[node.id].up and node.id not in draining
        ]
        backend = self.spread.place(candidates, self.attached, time.monotonic())
        if backend is None:
            raise NoBackendAvailable()
        return backend

    # -- what an operator set (the admin API) ---------------------------------------------------

    def admin_state(self, backend: BackendId) -> AdminState:
        return self.admin.get(backend, AdminState.READY)

    def set_admin_state(self, backend: BackendId, state: AdminState) -> None:
        """Drain a backend, put it in maintenance or make it ready again.

        Raises:
            KeyError: ``backend`` is not in the pool.
        """
        if backend not in self.links:
            raise KeyError(backend)
        if state is AdminState.READY:
            self.admin.pop(backend, None)
        else:
            self.admin[backend] = state
        logger.warning("backend %s set to %s by an operator", backend, state.value)
        for each in AdminState:
            self.metrics.backend_admin_state.labels(backend, each.value).set(each is state)

    def draining(self) -> set[BackendId]:
        """Backends that take no new sessions but keep those located there: drained by
        an operator, in maintenance, or gone from DNS (:meth:`set_discovered`)."""
        return self.leaving | self.admin.keys()

    def in_maintenance(self) -> set[BackendId]:
        return {b for b, state in self.admin.items() if state is AdminState.MAINT}

    def pin(self, backend: BackendId, delta: int) -> None:
        """A client connection opened (+1) or ended (-1) its link to ``backend``."""
        count = self.pinned[backend] = self.pinned.get(backend, 0) + delta
        if count <= 0:
            del self.pinned[backend]
        self.pinned_changed.set()
        self.pinned_changed.clear()

    def record(self, changes: Iterable[Change]) -> None:
        """Count sessions attached to or detached from backends on some connection."""
        for change in changes:
            delta = 1 if isinstance(change, Attach) else -1
            count = self.attached[change.backend] = self.attached.get(change.backend, 0) + delta
            if count <= 0 and change.backend not in self.links:
                # it left the pool, and now its last session here has ended
                del self.attached[change.backend]
                self.metrics.attached_sessions.remove(change.backend)
            else:
                self.metrics.attached_sessions.labels(change.backend).set(count)
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
        link = self.links.get(backend)
        if link is None:
            return  # it left the pool while the answer was on its way
        lasting = not link.supports("status")
        self.cache.put(session_id, backend, checked=checked, lasting=lasting)

    def capabilities(self) -> dict[str, Any]:
        """What the router advertises: the pool's common ground, plus what it answers itself."""
        return listing.merge_capabilities(
            [link.capabilities for link in self.links.values() if link.capabilities is not None]
        )

    # -- probes ----------------------------------------------------------------------------------

    async def probe(self, backend: BackendId, session_id: SessionId) -> acp.StatusAnswer:
        """Ask one backend (it must be in the pool)."""
        answers = await self.probe_answers([backend], session_id)
        return answers.get(backend, acp.StatusAnswer(ProbeResult.UNKNOWN))

    async def probe_answers(
        self, backends: Iterable[BackendId], session_id: SessionId
    ) -> dict[BackendId, acp.StatusAnswer]:
        """Ask each of ``backends`` that can be asked, in one round
        (:mod:`router.server.fanout`; not one that has left the pool: its client links
        may still hold sessions there, but it is not probed)."""
        targets = [b for b in backends if self._can_ask(b, "status")]
        if not targets:
            return {}
        round_ = await fanout.probe(
            self.links,
            targets,
            session_id,
            aliases=self.aliases,
            metrics=self.metrics,
            timeout=self.settings.probe.timeout_ms / 1000,
        )
        for backend, seconds in round_.elapsed.items():
            if backend in self.links:  # not one removed while the round ran
                self.probe_seconds[backend] = seconds
                self.probe_average[backend] = latency.smoothed(
                    self.probe_average.get(backend), seconds
                )
        return round_.answers

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
        probeable = hint is not None and self._can_ask(hint.backend, "status")
        maintenance = self.in_maintenance()
        if (
            hint is not None
            and probeable
            and self.health(hint.backend) is Health.UP
            and hint.backend not in maintenance
        ):
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
        order, unreachable = self._ranked(session_id)  # ranked only when the pool is asked
        answers |= await self.probe_many([b for b in order if b not in answers], session_id)
        self.metrics.fanout.observe(len(answers))
        located = decide(
            order,
            answers,
            self.settings.router.policy,
            session_id=session_id,
            unreachable=unreachable,
            remembered=None if hint is None else hint.backend,
            tried=tried,
            draining=self.draining() - maintenance,
            maintenance=maintenance,
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
        targets = [b for b in page.pending if self._can_ask(b, "list")]
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
