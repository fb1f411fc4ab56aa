"""How often a control link tries to reach its backend again, sans-I/O.

A backend is given up once no link of any kind has reached it for the grace
(``control.down_grace_ms``, :mod:`router.core.health`). That is evidence that its process
is gone only if the link kept trying throughout the grace: an exponential backoff that
had grown to ``control.reconnect_max_ms`` could miss every moment a flapping backend is
reachable (a proxy that refuses for a few seconds at a time, with short windows between),
and give up a backend no outage of which lasted the grace. So a link that is down never
pauses longer than ``min(reconnect_max_ms, down_grace_ms / TRIES_PER_GRACE)``, and one
that came up starts its backoff over.

The pause is capped so for the whole outage, not only the grace: the link cannot see
when the grace started (a client link alive after the control link dropped starts it
later, :attr:`router.core.health.BackendState.since`), and a backend given up is found
again sooner for it. The configuration keeps the two apart
(:data:`GRACE_IN_RECONNECTS`), so the cap never tightens the backoff more than about
threefold.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

#: the fewest attempts a link that is down makes within one grace
TRIES_PER_GRACE: Final = 10
#: the shortest grace the configuration accepts, in ``reconnect_max_ms``. A backend that
#: is back (a restart, a proxy that listens again) is reached within about one
#: ``reconnect_max_ms``; a grace of three gives up only a backend that stayed unreachable
#: through several of those, and keeps the grace's pace (``grace / TRIES_PER_GRACE``) at
#: no less than 0.3 x ``reconnect_max_ms``, so a backend that is down is not tried much
#: harder than the operator chose.
GRACE_IN_RECONNECTS: Final = 3


@dataclass(frozen=True, slots=True)
class Backoff:
    """The pauses between a link's attempts: from :attr:`first`, doubling after each
    failure, at most :attr:`longest`; in seconds."""

    first: float
    longest: float

    @classmethod
    def of(cls, initial: float, most: float, grace: float) -> Backoff:
        """The backoff of ``control.reconnect_initial_ms`` and ``reconnect_max_ms`` for a
        backend whose grace is ``grace`` (all in seconds)."""
        longest = min(most, grace / TRIES_PER_GRACE)
        return cls(min(initial, longest), longest)

    def after(self, pause: float, *, reached: bool) -> float:
        """The pause after an attempt that followed ``pause``: back to :attr:`first` when
        the attempt reached the backend (however briefly), else doubled."""
        return self.first if reached else min(pause * 2, self.longest)

    @staticmethod
    def jittered(pause: float, draw: float) -> float:
        """``pause`` scaled by ``draw`` (the shell's random number in [0, 1)), so links
        that lost the same backend do not come back in step; never longer than ``pause``."""
        return pause * draw
