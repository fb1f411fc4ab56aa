"""Which backends the pool holds, and what a new list of them changes, sans-I/O.

A reload (SIGHUP, ``POST /admin/reload``) and DNS discovery both end in a new list of
backends. :func:`diff` says what it changes against the running one: backends added,
removed, reweighted (only the ranking changes) or replaced (same id, another address or
TLS setting: a new control link). :func:`needs_restart` says which other settings
changed that the running router cannot take (the listen address, TLS...), so the
operator is told instead of the change being silently ignored. The shell applies both.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass

from router.protocol.ids import BackendId


@dataclass(frozen=True, slots=True)
class Member:
    """A backend as membership sees it."""

    id: BackendId
    weight: float
    #: what its links are made from (url, TLS files): when it changes, the link is new
    endpoint: tuple[str | None, ...]


@dataclass(frozen=True, slots=True)
class MembershipChange:
    """What a new backend list changes; each part in the new list's order (removed: the
    old list's)."""

    added: tuple[Member, ...] = ()
    removed: tuple[BackendId, ...] = ()
    #: same id and endpoint, another weight: only the ranking changes
    reweighted: tuple[Member, ...] = ()
    #: same id, another endpoint: its control link is made again
    replaced: tuple[Member, ...] = ()

    @property
    def empty(self) -> bool:
        return not (self.added or self.removed or self.reweighted or self.replaced)

    def summary(self) -> str:
        """One line for the log: ``added agent-3; removed agent-1; reweighted agent-2``."""
        parts = [
            (word, ids)
            for word, ids in (
                ("added", [m.id for m in self.added]),
                ("removed", list(self.removed)),
                ("reweighted", [f"{m.id} (weight {m.weight:g})" for m in self.reweighted]),
                ("replaced", [m.id for m in self.replaced]),
            )
            if ids
        ]
        return "; ".join(f"{word} {', '.join(ids)}" for word, ids in parts) or "no backend changed"


def diff(old: Iterable[Member], new: Iterable[Member]) -> MembershipChange:
    """What turns ``old`` into ``new`` (ids are unique in each)."""
    before = {member.id: member for member in old}
    after = {member.id: member for member in new}
    added = tuple(m for m in after.values() if m.id not in before)
    removed = tuple(b for b in before if b not in after)
    kept = [(before[m.id], m) for m in after.values() if m.id in before]
    replaced = tuple(m for was, m in kept if was.endpoint != m.endpoint)
    reweighted = tuple(
        m for was, m in kept if was.endpoint == m.endpoint and was.weight != m.weight
    )
    return MembershipChange(added, removed, reweighted, replaced)


def flatten(data: Mapping[str, object], prefix: str = "") -> dict[str, object]:
    """``{"router": {"listen": x}}`` as ``{"router.listen": x}``; lists stay whole."""
    flat: dict[str, object] = {}
    for key, value in data.items():
        path = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            flat |= flatten(value, f"{path}.")
        else:
            flat[path] = value
    return flat


_ABSENT = object()


def needs_restart(
    old: Mapping[str, object], new: Mapping[str, object], live: Collection[str]
) -> tuple[str, ...]:
    """The keys (``router.listen``) whose value differs between two configurations
    (nested dicts, as a model dumps them) and that are not under one of the ``live``
    keys: the running router cannot take them. A whole section that appeared or went
    is named once (``auth``), not key by key."""
    before, after = flatten(old), flatten(new)
    changed = sorted(
        key
        for key in before.keys() | after.keys()
        if before.get(key, _ABSENT) != after.get(key, _ABSENT)
        and not any(key == root or key.startswith(f"{root}.") for root in live)
    )
    return tuple(
        key for key in changed if not any(key.startswith(f"{other}.") for other in changed)
    )
