"""Whether a backend may still hold sessions in memory, sans-I/O: up, unknown or gone.

Down is not gone (design.md, "Routing", rule 4). A backend whose control link is
down may still run sessions, so it stays in the pool as *unknown* (probed never,
placed on never, but a reason to fail a resume closed) until it is known to have
lost its memory:

* its reconnect is refused: nothing listens, so the process that held the sessions
  is gone;
* it has been unreachable for longer than the grace (``control.down_grace_ms``);
* it comes back as another process (:meth:`Instance.same_process`).

Transitions are a pure function of the state, the event and ``now`` (the shell's
monotonic clock, in seconds); nothing here reads a clock.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

#: where a backend that reports a per-process nonce puts it: ``_meta`` of its
#: ``initialize`` result (the reference agent does)
INSTANCE_META_KEY = "instanceId"


class Health(enum.Enum):
    """A backend as the pool sees it; also the ``state`` label of its metric."""

    UP = "up"  # control link up: probed, and new sessions may go there
    UNKNOWN = "unknown"  # link down, memory maybe intact: no placements, resumes fail closed
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
        nonce = meta.get(INSTANCE_META_KEY) if isinstance(meta, dict) else None
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
    """The control link is up: ``initialize`` answered."""

    instance: Instance


@dataclass(frozen=True, slots=True)
class LinkDown:
    """The control link went down, or a reconnect failed."""

    #: nothing listens (connection refused): the process is gone
    refused: bool = False


Event = CameUp | LinkDown


@dataclass(frozen=True, slots=True)
class BackendState:
    health: Health
    #: when ``health`` began, on the shell's clock
    since: float
    #: the process last seen up, kept while it is down to tell a restart
    instance: Instance | None = None

    @classmethod
    def starting(cls, now: float) -> BackendState:
        """Before its first answer a backend is unknown: another router replica, or this
        one before a restart, may have placed sessions there."""
        return cls(Health.UNKNOWN, now)

    def at(self, now: float, grace: float) -> Health:
        """The health at ``now``: unknown turns into gone once ``grace`` has passed."""
        if self.health is Health.UNKNOWN and now - self.since >= grace:
            return Health.GONE
        return self.health


@dataclass(frozen=True, slots=True)
class Transition:
    state: BackendState
    #: it lost its memory just now (refused, past the grace, or restarted): hints to it
    #: name sessions it no longer runs
    lost_memory: bool = False
    #: it came back as another process
    restarted: bool = False


def transition(state: BackendState, event: Event, *, now: float, grace: float) -> Transition:
    """The state after ``event`` at ``now``."""
    health = state.at(now, grace)
    lapsed = health is Health.GONE and state.health is not Health.GONE
    if isinstance(event, CameUp):
        restarted = state.instance is not None and not state.instance.same_process(event.instance)
        up = BackendState(Health.UP, now, event.instance)
        return Transition(
            up, lost_memory=lapsed or (restarted and health is not Health.GONE), restarted=restarted
        )
    if event.refused and health is not Health.GONE:
        return Transition(BackendState(Health.GONE, now, state.instance), lost_memory=True)
    if health is Health.UP:
        return Transition(BackendState(Health.UNKNOWN, now, state.instance))
    if lapsed:
        return Transition(BackendState(Health.GONE, now, state.instance), lost_memory=True)
    return Transition(state)
