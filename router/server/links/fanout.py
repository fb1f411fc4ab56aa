"""One ``session/status`` probe round over many control links.

The frame is encoded once (only the id differs between backends), each probe is one
append to its link's outbox and one callback registered for the answer, and the round
has one waiter and one deadline. Profiled at 1,000 backends before this existed, a
task, a future and an ``asyncio.timeout`` timer per probe were a third of the router's
time per probe; they cost nothing per probe here.

A probe not answered by the deadline, refused by its link (down, or too many requests
unanswered) or lost with its link counts as ``unknown``, as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import Mapping, Sequence

from router.protocol import acp
from router.protocol.acp import ProbeResult
from router.protocol.ids import BackendId, SessionId
from router.protocol.jsonrpc import RequestTemplate, Response
from router.server.links.control import ControlLink
from router.server.observability.metrics import Metrics

_UNKNOWN = acp.StatusAnswer(ProbeResult.UNKNOWN)


class Fanout:
    """The answers of one probe round, and the one future that is done when all are in."""

    def __init__(
        self,
        session_id: SessionId,
        aliases: Mapping[str, ProbeResult],
        metrics: Metrics,
        expected: int,
    ) -> None:
        self.session_id = session_id
        self._aliases = aliases
        self._metrics = metrics
        self._started = time.perf_counter()
        self._missing = expected
        self.answers: dict[BackendId, acp.StatusAnswer] = {}
        #: backends whose link took the probe and said nothing by the deadline
        self.silent: list[BackendId] = []
        #: backends that answered (whatever they said)
        self.heard: list[BackendId] = []
        #: how long each backend took to answer (or to be given up on)
        self.elapsed: dict[BackendId, float] = {}
        self.complete: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if expected == 0:
            self.complete.set_result(None)

    def answer(self, backend: BackendId, response: Response | None) -> None:
        """``backend``'s answer (None: its link went down or refused the probe)."""
        if backend in self.answers:
            return
        if response is None:
            answer = _UNKNOWN
        else:
            self.heard.append(backend)
            answer = acp.read_status(response, self.session_id, self._aliases)
        self._count(backend, answer)
        self._missing -= 1
        if self._missing == 0 and not self.complete.done():
            self.complete.set_result(None)

    def expire(self, backends: Sequence[BackendId], *, silent: bool) -> None:
        """The deadline passed (``silent``) or the round was cancelled: those that have not
        answered are unknown (and, past the deadline, silent)."""
        for backend in backends:
            if backend not in self.answers:
                if silent:
                    self.silent.append(backend)
                self._count(backend, _UNKNOWN)

    def _count(self, backend: BackendId, answer: acp.StatusAnswer) -> None:
        self.answers[backend] = answer
        elapsed = self.elapsed[backend] = time.perf_counter() - self._started
        self._metrics.probe_duration.labels(backend).observe(elapsed)
        self._metrics.probes.labels(backend, answer.result.value).inc()


async def probe(
    links: Mapping[BackendId, ControlLink],
    targets: Sequence[BackendId],
    session_id: SessionId,
    *,
    aliases: Mapping[str, ProbeResult],
    metrics: Metrics,
    timeout: float,
) -> Fanout:
    """Ask every backend in ``targets`` for ``session_id``'s status; one deadline for all.
    The round, with every target's answer and probe time."""
    fanout = Fanout(session_id, aliases, metrics, len(targets))
    encode = RequestTemplate.of(acp.SESSION_STATUS, {"sessionId": session_id}).encode
    sent: list[tuple[ControlLink, int]] = []
    for backend in targets:
        link = links[backend]
        request_id = link.send(encode, functools.partial(fanout.answer, backend))
        if request_id is None:
            fanout.answer(backend, None)
        else:
            sent.append((link, request_id))
    deadline = asyncio.timeout(timeout)
    try:
        with contextlib.suppress(TimeoutError):  # the silent ones count as unknown
            async with deadline:
                await fanout.complete
    finally:
        for link, request_id in sent:
            link.withdraw(request_id)
        fanout.expire(targets, silent=deadline.expired())
    return fanout
