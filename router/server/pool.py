"""The pool of backends as the router's I/O shell sees it: membership (configured and
discovered backends, what an operator set), health (:mod:`router.core.health`, fed by
the control links and by every client link that opens or ends), probes, the snapshot a
locate starts from, and the capabilities the router advertises.

What this replica knows of sessions is in :class:`~router.server.directory.Directory`
(``pool.directory``); locates run in :class:`~router.server.locator.Locator`
(``pool.locator``), and the pool-wide ``session/status`` and ``session/list`` in
:mod:`router.server.queries` (``pool.queries``). Decisions come from the sans-I/O core
(:mod:`router.core.locate`, :mod:`router.core.placement`, :mod:`router.core.listing`);
the shell only does the waiting.
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
from router.core.health import (
    BackendState,
    CameUp,
    ClientLinkDown,
    ClientLinkUp,
    Event,
    Health,
    Instance,
    ProbeHeard,
    ProbeSilent,
    transition,
)
from router.core.locate import AdminState, Candidate, Snapshot
from router.core.membership import Member, MembershipChange
from router.core.placement import Node, Ranking
from router.protocol import acp
from router.protocol.acp import ProbeResult
from router.protocol.errors import NoBackendAvailable
from router.protocol.ids import BackendId, SessionId
from router.server import fanout
from router.server.config import BackendSection, Settings
from router.server.control import ControlLink
from router.server.directory import Directory
from router.server.locator import Locator
from router.server.metrics import Metrics
from router.server.queries import Queries
from router.server.tls import backend_context

logger = logging.getLogger(__name__)

#: backends removed from the pool whose address is kept for client links still using
#: them; beyond this many, the oldest are forgotten
MAX_RETIRED = 1024

#: the session id a liveness probe asks about: no agent has it (the router's own space)
LIVENESS = SessionId("acp-router:liveness")


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
    anything may still use it, and a session attached to it here is still found there.
    """

    def __init__(self, settings: Settings, metrics: Metrics, http: aiohttp.ClientSession) -> None:
        self.settings = settings
        self.aliases = settings.probe.aliases
        self.metrics = metrics
        self._http = http
        self._clock = time.monotonic
        self._grace = settings.control.down_grace_ms / 1000
        self.links: dict[BackendId, ControlLink] = {}
        self.ranking = Ranking(())
        self.states: dict[BackendId, BackendState] = {}
        # a random salt: replicas break their placement ties differently
        self.directory = Directory(settings, metrics, self._clock, salt=uuid.uuid4().hex)
        self.locator = Locator(self)
        self.queries = Queries(self)
        self.ready_changed = asyncio.Event()
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
        #: silent backends being probed until they answer
        self._watches: dict[BackendId, asyncio.Task[None]] = {}
        self._group: asyncio.TaskGroup | None = None
        self._apply(self._static)

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[Pool]:
        """Run every control link (those of backends that join later too) for the
        duration of the context."""
        async with asyncio.TaskGroup() as group:
            self._group = group
            for link in self.links.values():
                self._start(link)
            audit = group.create_task(self.locator.audit.run(), name="audit")
            try:
                yield self
            finally:
                self._group = None
                for control in (*self._controls.values(), *self._watches.values()):
                    control.cancel()
                audit.cancel()
                self.locator.cancel()

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
        (:mod:`router.core.health`: past the grace with no link alive, or restarted)."""
        now = {BackendId(spec.id) for spec in found}
        missing = [s for s in self._discovered.get(source, ()) if BackendId(s.id) not in now]
        kept = [s for s in missing if self.health(BackendId(s.id)) is not Health.GONE]
        leaving = {BackendId(spec.id) for spec in kept}
        for spec in missing:
            if spec not in kept and BackendId(spec.id) in self.leaving:
                logger.info("backend %s left DNS and is gone: out of the pool", spec.id)
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
        self.metrics.declare_backends([backend])
        self.directory.joined(backend)
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
        if backend in self.directory.pinned:  # client links still use its address
            self._retired[backend] = link.spec
        while len(self._retired) > MAX_RETIRED:
            del self._retired[next(iter(self._retired))]
        attached = self.directory.attached.get(backend, 0) > 0
        self.directory.forget_backend(backend, member=False)
        self.metrics.forget_backend(backend, attached=attached)

    # -- health ------------------------------------------------------------------------------------

    def _link_event(self, link: ControlLink, event: Event) -> None:
        """A control link reported up or down: move the backend's state."""
        if self.links.get(link.id) is link:  # not a link the pool has let go of
            self._health_event(link.id, event)

    def client_link_up(self, backend: BackendId, initialize_result: Any) -> None:
        """A client connection's link to ``backend`` opened: the process is alive (and
        says which process it is)."""
        if backend in self.states:
            self._health_event(backend, ClientLinkUp(Instance.of(initialize_result)))

    def client_link_down(self, backend: BackendId) -> None:
        """A client connection's link to ``backend`` that had opened has ended."""
        if backend in self.states:
            self._health_event(backend, ClientLinkDown())

    def _health_event(self, backend: BackendId, event: Event) -> None:
        before = self.states[backend]
        step = transition(before, event, now=self._clock(), grace=self._grace)
        self.states[backend] = step.state
        if isinstance(event, CameUp) or before.health is Health.UP:
            up = step.state.health is Health.UP
            if up != (before.health is Health.UP):
                self.metrics.backend_up.labels(backend).set(1 if up else 0)
                self.metrics.backend_state_changes.labels(backend, "up" if up else "down").inc()
        if step.restarted:
            logger.warning("backend %s came back as a new process", backend)
            self.metrics.backend_restarts.labels(backend).inc()
        lapsed = step.state.health is Health.GONE and before.health is not Health.GONE
        if lapsed and not before.seen:
            logger.info("backend %s has not been reached since the router started", backend)
        if step.lost_memory:
            if step.state.health is Health.GONE:
                logger.warning("backend %s is gone: its sessions are no longer in memory", backend)
                self.metrics.backend_state_changes.labels(backend, "gone").inc()
            self.directory.forget_backend(backend, member=True)
        if backend in self.leaving and step.state.health is Health.GONE:
            logger.info("backend %s left DNS and is gone: out of the pool", backend)
            self._drop_leaving(backend)
        self.ready_changed.set()
        self.ready_changed.clear()

    def _drop_leaving(self, backend: BackendId) -> None:
        for source, found in self._discovered.items():
            self._discovered[source] = tuple(s for s in found if s.id != backend)
        self._apply(self._members())

    def health(self, backend: BackendId) -> Health:
        """Up, unknown (not probed, but may still run sessions) or gone, as of now."""
        state = self.states.get(backend)
        return Health.GONE if state is None else state.at(self._clock(), self._grace)

    async def known(self, backend: BackendId, timeout: float) -> Health:
        """``backend``'s health once it is up or gone (known to have kept, or lost, its
        memory), waiting up to ``timeout`` seconds; unknown if it is neither by then."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while (health := self.health(backend)) is Health.UNKNOWN:
            wait = deadline - loop.time()
            state = self.states.get(backend)
            if state is not None and not state.live_links:  # it lapses at since + grace
                wait = min(wait, state.since + self._grace - self._clock())
            if deadline - loop.time() <= 0:
                return health
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(wait, 0.0)):
                    await self.ready_changed.wait()
        return health

    async def settled(self, backend: BackendId, timeout: float) -> Health:
        """:meth:`known`, where up also means it answers a probe now: a backend whose
        client link just broke may still look up until its control link notices."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            health = await self.known(backend, deadline - loop.time())
            if health is not Health.UP or await self.alive(backend):
                return health
            if loop.time() >= deadline:
                return Health.UNKNOWN
            with contextlib.suppress(TimeoutError):  # until its state changes, or a while
                async with asyncio.timeout(self.settings.probe.timeout_ms / 1000):
                    await self.ready_changed.wait()

    def ready(self) -> list[BackendId]:
        """Backends that are up: probed, and new sessions may go there."""
        return [b for b in self.links if self.health(b) is Health.UP]

    def unreachable(self) -> list[BackendId]:
        """Backends that are not up but not gone (:mod:`router.core.health`)."""
        return [b for b in self.links if self.health(b) is Health.UNKNOWN]

    def order(self, session_id: SessionId) -> list[BackendId]:
        """Backends that are up, in the session's rendezvous order."""
        return [b for b in self.ranking.rank(session_id) if self.health(b) is Health.UP]

    # -- what a locate starts from -------------------------------------------------------------------

    def snapshot(self, session_id: SessionId, tried: tuple[BackendId, ...] = ()) -> Snapshot:
        """Every backend as a locate of ``session_id`` sees it, in its rendezvous order:
        one ranking, one health reading each. A backend that left the pool while the
        session is attached to it here comes last: it is still where the session runs."""
        now = self._clock()
        directory = self.directory
        attached = directory.attached_to(session_id)
        candidates = [self._candidate(b, now, b in attached) for b in self.ranking.rank(session_id)]
        candidates += [
            Candidate(b, Health.UNKNOWN, has_status=False, attached=True)
            for b in sorted(attached)
            if b not in self.links and b in self._retired
        ]
        refused = directory.absences.resumed(session_id)
        suspect = session_id in directory.suspects  # split brain lately: ask everyone
        return Snapshot(
            session_id,
            tuple(candidates),
            None if suspect else directory.hint(session_id),
            self.settings.router.policy,
            (*tried, *(b for b in sorted(refused) if b not in tried)),
            directory.absences.probed(session_id),
        )

    def _candidate(self, backend: BackendId, now: float, attached: bool) -> Candidate:
        state = self.states[backend]
        return Candidate(
            backend,
            state.at(now, self._grace),
            has_status=self._can_ask(backend, "status"),
            admin=self.admin.get(backend, AdminState.READY),
            leaving=backend in self.leaving,
            attached=attached,
        )

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
        attached = self.directory.attached_to(session_id)
        hint = self.directory.hint(session_id)
        if attached:
            backend = min(attached)
        elif hint is not None:
            backend = hint.backend
        else:
            return self.only_backend()
        return self._open_to_sessions(backend)

    def _can_ask(self, backend: BackendId, capability: str) -> bool:
        """Whether ``backend`` is in the pool and advertises ``capability``."""
        link = self.links.get(backend)
        return link is not None and link.supports(capability)

    def can_list(self, backend: BackendId) -> bool:
        return self._can_ask(backend, "list")

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
            if self.health(node.id) is Health.UP and node.id not in draining
        ]
        backend = self.directory.place(candidates)
        if backend is None:
            raise NoBackendAvailable()
        return backend

    def hint_from_id(self, session_id: SessionId, backend: BackendId) -> None:
        """A client named ``session_id`` by a hinted id whose home is ``backend``: where
        this replica has no hint of its own, that home is the first to ask."""
        if backend in self.links and self.directory.hint(session_id) is None:
            self.remember(session_id, backend, None)

    def pin(self, backend: BackendId, delta: int) -> None:
        """A client connection opened (+1) or ended (-1) its link to ``backend``. When the
        last link to a backend that left the pool ends, what was kept of it goes: its
        address and every series still labelled with it."""
        self.directory.pin(backend, delta)
        if backend not in self.links and backend not in self.directory.pinned:
            self._retired.pop(backend, None)
            self.metrics.forget_backend(
                backend, attached=bool(self.directory.attached.get(backend))
            )

    def learn(self, session_id: SessionId, backend: BackendId, *, created: bool) -> None:
        """A backend's answer shows ``session_id`` living there: remember it.

        A session it just ``created`` lives nowhere else (its id is new), which is as good
        as a fan-out that found it active only there.
        """
        self.directory.absences.forget(session_id)
        hint = self.directory.hint(session_id)
        checked = hint.checked if hint is not None and hint.backend == backend else None
        self.remember(session_id, backend, self._clock() if created else checked)
        # what the admin page shows until a probe says more
        self.directory.hear(session_id, {backend: acp.StatusAnswer(ProbeResult.ACTIVE)})

    def remember(self, session_id: SessionId, backend: BackendId, checked: float | None) -> None:
        """Keep a hint that ``session_id`` lives on ``backend`` (a member of the pool)."""
        link = self.links.get(backend)
        if link is None:
            return  # it left the pool while the answer was on its way
        lasting = not link.supports("status")
        self.directory.remember(session_id, backend, checked, lasting=lasting)

    def now(self) -> float:
        """The pool's clock (monotonic seconds)."""
        return self._clock()

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

    def capabilities(self) -> dict[str, Any]:
        """What the router advertises: the pool's common ground, plus what it answers itself."""
        return listing.merge_capabilities(
            [link.capabilities for link in self.links.values() if link.capabilities is not None]
        )

    # -- probes ----------------------------------------------------------------------------------

    async def probe_answers(
        self, backends: Iterable[BackendId], session_id: SessionId
    ) -> dict[BackendId, acp.StatusAnswer]:
        """Ask each of ``backends`` that can be asked, in one round
        (:mod:`router.server.fanout`; not one that has left the pool: its client links
        may still hold sessions there, but it is not probed)."""
        targets = [b for b in backends if self._can_ask(b, "status")]
        if not targets:
            return {}
        round_ = await self._round(targets, session_id)
        for backend, seconds in round_.elapsed.items():
            if backend in self.links:  # not one removed while the round ran
                self.probe_seconds[backend] = seconds
                self.probe_average[backend] = latency.smoothed(
                    self.probe_average.get(backend), seconds
                )
        self.directory.hear(session_id, round_.answers)
        return round_.answers

    async def _round(self, targets: list[BackendId], session_id: SessionId) -> fanout.Fanout:
        """One probe round; a backend that said nothing by the deadline is silent (a frozen
        process: no placements, no probes) until it answers again."""
        round_ = await fanout.probe(
            self.links,
            targets,
            session_id,
            aliases=self.aliases,
            metrics=self.metrics,
            timeout=self.settings.probe.timeout_ms / 1000,
        )
        for backend in round_.silent:
            if backend in self.states and not self.states[backend].silent:
                logger.warning("backend %s did not answer a probe in time: silent", backend)
                self._health_event(backend, ProbeSilent())
                self._start_watch(backend)
        for backend in round_.heard:
            if backend in self.states and self.states[backend].silent:
                logger.info("backend %s answers again", backend)
                self._health_event(backend, ProbeHeard())
        return round_

    async def alive(self, backend: BackendId) -> bool:
        """Whether ``backend`` answers a probe (of an id nobody has) within the probe
        timeout: a frozen process does not."""
        if not self._can_ask(backend, "status"):
            return True  # nothing to ask it with: only its link can tell
        round_ = await self._round([backend], LIVENESS)
        return backend in round_.heard

    def _start_watch(self, backend: BackendId) -> None:
        """Probe a silent backend until it answers (or leaves, or its link drops)."""
        if self._group is not None and backend not in self._watches:
            task = self._group.create_task(self._watch(backend), name=f"silent-{backend}")
            self._watches[backend] = task
            task.add_done_callback(lambda _: self._watches.pop(backend, None))

    async def _watch(self, backend: BackendId) -> None:
        pace = self.settings.probe.timeout_ms / 1000
        while (state := self.states.get(backend)) is not None and state.silent:
            link = self.links.get(backend)
            if link is None or not link.up:
                return  # its link's own reconnects take over
            if not self._can_ask(backend, "status"):
                return  # nothing to ask it with: only its link can tell
            round_ = await self._round([backend], LIVENESS)  # up to the probe timeout
            if backend in round_.heard:
                return
            if backend not in round_.silent:  # its link took no probe (full, or closing):
                await asyncio.sleep(pace)  # try again at the pace of a probe that timed out

    async def probe_many(
        self, backends: Iterable[BackendId], session_id: SessionId
    ) -> dict[BackendId, ProbeResult]:
        answers = await self.probe_answers(backends, session_id)
        return {backend: answer.result for backend, answer in answers.items()}
