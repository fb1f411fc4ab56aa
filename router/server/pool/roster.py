"""Who is in the pool: the configured backends, those each discovery source found, and the
address of backends that left while client links still use them (docs/architecture.md,
"Every rule and its file")."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from router.core.fleet import Fleet
from router.core.membership import Member
from router.protocol.ids import BackendId
from router.server.config import BackendSection

logger = logging.getLogger(__name__)

#: backends removed from the pool whose address is kept for client links still using
#: them; beyond this many, the oldest are forgotten
MAX_RETIRED = 1024


def member_of(spec: BackendSection) -> Member:
    """A backend as :mod:`router.core.membership` compares it."""
    return Member(
        BackendId(spec.id), spec.weight, (spec.url, spec.tls_ca, spec.tls_cert, spec.tls_key)
    )


class Roster:
    """The backends' tables by where they come from (configuration, each DNS source), and
    the tables of those that left, kept while a client link may still dial them."""

    def __init__(self, static: Sequence[BackendSection]) -> None:
        self.static: tuple[BackendSection, ...] = tuple(static)
        self._discovered: dict[str, tuple[BackendSection, ...]] = {}
        #: the address of backends that left, for client links still open to them
        self.retired: dict[BackendId, BackendSection] = {}

    def members(self) -> list[BackendSection]:
        """The configured backends, then each source's, the first of an id winning."""
        members: dict[str, BackendSection] = {}
        found = (spec for specs in self._discovered.values() for spec in specs)
        for spec in (*self.static, *found):
            members.setdefault(spec.id, spec)
        return list(members.values())

    def discover(
        self, source: str, found: Sequence[BackendSection], fleet: Fleet, now: float
    ) -> list[BackendSection]:
        """Take what DNS says ``source`` holds now, and return the members. A backend found
        before and missing now is *leaving* (``fleet.leaving``): it stays a member, with no
        new placements, until it is gone (:mod:`router.core.health`)."""
        present = {BackendId(spec.id) for spec in found}
        missing = [s for s in self._discovered.get(source, ()) if BackendId(s.id) not in present]
        leaving = fleet.left_dns(present, (BackendId(s.id) for s in missing), now)
        for backend in leaving.gone:
            logger.info("backend %s left DNS and is gone: out of the pool", backend)
        for backend in leaving.newly:
            logger.info(
                "backend %s left DNS: no new sessions; it stays in the pool until it is gone",
                backend,
            )
        kept = [s for s in missing if BackendId(s.id) in leaving.kept]
        self._discovered[source] = (*found, *kept)
        return self.members()

    def drop(self, backend: BackendId) -> list[BackendSection]:
        """A leaving backend is gone: no source holds it any more. Returns the members."""
        for source, found in self._discovered.items():
            self._discovered[source] = tuple(s for s in found if s.id != backend)
        return self.members()

    def retire(self, backend: BackendId, spec: BackendSection) -> None:
        """Keep the table of a backend that left while client links still use it; the
        oldest go beyond :data:`MAX_RETIRED`."""
        self.retired[backend] = spec
        while len(self.retired) > MAX_RETIRED:
            del self.retired[next(iter(self.retired))]

    def forget_retired(self, backend: BackendId) -> None:
        """The table kept of ``backend`` is needed no more: it is a member again, or the
        last client link to it has ended."""
        self.retired.pop(backend, None)
