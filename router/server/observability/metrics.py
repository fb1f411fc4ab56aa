"""Prometheus metrics of the router, on a registry of its own.

Names follow the Prometheus rules (``acp_router_`` prefix, base units, ``_total`` on
counters); labels are low-cardinality (backend ids, outcomes, directions), never session
or client ids. Latency histograms start at 100 µs: the client library's default buckets
start at 5 ms, where every probe would land in the first bucket. No ``*_created``
series: the client library's creation timestamp of every counter and histogram child
(a third of the samples) says nothing docs/operations.md lists, so it is off.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import platform
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Self, get_args

import aiohttp
import prometheus_client
from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from router import __version__, native
from router.core.effects import Awaited
from router.core.health import Health
from router.core.locate import AdminState
from router.core.split_brain import How
from router.protocol import utf8
from router.protocol.ids import BackendId

# one switch for the process in the client library; this module is the router's one user
prometheus_client.disable_created_metrics()  # type: ignore[no-untyped-call]

LATENCY_BUCKETS = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)  # fmt: skip
FANOUT_BUCKETS = (1, 2, 3, 5, 10, 30, 100, 300, 1000)

CONTENT_TYPE = CONTENT_TYPE_LATEST

logger = logging.getLogger(__name__)

TO_BACKEND = "client_to_backend"
TO_CLIENT = "backend_to_client"

#: the codes ``acp_router_client_errors_total`` names: JSON-RPC's, ACP's and the
#: router's own range (-32010..-32019); a backend's error may carry any integer, and
#: each would be a series of its own
KNOWN_ERROR_CODES = frozenset(
    {-32700, -32600, -32601, -32602, -32603, -32000, -32001, -32002, -32003, *range(-32019, -32009)}
)


#: the ``limit`` label of each rate limit the routing core spends (kind, scope)
_RATE_LIMITS = {
    ("sessions", "address"): "sessions_per_address",
    ("sessions", "process"): "sessions",
    ("locates", "connection"): "locates_per_connection",
    ("locates", "address"): "locates_per_address",
    ("locates", "principal"): "locates_per_principal",
}


def error_code_label(code: int) -> str:
    """The ``code`` label of an error the router answered: the code when it is one of
    :data:`KNOWN_ERROR_CODES`, else ``other``."""
    return str(code) if code in KNOWN_ERROR_CODES else "other"


class _RememberedLabels(MetricWrapperBase):
    """A metric whose ``labels(...)`` answers from a dict after the first call.

    prometheus_client validates the label count, turns each value into ``str`` and
    takes a lock on every ``labels()`` call: about six times the cost of the
    increment that follows, on paths that run per frame and per probe. Children are
    never removed here, so the dict holds what the library holds already, one entry
    per label set used (by value as passed: ``labels(7)`` and ``labels("7")`` are two
    keys for one child).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._remembered: dict[tuple[object, ...], Self] = {}

    def labels(self, *labelvalues: object, **labelkwargs: object) -> Self:
        if labelkwargs:
            return super().labels(*labelvalues, **labelkwargs)
        child = self._remembered.get(labelvalues)
        if child is None:
            child = self._remembered[labelvalues] = super().labels(*labelvalues)
        return child

    def remove(self, *labelvalues: object) -> None:
        """Drop one child (a backend that left the pool), if it exists."""
        self._remembered.pop(labelvalues, None)
        with contextlib.suppress(KeyError):
            super().remove(*labelvalues)

    def remove_where(self, first: str) -> None:
        """Drop every child whose first label value is ``first`` (a backend that left)."""
        for labelvalues in [k for k in self._remembered if k and k[0] == first]:
            self.remove(*labelvalues)


class Counter(_RememberedLabels, prometheus_client.Counter):
    pass


class Gauge(_RememberedLabels, prometheus_client.Gauge):
    pass


class TalliedCounter(Counter):
    """A counter the per-frame path adds to as plain integers (:meth:`tally`), without
    prometheus_client's lock and checks per increment; the sums join the counter
    whenever the registry reads it (:meth:`collect`), so every reading is exact."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._tallies: dict[tuple[str, ...], list[int]] = {}

    def tally(self, *labelvalues: str) -> list[int]:
        """A one-item list for ``labelvalues``: add to its item; it joins the counter's
        child for those labels at the next reading."""
        box = self._tallies.get(labelvalues)
        if box is None:
            self.labels(*labelvalues)  # the series exists (at 0) from now on
            box = self._tallies[labelvalues] = [0]
        return box

    def collect(self) -> Any:
        for labelvalues, box in self._tallies.items():
            if box[0]:
                self.labels(*labelvalues).inc(box[0])
                box[0] = 0
        return super().collect()


class Histogram(_RememberedLabels, prometheus_client.Histogram):
    pass


#: why a backend's frame was dropped: no JSON parser accepts it, JSON but not JSON-RPC,
#: binary, JSON nested deeper than the router reads, larger than router.max_message_bytes
DROP_REASONS = ("not_json", "not_jsonrpc", "binary", "too_deep", "too_big")

#: why a Streamable HTTP connection ended (``acp_router_http_connections_ended_total``)
HTTP_END_REASONS = ("deleted", "idle", "overflow", "reclaimed", "closed", "error")


class Metrics:
    def __init__(self) -> None:
        self.registry = registry = CollectorRegistry()
        ProcessCollector(registry=registry)
        self.build_info = Gauge(
            "acp_router_build_info",
            "Build information: the acp-router version and the Python it runs on (always 1)",
            ["version", "python"],
            registry=registry,
        )
        self.build_info.labels(__version__, platform.python_version()).set(1)
        self.event_loop = Gauge(
            "acp_router_event_loop_info",
            "The event loop the router runs on (router.event_loop: uvloop or asyncio; always 1)",
            ["loop"],
            registry=registry,
        )
        self.modules = Gauge(
            "acp_router_modules_info",
            "How the per-frame modules run: compiled (with mypyc, by make install) or pure"
            " (their Python sources; always 1)",
            ["modules"],
            registry=registry,
        )
        self.modules.labels(native.describe()).set(1)
        self.connections = Counter(
            "acp_router_connections_total",
            "Client connections (WebSocket, or Streamable HTTP at initialize), by result:"
            " accepted (upgraded, or an HTTP initialize), refused at the door (draining,"
            " forbidden_origin, unauthorized, not_websocket, address_limit, principal_limit,"
            " rejected, fd_limit), or closed (handshake_timeout, initialize_timeout, revoked)",
            ["result"],
            registry=registry,
        )
        self.active_connections = Gauge(
            "acp_router_active_connections",
            "Client connections (WebSocket or Streamable HTTP) open now",
            registry=registry,
        )
        self.max_connections = Gauge(
            "acp_router_max_connections",
            "The configured router.max_connections: TCP connections beyond it get HTTP 503",
            registry=registry,
        )
        self.open_connections = Gauge(
            "acp_router_open_connections",
            "TCP connections to the front door counted against router.max_connections"
            " (in the handshake, WebSocket or keep-alive HTTP)",
            registry=registry,
        )
        self.handshaking = Gauge(
            "acp_router_handshaking_connections",
            "TCP connections accepted that have not sent a whole request yet"
            " (closed after router.handshake_timeout_ms)",
            registry=registry,
        )
        self.fd_refuse_at = Gauge(
            "acp_router_fd_refuse_at",
            "New connections get HTTP 503 once their file descriptor number reaches this"
            " (90% of RLIMIT_NOFILE; 0: no limit); compare process_open_fds",
            registry=registry,
        )
        self.attached_sessions = Gauge(
            "acp_router_attached_sessions",
            "Sessions attached through this router, by backend",
            ["backend"],
            registry=registry,
        )
        self.locates = Counter(
            "acp_router_locate_total",
            "Session locates, by outcome: where a backend was found or chosen (active, inactive,"
            " remembered, default) or why none was (unknown_failed, no_backend, not_found)",
            ["outcome"],
            registry=registry,
        )
        self.locate_duration = Histogram(
            "acp_router_locate_duration_seconds",
            "Time to locate a session, by outcome (those of acp_router_locate_total)",
            ["outcome"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.locate_cache = Counter(
            "acp_router_locate_cache_requests_total",
            "Location-hint lookups, by result: hit (the hint said active, confirmed lately), audit"
            " (it said active, trusted, the rest of the pool is asked later), verify (it said"
            " active, but the session is attached elsewhere here: the pool is asked now), stale"
            " (it did not), miss (no hint)",
            ["result"],
            registry=registry,
        )
        self.fanout = Histogram(
            "acp_router_probe_fanout_size",
            "Backends probed per locate",
            buckets=FANOUT_BUCKETS,
            registry=registry,
        )
        self.audits = Counter(
            "acp_router_audits_total",
            "Sessions audited for split brain off the request path, by result: clean, split"
            " (another backend had it active too), inconclusive, error",
            ["result"],
            registry=registry,
        )
        for result in ("clean", "split", "inconclusive", "error"):
            self.audits.labels(result)
        self.new_sessions_replaced = Counter(
            "acp_router_new_sessions_replaced_total",
            "session/new requests placed once more elsewhere because their backend left"
            " them, and a probe beside them, unanswered (a frozen process), by backend",
            ["backend"],
            registry=registry,
        )
        self.attached_checks = Counter(
            "acp_router_attached_checks_total",
            "Sessions attached through this router checked again across the pool, every"
            " heartbeat, by result: clean, split (a copy here or elsewhere was stale: closed,"
            " and detached here), denied (the agent it is attached to no longer has it:"
            " detached here)",
            ["result"],
            registry=registry,
        )
        for result in ("clean", "split", "denied"):
            self.attached_checks.labels(result)
        self.fanouts = Counter(
            "acp_router_probe_fanouts_total",
            "Probe rounds that asked more than the hinted backend (its rate is the fan-out rate)",
            registry=registry,
        )
        self.probes = Counter(
            "acp_router_probes_total",
            "session/status probes, by backend and result: active, inactive, not_found, unknown",
            ["backend", "result"],
            registry=registry,
        )
        self.probe_duration = Histogram(
            "acp_router_probe_duration_seconds",
            "session/status probe round trip, by backend",
            ["backend"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.resumes = Counter(
            "acp_router_resume_total",
            "Forwarded session/resume and session/load, by backend and result: ok, not_found"
            " (-32002), error (another error), link_lost (the link closed before it answered)",
            ["backend", "result"],
            registry=registry,
        )
        self.split_brain = Counter(
            "acp_router_split_brain_detected_total",
            "Locates where more than one backend said active",
            registry=registry,
        )
        self.split_brain_resolved = Counter(
            "acp_router_split_brain_resolved_total",
            "Stale copies of a session closed on their backend, by the rule that chose the"
            " home (kept_out: the backend cannot close sessions; it gets no resume of it)",
            ["how"],
            registry=registry,
        )
        for how in (*(h.value for h in How), "kept_out"):
            self.split_brain_resolved.labels(how)
        self.backend_up = Gauge(
            "acp_router_backend_up",
            "1 when the control connection to the backend is up",
            ["backend"],
            registry=registry,
        )
        self.backend_state_changes = Counter(
            "acp_router_backend_state_changes_total",
            "Backend transitions, by what it became: up, down (link lost, maybe still holding"
            " sessions), gone",
            ["backend", "to"],
            registry=registry,
        )
        self.backend_state = Gauge(
            "acp_router_backend_state",
            "1 for the backend's state now: up, unknown (down, may hold sessions) or gone",
            ["backend", "state"],
            registry=registry,
        )
        self.backend_admin_state = Gauge(
            "acp_router_backend_admin_state",
            "1 for what an operator set the backend to: ready, drain or maint (admin API)",
            ["backend", "state"],
            registry=registry,
        )
        self.backend_restarts = Counter(
            "acp_router_backend_restarts_total",
            "Backends that came back as a new process (their sessions left memory)",
            ["backend"],
            registry=registry,
        )
        self.backend_instance_mismatches = Counter(
            "acp_router_backend_instance_mismatch_total",
            "Client links that reached another process than the backend's control link (its"
            " URL reaches more than one process: a balancer, a rolling update with surge)",
            ["backend"],
            registry=registry,
        )
        self.late_answers = Counter(
            "acp_router_late_answers_total",
            "Answers that came after their client connection was closed (the router stopping):"
            " dropped, by what the call awaited: status, list, locate, backend",
            ["kind"],
            registry=registry,
        )
        for kind in get_args(Awaited):
            self.late_answers.labels(kind)
        self.resume_attempts = Counter(
            "acp_router_resume_attempts_total",
            "session/resume and session/load forwarded to a backend, by attempt: first, retry"
            " (another backend after -32002)",
            ["attempt"],
            registry=registry,
        )
        self.failovers = Counter(
            "acp_router_failovers_total",
            "Sessions resumed by the router after their link was lost ([failover]), by result:"
            " ok, failed (nowhere to resume it), timeout (its backend was neither back nor"
            " gone in time)",
            ["result"],
            registry=registry,
        )
        for result in ("ok", "failed", "timeout"):
            self.failovers.labels(result)
        self.turns_cancelled = Counter(
            "acp_router_turns_cancelled_total",
            "Prompt turns the router cancelled on their backend (session/cancel) because the"
            " client connection that sent them was gone before their answer, by reason:"
            " client_gone (it closed, was lost or was closed), stopping (the router is"
            " stopping)",
            ["reason"],
            registry=registry,
        )
        for reason in ("client_gone", "stopping"):
            self.turns_cancelled.labels(reason)
        self.messages = TalliedCounter(
            "acp_router_messages_total",
            "Frames forwarded, by direction: client_to_backend, backend_to_client",
            ["direction"],
            registry=registry,
        )
        self.message_bytes = TalliedCounter(
            "acp_router_message_bytes_total",
            "Bytes of forwarded frames (UTF-8), by direction",
            ["direction"],
            registry=registry,
        )
        # resolved once, and plain integers: on the per-frame path labels() costs more
        # than the increment, and the increment (a lock, two checks) more than an add
        self._per_direction = {
            d: (self.messages.tally(d), self.message_bytes.tally(d))
            for d in (TO_BACKEND, TO_CLIENT)
        }
        self.client_errors = Counter(
            "acp_router_client_errors_total",
            "Errors the router answered itself, by JSON-RPC code (a code outside JSON-RPC's,"
            " ACP's and the router's, such as a backend's own, is other)",
            ["code"],
            registry=registry,
        )

        self.auth = Counter(
            "acp_router_auth_total",
            "Client authentications at the WebSocket upgrade or Streamable HTTP's initialize, and"
            " refusals on any HTTP request, by outcome: ok, missing, wrong, open",
            ["outcome"],
            registry=registry,
        )
        self.limited = Counter(
            "acp_router_limited_total",
            "Clients held back by a limit: connections_per_address and connections_per_principal"
            " (HTTP 429), sessions_per_address, sessions, locates_per_connection,"
            " locates_per_address and locates_per_principal (-32014), held_bytes (HTTP 503:"
            " router.max_held_bytes)",
            ["limit"],
            registry=registry,
        )
        for outcome in ("ok", "missing", "wrong"):
            self.auth.labels(outcome)
        for limit in (
            "connections_per_address",
            "connections_per_principal",
            "sessions_per_address",
            "sessions",
            "locates_per_connection",
            "locates_per_address",
            "locates_per_principal",
            "held_bytes",
        ):
            self.limited.labels(limit)
        self.backend_frames_dropped = Counter(
            "acp_router_backend_frames_dropped_total",
            "Frames from a backend that were not JSON-RPC, dropped unanswered, by reason: not_json"
            " (no JSON parser accepts it), not_jsonrpc (JSON, not JSON-RPC), binary, too_deep"
            " (nested deeper than the router reads), too_big (larger than"
            " router.max_message_bytes, which also closes the link)",
            ["backend", "reason"],
            registry=registry,
        )

        self.client_frames_ignored = Counter(
            "acp_router_client_frames_ignored_total",
            "Frames from clients ignored, by reason (binary: a binary WebSocket frame, which"
            " ACP's transport RFD says to ignore)",
            ["reason"],
            registry=registry,
        )
        self.client_frames_ignored.labels("binary")
        self.http_requests = Counter(
            "acp_router_http_requests_total",
            "Streamable HTTP requests at /acp (POST, GET event streams, DELETE), by method and"
            " HTTP status",
            ["method", "status"],
            registry=registry,
        )
        self.http_streams = Gauge(
            "acp_router_http_streams_open",
            "Streamable HTTP event streams open now",
            registry=registry,
        )
        self.http_ended = Counter(
            "acp_router_http_connections_ended_total",
            "Streamable HTTP connections ended, by reason: deleted (DELETE), idle (no stream"
            " and no POST for router.http_idle_seconds), overflow (frames held for a stream"
            " past router.http_held_frames or 2 x router.max_message_bytes, or over every"
            " connection past router.max_held_bytes), reclaimed (idle, its place given to a"
            " newcomer at router.max_connections), closed (by the router: shutdown), error (a"
            " router bug)",
            ["reason"],
            registry=registry,
        )
        for reason in HTTP_END_REASONS:
            self.http_ended.labels(reason)
        self.http_passed_on = Counter(
            "acp_router_http_passed_on_total",
            "Streamable HTTP requests that reached a worker other than the one holding their"
            " connection, passed on to that one (router.workers above 1)",
            registry=registry,
        )

        self.config_reloads = Counter(
            "acp_router_config_reloads_total",
            "Configuration reloads (SIGHUP, POST /admin/reload), by result: ok (applied) or"
            " refused (a bad file: the running configuration stays)",
            ["result"],
            registry=registry,
        )
        for result in ("ok", "refused"):
            self.config_reloads.labels(result)
        self.config_last_reload_success = Gauge(
            "acp_router_config_last_reload_success_timestamp_seconds",
            "When the configuration in force was loaded (the start, or the last good reload)",
            registry=registry,
        )
        self.backend_weight = Gauge(
            "acp_router_backend_weight",
            "The backend's configured weight",
            ["backend"],
            registry=registry,
        )

        self.discovery_lookups = Counter(
            "acp_router_discovery_lookups_total",
            "DNS discovery lookups, by name and result: ok, empty (the name has no address),"
            " failed (no answer: the last one stands)",
            ["name", "result"],
            registry=registry,
        )

    def watch_cache(self, size: Callable[[], int]) -> None:
        """Report the location cache's size at scrape time."""
        Gauge(
            "acp_router_locate_cache_entries",
            "Session location hints held",
            registry=self.registry,
        ).set_function(size)

    def watch_health(self, backend_ids: list[str], health: Callable[[BackendId], Health]) -> None:
        """Report each backend's state at scrape time (one-hot over up, unknown, gone):
        unknown turns into gone when the grace runs out, with no event to count."""
        for backend in backend_ids:
            for state in Health:
                self.backend_state.labels(backend, state.value).set_function(
                    _is(health, BackendId(backend), state)
                )

    def declare_backends(self, backend_ids: list[str]) -> None:
        """Create the per-backend series at start, so dashboards see zeros, not gaps."""
        for backend in backend_ids:
            self.backend_up.labels(backend).set(0)
            self.attached_sessions.labels(backend).set(0)
            for result in ("ok", "not_found", "error", "link_lost"):
                self.resumes.labels(backend, result)
            for reason in DROP_REASONS:
                self.backend_frames_dropped.labels(backend, reason)
            self.backend_restarts.labels(backend)
            self.backend_instance_mismatches.labels(backend)
            self.new_sessions_replaced.labels(backend)
            for admin in AdminState:
                self.backend_admin_state.labels(backend, admin.value).set(admin is AdminState.READY)
        for attempt in ("first", "retry"):
            self.resume_attempts.labels(attempt)

    def forget_backend(self, backend: str, *, attached: bool) -> None:
        """A backend left the pool: every series labelled with it goes, counters too (a
        fleet whose members come and go, as with DNS discovery, would otherwise grow
        ``/metrics`` without bound). ``attached``: sessions are still attached to it
        through this router, so their gauge stays until they end."""
        for metric in self._per_backend():
            if metric is not self.attached_sessions or not attached:
                metric.remove_where(backend)

    def _per_backend(self) -> tuple[_RememberedLabels, ...]:
        """The metrics whose first label is ``backend``."""
        return (
            self.backend_up,
            self.backend_weight,
            self.backend_state,
            self.backend_admin_state,
            self.attached_sessions,
            self.probes,
            self.probe_duration,
            self.resumes,
            self.backend_state_changes,
            self.backend_restarts,
            self.backend_instance_mismatches,
            self.new_sessions_replaced,
            self.backend_frames_dropped,
        )

    def rate_limited(self, kind: str, scope: str) -> None:
        """Count a request refused by a rate limit of the routing core's budget
        (:class:`~router.core.effects.Limited`)."""
        self.limited.labels(_RATE_LIMITS[kind, scope]).inc()

    def drop_frame(self, backend: str, reason: str) -> None:
        """Count a frame from ``backend`` that was dropped (one of :data:`DROP_REASONS`)."""
        self.backend_frames_dropped.labels(backend, reason).inc()

    def count_frame(self, direction: str, text: str) -> None:
        frames, size = self._per_direction[direction]
        frames[0] += 1
        size[0] += utf8.size(text)

    def tallies(self, direction: str) -> tuple[list[int], list[int]]:
        """The frames and bytes ``direction`` has forwarded, as one-item lists to add to
        (what :meth:`count_frame` does, for a caller counting every update an agent
        streams: no call per frame)."""
        return self._per_direction[direction]

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


def _is(
    health: Callable[[BackendId], Health], backend: BackendId, state: Health
) -> Callable[[], float]:
    return lambda: 1.0 if health(backend) is state else 0.0


# -- several workers (router.workers): one scrape for them all ----------------------------------

#: the label that tells the workers' series apart when router.workers is above 1
WORKER_LABEL = "worker"
#: how long a scrape waits for one worker's registry
WORKER_SCRAPE_SECONDS = 5.0
WORKER_UP = "acp_router_worker_up"
WORKER_UP_HELP = (
    "1 when the worker answered this scrape (router.workers above 1); 0 while it is down or"
    " starting again, and its series are missing"
)


class _Families:
    """Families already collected, as a collector for ``generate_latest``."""

    def __init__(self, families: Sequence[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterator[Metric]:
        return iter(self._families)


def merge(expositions: Mapping[int, bytes | None]) -> bytes:
    """The expositions of the workers (by index; None: that one did not answer) as one:
    each family once, with the samples of every worker labelled ``worker``, and
    ``acp_router_worker_up`` saying which workers answered."""
    families: dict[str, Metric] = {}
    up = Metric(WORKER_UP, WORKER_UP_HELP, "gauge")
    for worker, text in sorted(expositions.items()):
        label = {WORKER_LABEL: str(worker)}
        up.add_sample(WORKER_UP, label, 0.0 if text is None else 1.0)
        for family in text_string_to_metric_families("" if text is None else text.decode()):
            merged = families.get(family.name)
            if merged is None:
                merged = Metric(family.name, family.documentation, family.type, family.unit)
                families[family.name] = merged
            merged.samples += [_labelled(sample, label) for sample in family.samples]
    return generate_latest(_Families([*families.values(), up]))


def _labelled(sample: Sample, label: Mapping[str, str]) -> Sample:
    return sample._replace(labels={**sample.labels, **label})


class WorkersExposition:
    """What ``GET /metrics`` answers in a router with several workers: every worker's
    registry, asked over the Unix socket each one serves it on (``sockets``, by worker
    index), merged (:func:`merge`). ``own``: the asking worker's index and registry, read
    without a socket (None in the parent process)."""

    def __init__(self, sockets: Sequence[Path], own: tuple[int, Metrics] | None = None) -> None:
        self._sockets = sockets
        self._own = own

    async def __call__(self) -> bytes:
        bodies = await asyncio.gather(*(self._ask(i, path) for i, path in enumerate(self._sockets)))
        return merge(dict(enumerate(bodies)))

    async def _ask(self, index: int, path: Path) -> bytes | None:
        if self._own is not None and self._own[0] == index:
            return self._own[1].exposition()
        try:
            async with (
                asyncio.timeout(WORKER_SCRAPE_SECONDS),
                aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=str(path))) as http,
                http.get("http://worker/metrics") as response,
            ):
                response.raise_for_status()
                return await response.read()
        except (OSError, aiohttp.ClientError, TimeoutError) as exc:
            logger.warning(
                "metrics: worker %d did not answer (%s); its series are missing from this scrape",
                index,
                str(exc) or type(exc).__name__,
            )
            return None
