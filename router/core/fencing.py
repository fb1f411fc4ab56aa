"""Fencing one session on a backend back as the same process after it was given up,
sans-I/O: whom to ask, and in what order, for the evidence :func:`router.core.split_brain.fence`
rules on.

The returning backend is asked first; only where its copy is ``active`` is the rest of
the pool asked (a copy that is not in memory there is stale for nobody, and a fence of a
backend that held many sessions costs one probe each). The shell sends the probes
(:class:`~router.core.locate.Ask`) and hands back the answers; the round ends in a
:class:`Fencing`: the stale copies and the epoch each reported, for the directory's stale
marks.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from router.core.locate import Ask
from router.core.split_brain import StaleMarks, fence, mark
from router.protocol.acp import ProbeResult, StatusAnswer
from router.protocol.ids import BackendId


@dataclass(frozen=True, slots=True)
class Fencing:
    """What a fence of one session found: its stale copies (none: nothing to do), and
    the epoch each reported (:func:`router.core.split_brain.mark`)."""

    stale: tuple[BackendId, ...]
    marks: StaleMarks


class FenceRound:
    """The fence of one session on ``returning``: ask it, then, where its copy is
    active, ``others`` (the rest of the pool that is up); then the fencing rule.

    ``order``: the session's rendezvous order; ``attached``: the backends it is attached
    to through this router; ``hinted``: where this router last placed or found it."""

    def __init__(
        self,
        returning: BackendId,
        others: Sequence[BackendId],
        *,
        order: Sequence[BackendId],
        attached: Collection[BackendId] = (),
        hinted: BackendId | None = None,
    ) -> None:
        self.returning = returning
        self._others = tuple(b for b in others if b != returning)
        self._order = order
        self._attached = attached
        self._hinted = hinted
        self.answers: dict[BackendId, StatusAnswer] = {}
        self._asked_others = False

    def start(self) -> Ask:
        return Ask((self.returning,))

    def hear(self, answers: Mapping[BackendId, StatusAnswer]) -> Ask | Fencing:
        self.answers.update(answers)
        if not self._asked_others and self._others and self._returning_active():
            self._asked_others = True
            return Ask(self._others)
        stale = fence(
            self.returning,
            self.answers,
            order=self._order,
            attached=self._attached,
            hinted=self._hinted,
        )
        return Fencing(stale, mark(stale, self.answers))

    def _returning_active(self) -> bool:
        here = self.answers.get(self.returning)
        return here is not None and here.result is ProbeResult.ACTIVE
