"""Whether a backend may still hold sessions in memory, sans-I/O: up, unknown or gone.

Down is not gone, and refused is not gone (docs/routing.md, "Down is not gone"). A backend
whose control link is down may still run sessions: an L4 proxy, a Kubernetes Service
whose endpoint turned unready, or a restarting listener refuses new connections while
the process behind it goes on running turns. So it stays in the pool as *unknown*
(probed never, placed on never, a reason to fail a resume closed) until there is
positive evidence that its process lost its memory, and only two things are:

* it came back as another process (:meth:`Instance.same_process`), seen on the control
  link, or on a client link that opens to it while the control link is down;
* no link of any kind to it (the control link, or a client connection's link) has been
  alive for the grace (``control.down_grace_ms``).

Given up is final for what it held. A backend given up that is reached again as the same
process may still run the sessions it held, some of them resumed elsewhere since: it is
*fenced* before it takes traffic. It stays unknown (no placements, no probes for
locates; resumes that find no copy elsewhere fail closed, retryably) while the shell
closes its copies of the sessions that live elsewhere now
(:func:`router.core.split_brain.stale_on_return`), then turns up (:class:`Fenced`).

A client link that is alive proves the process is alive, however often the control
link's reconnects are refused.

A backend's URL must reach one process. A client link that reaches another process than
the control link while the control link is up (an L4 balancer with several processes
behind one URL, a rolling update with surge) is reported (:attr:`Transition.mismatch`),
not taken for a restart: the control link is checked again (a probe), and while its
process answers, the backend stays up and keeps its hints. It is *mixed* until the
control link next comes up: the control link's answers speak for its own process only,
so a ``not found`` from it does not outweigh a session attached here on a live link
(:func:`router.core.locate.evidence`). A real restart seen first on a client link is
still one: the old process's control link drops, and the new process it reaches then is
the restart (:class:`CameUp`). A backend whose control link is up but whose probes time
out (a frozen process: it accepts TCP and answers nothing) is *silent*: unknown too,
until it answers something again.

Transitions are a pure function of the state, the event and ``now`` (the shell's
monotonic clock, in seconds); nothing here reads a clock.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace
from typing import Any

from router.protocol import acp


class Health(enum.Enum):
    """A backend as the pool sees it; also the ``state`` label of its metric."""

    UP = "up"  # control link up: probed, and new sessions may go there
    UNKNOWN = "unknown"  # not probed, memory maybe intact: no placements, resumes fail closed
    GONE = "gone"  # known to hold nothing: out of the pool until it comes back


@dataclass(frozen=True, slots=True)
class Instance:
    """Which process answered ``initialize``: its ``agentInfo`` and nonce, if any."""

    info: tuple[tuple[str, str], ...]
    nonce: str | None

    @classmethod
    def of(cls, initialize_result: Any) -> Instance:
        result = initialize_result if isinstance(initialize_result, dict) else {}
        info = result.get("agentInfo")
        fields = (
            tuple(sorted((k, str(v)) for k, v in info.items() if k != "_meta"))
            if isinstance(info, dict)
            else ()
        )
        meta = result.get("_meta")
        nonce = meta.get(acp.INSTANCE_META_KEY) if isinstance(meta, dict) else None
        return cls(fields, nonce if isinstance(nonce, str) else None)

    def same_process(self, other: Instance) -> bool:
        """Whether ``other`` is this process back again.

        With a nonce on both sides, the nonces decide. Without one, a backend is taken
        as the same process unless its ``agentInfo`` changed (an upgrade is a restart):
        a restart it cannot report goes unseen, which costs nothing but stale hints,
        because every backend that is up is probed and its answers are the truth.
        """
        if self.nonce is not None and other.nonce is not None:
            return self.nonce == other.nonce
        return self.info == other.info


@dataclass(frozen=True, slots=True)
class CameUp:
    """The control link is up: ``initialize`` answered (``capabilities``: its result,
    what the fleet knows the backend offers from now on)."""

    instance: Instance
    capabilities: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class LinkDown:
    """The control link went down, or a reconnect failed.

    ``refused``: nothing accepted the connection. Said for the log only: it is not
    evidence that the process is gone (a proxy in front of a live agent refuses too).
    """

    refused: bool = False


@dataclass(frozen=True, slots=True)
class ProbeSilent:
    """A probe over the control link got no answer in time (or another request that
    counts as one: :func:`after_unanswered`)."""


@dataclass(frozen=True, slots=True)
class ProbeHeard:
    """The control link answered a probe (whatever the answer)."""


@dataclass(frozen=True, slots=True)
class ClientLinkUp:
    """A client connection's link to the backend opened (its ``initialize`` answered)."""

    instance: Instance


@dataclass(frozen=True, slots=True)
class ClientLinkDown:
    """A client connection's link to the backend that had opened has ended."""


@dataclass(frozen=True, slots=True)
class Fenced:
    """The copies a backend back after it was given up held of sessions that live
    elsewhere now are closed (or kept out): it may take traffic."""


Event = CameUp | LinkDown | ClientLinkUp | ClientLinkDown | ProbeSilent | ProbeHeard | Fenced


@dataclass(frozen=True, slots=True)
class BackendState:
    #: UP while the control link is up; otherwise UNKNOWN, or GONE once decided
    health: Health
    #: when the backend was last known alive while not up (the control link dropped, or
    #: the last client link ended), on the shell's clock; the grace runs from here
    since: float
    #: the process last seen, kept while it is down to tell a restart
    instance: Instance | None = None
    #: client links open to it now: each proves the process alive
    live_links: int = 0
    #: its control link is up but its last probe went unanswered
    silent: bool = False
    #: it came back as the same process after it was given up: unknown until fenced
    fencing: bool = False
    #: while fencing: its control link is up (it is alive, and does not lapse)
    linked: bool = False
    #: a client link reached another process than the control link's since the control
    #: link last came up (more than one process behind its URL)
    mixed: bool = False

    @classmethod
    def starting(cls, now: float) -> BackendState:
        """Before its first answer a backend is unknown: another router replica, or this
        one before a restart, may have placed sessions there."""
        return cls(Health.UNKNOWN, now)

    @property
    def seen(self) -> bool:
        """Whether it has answered since the router started."""
        return self.instance is not None

    def at(self, now: float, grace: float) -> Health:
        """The health at ``now``: unknown turns into gone once ``grace`` has passed with no
        link of any kind alive (a backend being fenced has its control link up); a
        silent backend is unknown."""
        if (
            self.health is Health.UNKNOWN
            and not self.live_links
            and not self.linked
            and now - self.since >= grace
        ):
            return Health.GONE
        if self.health is Health.UP and self.silent:
            return Health.UNKNOWN
        return self.health


@dataclass(frozen=True, slots=True)
class Transition:
    state: BackendState
    #: it lost its memory just now (past the grace, or restarted): hints to it name
    #: sessions it no longer runs
    lost_memory: bool = False
    #: it came back as another process
    restarted: bool = False
    #: it came back as the same process after it was given up: fence it now
    fence: bool = False
    #: a client link reached another process than the control link, which is up: report
    #: it, and probe the control link again (no restart, no demotion)
    mismatch: bool = False


def transition(state: BackendState, event: Event, *, now: float, grace: float) -> Transition:
    """The state after ``event`` at ``now``."""
    health = state.at(now, grace)
    lapsed = health is Health.GONE and state.health is not Health.GONE
    if isinstance(event, CameUp | ClientLinkUp):
        return _answered(state, event, health, lapsed, now)
    if isinstance(event, Fenced):
        if not (state.fencing and state.linked):  # not being fenced, or its link dropped
            return Transition(state)
        return Transition(replace(state, health=Health.UP, since=now, fencing=False, linked=False))
    if isinstance(event, ProbeSilent | ProbeHeard):
        silent = isinstance(event, ProbeSilent) and state.health is Health.UP
        return Transition(state if silent == state.silent else replace(state, silent=silent))
    if isinstance(event, ClientLinkDown):
        live = max(state.live_links - 1, 0)
        if health is Health.UP:
            return Transition(replace(state, live_links=live))
        return Transition(replace(state, since=now, live_links=live))
    if state.health is Health.UP or state.linked:
        down = replace(state, health=Health.UNKNOWN, since=now, silent=False, linked=False)
        return Transition(down)
    if lapsed:
        return Transition(replace(state, health=Health.GONE), lost_memory=state.seen)
    return Transition(state)


def _answered(
    state: BackendState, event: CameUp | ClientLinkUp, health: Health, lapsed: bool, now: float
) -> Transition:
    """A process answered ``initialize``, on the control link or on a client link."""
    restarted = state.instance is not None and not state.instance.same_process(event.instance)
    if restarted and isinstance(event, ClientLinkUp) and state.health is Health.UP:
        live = replace(state, live_links=state.live_links + 1, mixed=True)
        return Transition(live, mismatch=True)
    returned = health is Health.GONE and state.seen and not restarted
    fencing = (returned or state.fencing) and not restarted
    if isinstance(event, CameUp):
        after = BackendState(
            Health.UNKNOWN if fencing else Health.UP,
            now,
            event.instance,
            state.live_links,
            fencing=fencing,
            linked=fencing,
        )
    else:
        stays_up = state.health is Health.UP and not restarted
        after = BackendState(
            Health.UP if stays_up else Health.UNKNOWN,
            now,
            event.instance,
            state.live_links + 1,
            silent=stays_up and state.silent,
            fencing=fencing,
            linked=state.linked,
        )
    lost = (lapsed and state.seen) or (restarted and health is not Health.GONE)
    fence = fencing and isinstance(event, CameUp)
    return Transition(after, lost_memory=lost, restarted=restarted, fence=fence)


# -- what the shell's waits and probe rounds mean ---------------------------------------------------


def after_probe(state: BackendState, *, answered: bool, timed_out: bool) -> Event | None:
    """What one probe of a backend says about it: an up backend whose control link took
    the probe and said nothing by the deadline is silent (a frozen process: it accepts
    TCP and answers nothing) until any probe is answered again; None when it changes
    nothing (a probe its link refused says nothing about the process)."""
    if answered and state.silent:
        return ProbeHeard()
    if timed_out and not state.silent and state.health is Health.UP:
        return ProbeSilent()
    return None


def after_unanswered(state: BackendState) -> Event | None:
    """What a request other than a probe (a client link's handshake) that got no answer
    by its deadline says of a backend: an up backend is silent, as after a probe that
    timed out (:func:`after_probe`), until it answers again; None when it changes
    nothing (it is silent already, or not up)."""
    if state.health is Health.UP and not state.silent:
        return ProbeSilent()
    return None


def lapses_at(state: BackendState, grace: float) -> float | None:
    """When an unknown backend turns gone by itself (no link of any kind alive for the
    grace), on the shell's clock; None when only an event can change its health (it is
    up, silent, gone, or a client link to it is alive). A wait for its health wakes at
    this time at the latest, and never before ``now``: a wait with nothing to wait for
    but events waits for them (docs/architecture.md, "Waits")."""
    if state.health is not Health.UNKNOWN or state.live_links or state.linked:
        return None
    return state.since + grace


def decided(health: Health, *, answers_probe: bool | None) -> bool:
    """Whether it is decided what a backend whose link was lost kept in memory, so a
    failover may stop waiting for it: it is gone
    (its sessions are nowhere in memory), or it is up and, where it can be asked,
    answers a probe now (a backend whose client link just broke may still look up until
    its control link notices)."""
    if health is Health.GONE:
        return True
    return health is Health.UP and answers_probe is not False
