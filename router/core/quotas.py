"""Limits per client and per process, sans-I/O: open connections counted per client
(a token's principal, or an address), token buckets for new sessions and locates, and
the bytes held over every connection.

The buckets read no clock: every call takes ``now`` (seconds, from any monotonic
clock the shell chooses), so tests move time by passing a larger number.

Every table is bounded. Connection counts hold only clients with a connection open
(at most the router's ``max_connections``). A bucket table keeps the ``max_keys``
clients used last; a client pushed out comes back with a full bucket, which is what it
would have after a quiet spell, so under a flood of more clients than that the limit
errs on the generous side and memory stays flat.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Literal

from router.core.frontdoor import ANONYMOUS, Principal
from router.protocol import acp
from router.protocol.errors import TooManyLocates, TooManyNewSessions


@dataclass(frozen=True, slots=True)
class Client:
    """Whom a connection and locate limit counts: with credentials configured, the
    principal of the token a client came with (its address says nothing then: behind a
    NAT or an ingress every user shares one); without, its address."""

    scope: Literal["principal", "address"]
    name: str

    @classmethod
    def of(cls, principal: Principal, address: str) -> Client:
        if principal == ANONYMOUS:
            return cls("address", address)
        return cls("principal", principal)


@dataclass(eq=False, slots=True)
class Seat:
    """One client connection's place among :class:`ClientPlaces` (compared by identity)."""

    client: Client
    #: it counts (False once given back, or reclaimed)
    held: bool = True
    #: open but not in use: it may be reclaimed for a newcomer
    idle: bool = False


@dataclass(frozen=True, slots=True)
class Full:
    """No place: too many connections for the client (``scope``: its principal or its
    address: HTTP 429) or in all (``process``: 503)."""

    scope: Literal["principal", "address", "process"]


@dataclass(frozen=True, slots=True)
class Taken:
    """A place, and the idle connections that gave theirs up for it (end them)."""

    place: Seat
    reclaimed: tuple[Seat, ...] = ()


@dataclass(slots=True)
class _Holder:
    count: int = 0
    #: its idle places, the longest idle first
    idle: OrderedDict[Seat, None] = field(default_factory=OrderedDict)


class ClientPlaces:
    """Client connections (WebSocket and Streamable HTTP) open now: at most
    ``per_principal`` or ``per_address`` for one :class:`Client`, ``most`` in all.

    A Streamable HTTP connection holds no socket between its requests: marked idle
    (:meth:`rest`), it keeps its place only until a newcomer finds every place taken.
    Then the idle place of the client that holds the most places goes, its longest idle
    first: a client that keeps many connections alive cannot lock others out, and
    cannot renew more than its own share, which is never reclaimed for it.
    """

    def __init__(self, per_principal: int, per_address: int, most: int) -> None:
        self._limits = {"principal": per_principal, "address": per_address}
        self.most = most
        self.open = 0
        self._holders: dict[Client, _Holder] = {}

    def take(self, client: Client) -> Taken | Full:
        holder = self._holders.get(client)
        if holder is not None and holder.count >= self._limits[client.scope]:
            return Full(client.scope)
        reclaimed: tuple[Seat, ...] = ()
        if self.open >= self.most:
            victim = self._idlest()
            if victim is None:
                return Full("process")
            self.give_back(victim)
            reclaimed = (victim,)
        holder = self._holders.setdefault(client, _Holder())
        holder.count += 1
        self.open += 1
        return Taken(Seat(client), reclaimed)

    def give_back(self, place: Seat) -> None:
        """The connection has ended (or was reclaimed): its place is free."""
        if not place.held:
            return
        place.held = False
        holder = self._holders[place.client]
        holder.idle.pop(place, None)
        holder.count -= 1
        self.open -= 1
        if not holder.count:
            del self._holders[place.client]

    def rest(self, place: Seat) -> None:
        """The connection is open but not in use: its place may be reclaimed."""
        if place.held and not place.idle:
            place.idle = True
            self._holders[place.client].idle[place] = None

    def use(self, place: Seat) -> None:
        """The connection is in use again."""
        if place.held and place.idle:
            place.idle = False
            del self._holders[place.client].idle[place]

    def count(self, client: Client) -> int:
        holder = self._holders.get(client)
        return 0 if holder is None else holder.count

    def _idlest(self) -> Seat | None:
        """The longest idle place of the client holding the most places, if any is idle."""
        holders = [h for h in self._holders.values() if h.idle]
        if not holders:
            return None
        biggest = max(holders, key=lambda h: h.count)
        return next(iter(biggest.idle))


class ConnectionCounts:
    """Open TCP connections per address, with a ceiling per address."""

    def __init__(self, per_address: int) -> None:
        self.per_address = per_address
        self._open: dict[str, int] = {}

    def open(self, address: str) -> bool:
        """Count a new connection from ``address``; False (not counted) at its ceiling."""
        count = self._open.get(address, 0)
        if count >= self.per_address:
            return False
        self._open[address] = count + 1
        return True

    def close(self, address: str) -> None:
        count = self._open[address] - 1
        if count:
            self._open[address] = count
        else:
            del self._open[address]

    def __len__(self) -> int:
        """Addresses with a connection open."""
        return len(self._open)


@dataclass(slots=True)
class TokenBucket:
    """``capacity`` tokens at most, refilled at ``per_second``; one token per event."""

    capacity: float
    per_second: float
    tokens: float
    stamp: float

    @classmethod
    def full(cls, per_minute: int, now: float) -> TokenBucket:
        return cls(float(per_minute), per_minute / 60.0, float(per_minute), now)

    def _refill(self, now: float) -> None:
        if now > self.stamp:
            self.tokens = min(self.capacity, self.tokens + (now - self.stamp) * self.per_second)
            self.stamp = now

    def retry_after(self, now: float) -> float:
        """Seconds until a token is there (0 when one is there now)."""
        self._refill(now)
        return 0.0 if self.tokens >= 1 else (1 - self.tokens) / self.per_second

    def take(self) -> None:
        """Spend a token; call only after :meth:`retry_after` said 0."""
        self.tokens -= 1


class RateTable:
    """One token bucket per key (a client address), the ``max_keys`` used last."""

    def __init__(self, per_minute: int, max_keys: int) -> None:
        self.per_minute = per_minute
        self.max_keys = max_keys
        self._buckets: OrderedDict[str, TokenBucket] = OrderedDict()

    def bucket(self, key: str, now: float) -> TokenBucket:
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = self._buckets[key] = TokenBucket.full(self.per_minute, now)
            if len(self._buckets) > self.max_keys:
                self._buckets.popitem(last=False)
        else:
            self._buckets.move_to_end(key)
        return bucket

    def __len__(self) -> int:
        return len(self._buckets)


class SessionQuota:
    """New sessions per minute, per address and for the whole process.

    :meth:`admit` spends a token from both buckets or from neither, so a refusal by
    one limit does not eat into the other.
    """

    def __init__(self, per_address: int, in_all: int, max_addresses: int) -> None:
        self.addresses = RateTable(per_address, max_addresses)
        self.process = TokenBucket.full(in_all, float("-inf"))  # full whatever the clock

    def admit(self, address: str, now: float) -> tuple[str, float] | None:
        """None when a new session from ``address`` may go ahead (and it is counted);
        otherwise which limit said no ("address" or "process") and the seconds to wait."""
        bucket = self.addresses.bucket(address, now)
        return admit_all((("address", bucket), ("process", self.process)), now)


class LocateQuota:
    """Locates per minute (resumes, loads, closes of sessions not attached, statuses: each
    may ask the whole pool), per :class:`Client` (its principal, or its address without
    credentials); each connection holds a bucket of its own (:meth:`connection_bucket`).
    A token comes from both buckets or from neither."""

    def __init__(
        self, per_connection: int, per_address: int, max_clients: int, per_principal: int
    ) -> None:
        self.per_connection = per_connection
        self.clients = {
            "address": RateTable(per_address, max_clients),
            "principal": RateTable(per_principal, max_clients),
        }

    def connection_bucket(self, now: float) -> TokenBucket:
        return TokenBucket.full(self.per_connection, now)

    def admit(self, client: Client, mine: TokenBucket, now: float) -> tuple[str, float] | None:
        """None when a locate may go ahead (counted); otherwise which limit said no
        ("connection", "principal" or "address") and the seconds to wait."""
        theirs = self.clients[client.scope].bucket(client.name, now)
        return admit_all((("connection", mine), (client.scope, theirs)), now)


class Budget:
    """One client connection's share of the router's rate limits: the new-session quota
    of its address and of the process, and the locate budget of the connection and of its
    :class:`Client`. The routing core spends it after its own checks, so a request it
    refuses for another reason (before ``initialize``, a reserved id, no room) costs
    nothing; the time comes in with each request."""

    def __init__(
        self,
        sessions: SessionQuota,
        locates: LocateQuota,
        address: str,
        client: Client,
        now: float,
    ) -> None:
        self._sessions = sessions
        self._locates = locates
        self._address = address
        self._client = client
        self._mine = locates.connection_bucket(now)

    def new_session(self, now: float) -> None:
        """Spend one new session (``session/new``, ``session/fork``).

        Raises:
            TooManyNewSessions: over the address's or the process's limit.
        """
        refused = self._sessions.admit(self._address, now)
        if refused is not None:
            scope, wait = refused
            raise TooManyNewSessions(scope, math.ceil(wait * 1000))

    def locate(self, now: float) -> None:
        """Spend one locate (:func:`costs_a_locate` says which requests cost one).

        Raises:
            TooManyLocates: over the connection's, the principal's or the address's limit.
        """
        refused = self._locates.admit(self._client, self._mine, now)
        if refused is not None:
            scope, wait = refused
            raise TooManyLocates(scope, math.ceil(wait * 1000))


def admit_all(limits: tuple[tuple[str, TokenBucket], ...], now: float) -> tuple[str, float] | None:
    """Spend a token from every bucket, or from none: the first that has none says which
    limit it is and how long until it has one."""
    for scope, limit in limits:
        wait = limit.retry_after(now)
        if wait > 0:
            return scope, wait
    for _, limit in limits:
        limit.take()
    return None


class ByteBudget:
    """Bytes held at once over every connection (``router.max_held_bytes``): request
    bodies being read and frames held for event streams the client has not opened.
    Each connection's share is bounded on its own too; this bounds their sum."""

    def __init__(self, most: int) -> None:
        self.most = most
        self.held = 0

    def take(self, size: int) -> bool:
        """Hold ``size`` more bytes (given back with :meth:`give`); False (none held)
        when that would pass the budget."""
        if self.held + size > self.most:
            return False
        self.held += size
        return True

    def give(self, size: int) -> None:
        self.held -= size


def costs_a_locate(method: str, *, attached: bool) -> bool:
    """Whether a client request costs one locate of its connection's and its address's
    budget: one the router answers from the whole pool (``session/status``, and
    ``session/list``, whose every page asks every backend), or must locate first (a
    resume, load or close of a session not attached on the connection). A request routed
    to where its session is attached costs nothing; the router's own calls (a failover's
    resume, a resume located again after a ``-32002``) are never charged to the client."""
    if method in (acp.SESSION_STATUS, acp.SESSION_LIST):
        return True
    return not attached and (method in acp.ATTACHING or method in acp.RELEASING)


#: the audit's budget saves up at most this many rounds' worth of probes
AUDIT_CREDIT_CAP = 4.0


class AuditBudget:
    """The probes the split-brain audit may spend: each locate that trusted a hint earns
    one (the probes it did not send), and ``cache.audit_probes_per_second`` more come
    with time, saved up to :data:`AUDIT_CREDIT_CAP` rounds' worth. So a reconnect storm
    after a restart costs about two probes a resume, not a fan-out each."""

    def __init__(self, now: float) -> None:
        self.credit = 0.0
        self._stamp = now

    def earn(self) -> None:
        self.credit += 1.0

    def spend(self, cost: float, per_second: float, now: float) -> float:
        """Spend ``cost`` probes (a round over the pool) if the budget covers it: 0.0;
        otherwise nothing is spent, and the seconds until it will cover it."""
        saved = self.credit + max(now - self._stamp, 0.0) * per_second
        self.credit = min(saved, max(cost, 1.0) * AUDIT_CREDIT_CAP)
        self._stamp = now
        if self.credit < cost:
            return (cost - self.credit) / per_second
        self.credit -= cost
        return 0.0
