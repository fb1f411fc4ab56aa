"""The pool of backends as the router's I/O shell sees it: the control links, the probes
they carry, and the waits on a backend's health.

What the router knows and decides is in the core: the members, their health and what an
operator set (:class:`router.core.fleet.Fleet`, fed by the control links and by every
client link that opens or ends), and what this replica knows of sessions
(:class:`router.core.directory.Directory`). Membership changes at run time
(:meth:`Pool.set_static` on a reload, :meth:`Pool.set_discovered` from DNS); a backend
that leaves stops getting placements, probes and locates at once, but the client
connections that hold links to it keep them (and their sessions) until they end: its
address stays known (:meth:`Pool.url`) for as long as anything may still use it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from typing import Any

import aiohttp

from router.core import listing, membership
from router.core.directory import Bounds, Directory
from router.core.effects import Change
from router.core.fleet import Fleet
from router.core.health import (
    ClientLinkDown,
    ClientLinkUp,
    Event,
    Health,
    Instance,
)
from router.core.membership import MembershipChange
from router.core.placement import Node
from router.protocol import acp
from router.protocol.ids import BackendId, SessionId
from router.server.config import BackendSection, Settings
from router.server.links.control import ControlLink
from router.server.links.tls import backend_context
from router.server.observability.metrics import Metrics
from router.server.pool.probes import Prober
from router.server.pool.roster import Roster, member_of

logger = logging.getLogger(__name__)


def _no_fence(backend: BackendId) -> None:
    logger.warning("backend %s returned after it was given up, and nothing fences it", backend)


def _nobody_attached(session_id: SessionId, backends: frozenset[BackendId]) -> None:
    logger.warning(
        "the copies of session %s on %s are stale, and no connection is told",
        session_id,
        ", ".join(sorted(backends)),
    )


def bounds_of(settings: Settings) -> Bounds:
    """What the directory keeps, and for how long, as the config sets it."""
    cache = settings.cache
    return Bounds(
        cache.max_entries,
        cache.ttl_seconds,
        cache.remember_seconds,
        cache.negative_seconds,
        settings.placement.decay_seconds,
    )


class Pool:
    """The backends, their control links and what the router knows of them."""

    def __init__(self, settings: Settings, metrics: Metrics, http: aiohttp.ClientSession) -> None:
        self.metrics = metrics
        self._http = http
        self._clock = time.monotonic
        self.fleet = Fleet(settings.control.down_grace_ms / 1000)
        self.prober = Prober(self.fleet, metrics, self.hear, self.spawn)
        # a random salt: replicas break their placement ties differently
        self.directory = Directory(bounds_of(settings), self._clock, salt=uuid.uuid4().hex)
        metrics.watch_cache(self.directory.hints.__len__)
        #: pulsed whenever a backend's health or the membership changes
        self.ready_changed = asyncio.Event()
        #: the configured backends, those each discovery source found, those that left
        self.roster = Roster(settings.backends)
        self._controls: dict[BackendId, asyncio.Task[None]] = {}
        #: called when a backend given up comes back as the same process: it is fenced
        #: (:class:`router.server.pool.healing.Healer`)
        self.on_return: Callable[[BackendId], None] = _no_fence
        #: called when copies of a session attached through this router are found stale:
        #: the connections attached to them detach it (the application's open connections)
        self.on_stale: Callable[[SessionId, frozenset[BackendId]], None] = _nobody_attached
        self._group: asyncio.TaskGroup | None = None
        self._take(settings)
        self._apply(self.roster.members())

    def _take(self, settings: Settings) -> None:
        self.settings = settings
        self.prober.timeout = settings.probe.timeout_ms / 1000
        self.prober.aliases = settings.probe.aliases

    @property
    def links(self) -> dict[BackendId, ControlLink]:
        """The members' control links, in configuration order."""
        return self.prober.links

    def now(self) -> float:
        """The pool's clock (monotonic seconds)."""
        return self._clock()

    @staticmethod
    def wall_ms() -> int:
        """The wall clock, in milliseconds since the Unix epoch (what a resume's epoch
        is at least: :func:`router.core.split_brain.next_epoch`)."""
        return time.time_ns() // 1_000_000

    def detach_stale(self, session_id: SessionId, stale: Iterable[BackendId]) -> None:
        """Copies of ``session_id`` on ``stale`` are not its home: the connections of this
        router attached to one of them detach it (their clients resume it again)."""
        here = self.directory.attached_to(session_id).intersection(stale)
        if here:
            self.on_stale(session_id, frozenset(here))

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
                for control in (*self._controls.values(), *self.prober.watches.values()):
                    control.cancel()

    def spawn(self, work: Any, name: str) -> asyncio.Task[None] | None:
        """Run ``work`` in the pool's task group (None: the pool is not running)."""
        if self._group is None:
            work.close()
            return None
        task: asyncio.Task[None] = self._group.create_task(work, name=name)
        return task

    def _start(self, link: ControlLink) -> None:
        task = self.spawn(link.run(), f"control-{link.id}")
        if task is not None:
            self._controls[link.id] = task

    def _pulse(self, event: asyncio.Event) -> None:
        event.set()
        event.clear()

    # -- membership changes ----------------------------------------------------------------------

    def set_static(self, settings: Settings) -> MembershipChange:
        """Take a reloaded configuration: its backends (with the discovered ones), its
        probe settings and its unknown policy (the caller has kept what needs a restart)."""
        self._take(settings)
        self.roster.static = tuple(settings.backends)
        return self._apply(self.roster.members())

    def set_discovered(self, source: str, found: Sequence[BackendSection]) -> MembershipChange:
        """What DNS says ``source`` holds now. A backend found before and missing now
        is *leaving*: no new placements, but it is still probed and resumed on while it
        may hold sessions, and leaves the pool only once it is gone
        (:mod:`router.core.health`: past the grace with no link alive, or restarted)."""
        return self._apply(self.roster.discover(source, found, self.fleet, self._clock()))

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
        self.prober.links = {backend: self.links[backend] for backend in by_id}
        self.fleet.rank(Node(backend, spec.weight) for backend, spec in by_id.items())
        if not change.empty:
            self._pulse(self.ready_changed)
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
        self.roster.forget_retired(backend)
        self.fleet.join(backend, self._clock())
        self.metrics.declare_backends([backend])
        self.metrics.attached_sessions.labels(backend).set(self.directory.joined(backend))
        self.metrics.backend_weight.labels(backend).set(spec.weight)
        self.metrics.watch_health([backend], self.health)
        self._start(link)

    def _remove(self, backend: BackendId) -> None:
        link = self.links.pop(backend)
        control = self._controls.pop(backend, None)
        if control is not None:
            control.cancel()
        self.fleet.leave(backend)
        self.prober.forget(backend)
        if backend in self.directory.pinned:  # client links still use its address
            self.roster.retire(backend, link.spec)
        attached = self.directory.attached.get(backend, 0) > 0
        self.directory.forget_backend(backend, member=False)
        self.metrics.forget_backend(backend, attached=attached)

    # -- health ------------------------------------------------------------------------------------

    def _link_event(self, link: ControlLink, event: Event) -> None:
        """A control link reported up or down: move the backend's state."""
        if self.links.get(link.id) is link:  # not a link the pool has let go of
            self.hear(link.id, event)

    def client_link_up(self, backend: BackendId, initialize_result: Any) -> None:
        """A client connection's link to ``backend`` opened: the process is alive (and
        says which process it is)."""
        if backend in self.fleet:
            self.hear(backend, ClientLinkUp(Instance.of(initialize_result)))

    def client_link_down(self, backend: BackendId) -> None:
        """A client connection's link to ``backend`` that had opened has ended."""
        if backend in self.fleet:
            self.hear(backend, ClientLinkDown())

    def hear(self, backend: BackendId, event: Event) -> None:
        """What a link (or a fence) saw of ``backend``: its state moves, and what that
        means is logged, counted and acted on."""
        heard = self.fleet.hear(backend, event, self._clock())
        before, step = heard.before, heard.step
        if heard.up_changed:
            up = step.state.health is Health.UP
            self.metrics.backend_up.labels(backend).set(1 if up else 0)
            self.metrics.backend_state_changes.labels(backend, "up" if up else "down").inc()
        if step.restarted:
            logger.warning("backend %s came back as a new process", backend)
            self.metrics.backend_restarts.labels(backend).inc()
        if step.mismatch:
            self._mismatch(backend)
        if heard.now_gone and not before.seen:
            logger.info("backend %s has not been reached since the router started", backend)
        if heard.gave_up:
            logger.warning("backend %s is gone: its sessions are no longer in memory", backend)
            self.metrics.backend_state_changes.labels(backend, "gone").inc()
        self.directory.health_heard(backend, heard)
        if step.fence:
            self.on_return(backend)
        if self.fleet.leaves_now(backend, heard):
            logger.info("backend %s left DNS and is gone: out of the pool", backend)
            self._drop_leaving(backend)
        self._pulse(self.ready_changed)

    def _mismatch(self, backend: BackendId) -> None:
        """A client link reached another process than ``backend``'s control link
        (:attr:`router.core.health.Transition.mismatch`): say so, count it, and probe the
        control link again (a control link whose process is gone, or frozen, turns the
        backend unknown by itself)."""
        logger.warning(
            "backend %s: a client link reached another process than its control link; its"
            " URL (%s) must reach one process (a balancer or a rolling update behind it?)",
            backend,
            self.url(backend),
        )
        self.metrics.backend_instance_mismatches.labels(backend).inc()
        self.spawn(self._recheck(backend), f"recheck-{backend}")

    async def _recheck(self, backend: BackendId) -> None:
        if await self.prober.alive(backend):
            logger.info("backend %s: its control link's process answers: it stays up", backend)

    def _drop_leaving(self, backend: BackendId) -> None:
        self._apply(self.roster.drop(backend))

    def health(self, backend: BackendId) -> Health:
        """Up, unknown (not probed, but may still run sessions) or gone, as of now."""
        return self.fleet.health(backend, self._clock())

    def ready(self) -> list[BackendId]:
        """Backends that are up: probed, and new sessions may go there."""
        return self.fleet.ready(self._clock())

    def unreachable(self) -> list[BackendId]:
        """Backends that are not up but not gone (:mod:`router.core.health`)."""
        return self.fleet.unreachable(self._clock())

    def only_backend(self) -> BackendId | None:
        """The pool's one backend, when it has one and it is up and open to sessions."""
        return self.fleet.only_backend(self._clock())

    def can_probe(self, backend: BackendId) -> bool:
        return self.fleet.can_ask(backend, "status")

    def spec(self, backend: BackendId) -> BackendSection:
        """The backend's table: a member's, or one that left the pool (client links to
        it stay open until their connections end)."""
        link = self.links.get(backend)
        return link.spec if link is not None else self.roster.retired[backend]

    def url(self, backend: BackendId) -> str:
        return self.spec(backend).url

    def tls(self, backend: BackendId) -> ssl.SSLContext | None:
        return backend_context(self.spec(backend))

    # -- what client connections report ----------------------------------------------------------

    def record(self, changes: Iterable[Change]) -> None:
        """Sessions attached or detached on some connection (:meth:`Directory.record`)."""
        for backend, count in self.directory.record(changes).items():
            if count is None:
                self.metrics.attached_sessions.remove(backend)
            else:
                self.metrics.attached_sessions.labels(backend).set(count)

    def pin(self, backend: BackendId, delta: int) -> None:
        """A client connection opened (+1) or ended (-1) its link to ``backend``. When the
        last link to a backend that left the pool ends, what was kept of it goes: its
        address and every series still labelled with it."""
        self.directory.pin(backend, delta)
        if backend not in self.links and backend not in self.directory.pinned:
            self.roster.forget_retired(backend)
            self.metrics.forget_backend(
                backend, attached=bool(self.directory.attached.get(backend))
            )

    def capabilities(self) -> dict[str, Any]:
        """What the router advertises: the pool's common ground, plus what it answers itself."""
        return listing.merge_capabilities(self.fleet.advertised())

    # -- probes ----------------------------------------------------------------------------------

    async def probe_answers(
        self, backends: Iterable[BackendId], session_id: SessionId
    ) -> dict[BackendId, acp.StatusAnswer]:
        """Ask each of ``backends`` that can be asked, in one round
        (:meth:`~router.server.pool.probes.Prober.answers`), and keep what they said."""
        answers = await self.prober.answers(backends, session_id)
        self.directory.hear(session_id, answers)
        return answers

    def unanswered(self, backend: BackendId, what: str) -> None:
        """``backend`` left ``what`` unanswered past its deadline: silent
        (:meth:`~router.server.pool.probes.Prober.unanswered`)."""
        if backend in self.fleet:
            self.prober.unanswered(backend, what)

    async def alive(self, backend: BackendId, *, reports: bool = True) -> bool:
        """Whether ``backend`` answers a probe now (a frozen process does not); unless it
        ``reports``, a probe that goes unanswered moves nothing of its health."""
        return await self.prober.alive(backend, reports=reports)
