"""The router's own ``session/status``, sans-I/O: one session's status, from the pool.

Where the session is attached through this router, those backends are asked first (one
round trip, and the v2 foreground ``state`` they report); the rest of the pool only when
none of them says ``active``. The evidence is :func:`router.core.locate.evidence`'s: the
backends' own answers, and an attachment here where a backend cannot answer.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from router.core.health import Health
from router.core.locate import Ask, Snapshot, evidence
from router.protocol.acp import ProbeResult, StatusAnswer
from router.protocol.errors import LocateInconclusive, NoBackendAvailable, SessionNotFound
from router.protocol.ids import BackendId


class StatusRound:
    """The router's ``session/status`` answer for one session, from the pool.

    Where the session is attached through this router, those backends are asked first
    (one round trip, and the v2 foreground ``state`` they report); the rest of the pool
    only when none of them says ``active``. Then :func:`pool_status` rules over the
    evidence: the backends' own answers, and an attachment here where a backend cannot
    answer. A close (even one a backend answered ``-32002``) detaches, so a session
    closed through the router is no longer ``active`` here.
    """

    def __init__(self, snapshot: Snapshot) -> None:
        self.snapshot = snapshot
        self.answers: dict[BackendId, StatusAnswer] = {}
        self._asked_all = False

    def start(self) -> Ask | dict[str, Any]:
        attached = [c for c in self.snapshot.candidates if c.attached]
        if not attached:
            return self._ask_the_rest()
        first = tuple(c.id for c in attached if c.probeable)
        if not first:  # attached where nobody can say: the attachment is the evidence
            return self._ruled()
        return Ask(first)

    def hear(self, answers: Mapping[BackendId, StatusAnswer]) -> Ask | dict[str, Any]:
        self.answers.update(answers)
        if self._asked_all or any(a.result is ProbeResult.ACTIVE for a in answers.values()):
            return self._ruled()
        return self._ask_the_rest()

    def _ask_the_rest(self) -> Ask | dict[str, Any]:
        self._asked_all = True
        rest = tuple(
            c.id for c in self.snapshot.candidates if c.probeable and c.id not in self.answers
        )
        return Ask(rest) if rest else self._ruled()

    def _ruled(self) -> dict[str, Any]:
        pool = [c for c in self.snapshot.candidates if c.health is not Health.GONE]
        if not any(c.health is Health.UP or c.attached for c in pool):
            raise NoBackendAvailable(None, {"sessionId": self.snapshot.session_id})
        heard = {b: a.result for b, a in self.answers.items()}
        seen = {c.id: evidence(c, heard.get(c.id)) for c in pool}
        states = {b: a.state for b, a in self.answers.items() if a.state is not None}
        return pool_status(
            {b: r for b, r in seen.items() if r is not None},
            session_id=self.snapshot.session_id,
            states=states,
        )


def pool_status(
    answers: Mapping[BackendId, ProbeResult],
    *,
    session_id: str,
    states: Mapping[BackendId, Mapping[str, Any]] | None = None,
) -> dict[str, Any]:
    """The router's own ``session/status`` result from the pool's evidence.

    ``active`` if any backend has it in memory; ``inactive`` if any knows it; the
    RFD's ``-32002`` when every backend answered and none knows it. When none knows
    it but some did not answer, nobody can say it is unknown: retryable error.
    An active answer carries the v2 foreground ``state`` one of the backends that
    has it in memory reported (``states``), and none when none did: a state that was
    not reported is never made up.
    """
    values = set(answers.values())
    if ProbeResult.ACTIVE in values:
        reported = states or {}
        state = next(
            (reported[b] for b, r in answers.items() if r is ProbeResult.ACTIVE and b in reported),
            None,
        )
        return {"status": "active"} if state is None else {"status": "active", "state": state}
    if ProbeResult.INACTIVE in values:
        return {"status": "inactive"}
    if ProbeResult.UNKNOWN in values:
        unknown = sorted(b for b, r in answers.items() if r is ProbeResult.UNKNOWN)
        raise LocateInconclusive(None, {"sessionId": session_id, "backends": unknown})
    raise SessionNotFound(session_id)
