"""Probe rounds over the pool's control links, and the watch that probes a silent backend
until it answers again. What a round says of a backend's health is the core's
(:func:`router.core.health.after_probe`); this module sends, waits and reports."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine, Iterable, Mapping
from typing import Any

from router.core import health, latency
from router.core.fleet import Fleet
from router.core.health import Event, ProbeSilent
from router.protocol import acp
from router.protocol.acp import ProbeResult
from router.protocol.ids import BackendId, SessionId, reserved_id
from router.server.links import fanout
from router.server.links.control import ControlLink
from router.server.observability.metrics import Metrics

logger = logging.getLogger(__name__)

#: the session id a liveness probe asks about: no agent has it (the router's own space)
LIVENESS = SessionId(reserved_id("liveness"))

Spawn = Callable[[Coroutine[Any, Any, None], str], "asyncio.Task[None] | None"]


class Prober:
    def __init__(
        self,
        fleet: Fleet,
        metrics: Metrics,
        on_event: Callable[[BackendId, Event], None],
        spawn: Spawn,
    ) -> None:
        self._fleet = fleet
        self._metrics = metrics
        self._on_event = on_event
        self._spawn = spawn
        #: the members' control links, in configuration order (the pool keeps it)
        self.links: dict[BackendId, ControlLink] = {}
        self.timeout = 0.5
        self.aliases: Mapping[str, ProbeResult] = {}
        #: how long each backend's last probe took, and their moving average
        self.seconds: dict[BackendId, float] = {}
        self.average: dict[BackendId, float] = {}
        #: silent backends being probed until they answer
        self.watches: dict[BackendId, asyncio.Task[None]] = {}

    def forget(self, backend: BackendId) -> None:
        self.seconds.pop(backend, None)
        self.average.pop(backend, None)

    async def answers(
        self, backends: Iterable[BackendId], session_id: SessionId
    ) -> dict[BackendId, acp.StatusAnswer]:
        """Ask each of ``backends`` that can be asked, in one round (:mod:`router.server.links.fanout`;
        not one that has left the pool: its client links may still hold sessions there,
        but it is not probed)."""
        targets = [b for b in backends if self._fleet.can_ask(b, "status")]
        if not targets:
            return {}
        round_ = await self.round(targets, session_id)
        for backend, seconds in round_.elapsed.items():
            if backend in self.links:  # not one removed while the round ran
                self.seconds[backend] = seconds
                self.average[backend] = latency.smoothed(self.average.get(backend), seconds)
        return round_.answers

    async def round(
        self, targets: list[BackendId], session_id: SessionId, *, reports: bool = True
    ) -> fanout.Fanout:
        """One probe round, and what it says of each backend's health (nothing, unless it
        ``reports``: :data:`router.core.listing.PAGE_PROBES_REPORT`)."""
        round_ = await fanout.probe(
            self.links,
            targets,
            session_id,
            aliases=self.aliases,
            metrics=self._metrics,
            timeout=self.timeout,
        )
        if reports:
            self._report(targets, round_)
        return round_

    def _report(self, targets: list[BackendId], round_: fanout.Fanout) -> None:
        heard, silent = set(round_.heard), set(round_.silent)
        for backend in targets:
            state = self._fleet.states.get(backend)
            if state is None:
                continue
            event = health.after_probe(
                state, answered=backend in heard, timed_out=backend in silent
            )
            if event is None:
                continue
            if isinstance(event, ProbeSilent):
                logger.warning("backend %s did not answer a probe in time: silent", backend)
                self._start_watch(backend)
            else:
                logger.info("backend %s answers again", backend)
            self._on_event(backend, event)

    def unanswered(self, backend: BackendId, what: str) -> None:
        """``backend`` left ``what`` (a request other than a probe: a client link's
        handshake) unanswered past its deadline: silent, as after a probe that timed out
        (:func:`router.core.health.after_unanswered`), until it answers again."""
        state = self._fleet.states.get(backend)
        event = health.after_unanswered(state) if state is not None else None
        if event is not None:
            logger.warning("backend %s left %s unanswered: silent", backend, what)
            self._start_watch(backend)
            self._on_event(backend, event)

    async def alive(self, backend: BackendId, *, reports: bool = True) -> bool:
        """Whether ``backend`` answers a probe (of an id nobody has) within the probe
        timeout: a frozen process does not; one that does not ``reports`` its silence
        only to the caller."""
        if not self._fleet.can_ask(backend, "status"):
            return True  # nothing to ask it with: only its link can tell
        round_ = await self.round([backend], LIVENESS, reports=reports)
        return backend in round_.heard

    def _start_watch(self, backend: BackendId) -> None:
        """Probe a silent backend until it answers (or leaves, or its link drops)."""
        if backend not in self.watches:
            task = self._spawn(self._watch(backend), f"silent-{backend}")
            if task is not None:
                self.watches[backend] = task
                task.add_done_callback(lambda _: self.watches.pop(backend, None))

    async def _watch(self, backend: BackendId) -> None:
        while (state := self._fleet.states.get(backend)) is not None and state.silent:
            link = self.links.get(backend)
            if link is None or not link.up or not self._fleet.can_ask(backend, "status"):
                return  # its link's own reconnects take over; or nothing to ask it with
            round_ = await self.round([backend], LIVENESS)  # up to the probe timeout
            if backend in round_.heard:
                return
            if backend not in round_.silent:  # its link took no probe (full, or closing):
                await asyncio.sleep(self.timeout)  # again at the pace of a probe timing out
