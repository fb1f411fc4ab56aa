"""The router's configuration: TOML validated by pydantic.

A bad file fails at start with one :class:`~router.protocol.errors.ConfigError` line in
the operator's words that names every problem found, each by its table and key, tables of
an array counted from 1: ``router.toml: backends (the 2nd [[backends]] table): unknown key
'wieght' (did you mean 'weight'?)``. Unknown keys are errors too, so a typo never silently falls back to a
default, and values are not coerced: TOML has types, so ``timeout_ms = "500"`` or
``weight = true`` is a mistake, not a number. The custom checks below word their own
messages, naming their keys; :func:`explain` words pydantic's.
"""

from __future__ import annotations

import difflib
import json
import tomllib
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Final, Literal, Self
from urllib.parse import SplitResult, urlsplit

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import ErrorDetails

from router.core import defaults
from router.core.locate import UnknownPolicy
from router.core.reconnect import GRACE_IN_RECONNECTS
from router.core.split_brain import SplitBrainPolicy
from router.protocol import acp
from router.protocol.acp import ProbeResult
from router.protocol.errors import ConfigError
from router.protocol.jsonrpc import DEFAULT_MAX_MESSAGE_BYTES
from router.server.loops import EventLoop, default_event_loop, uvloop_installed


class _Section(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True, allow_inf_nan=False)


def _split_listen(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not (port.isascii() and port.isdigit()) or int(port) > 65535:
        raise ValueError(f"expected HOST:PORT, got {value!r}")
    return host.strip("[]"), int(port)


def _check_host_port(value: str | None, info: ValidationInfo) -> None:
    if value is None:
        return
    try:
        _split_listen(value)
    except ValueError:
        raise ValueError(
            f"'{info.field_name}' must be HOST:PORT (such as 127.0.0.1:8765), not {shown(value)}"
        ) from None


def _has_valid_port(url: SplitResult) -> bool:
    try:
        _ = url.port  # ValueError unless absent or 0..65535
    except ValueError:
        return False
    return True


def _is_origin(value: str) -> bool:
    parts = urlsplit(value)
    return (
        parts.scheme in ("http", "https")
        and bool(parts.hostname)
        and _has_valid_port(parts)
        and parts.path == ""
        and not (parts.query or parts.fragment or parts.username)
    )


def _check_pair(cert: str | None, key: str | None) -> None:
    if (cert is None) != (key is None):
        given, missing = ("tls_cert", "tls_key") if key is None else ("tls_key", "tls_cert")
        raise ValueError(f"'{given}' needs '{missing}' too: a certificate goes with its key")


class RouterSection(_Section):
    listen: str = "127.0.0.1:8765"
    #: worker processes sharing the listening port (SO_REUSEPORT), each one replica with
    #: its own backend links and limits (docs/operations.md: Workers); 1 runs no extra process
    workers: Annotated[int, Field(gt=0, le=256)] = 1
    #: what to do when no backend says active and some backend did not answer
    unknown_policy: Literal["fail_closed", "place_anyway"] = "fail_closed"
    #: what to do with the stale copies of a session active on two backends: close them
    #: (its home chosen as router.core.split_brain says), or only report them
    split_brain: Literal["close_stale", "report"] = "close_stale"
    max_connections: Annotated[int, Field(gt=0)] = 10_000
    max_message_bytes: Annotated[int, Field(gt=0)] = DEFAULT_MAX_MESSAGE_BYTES
    max_sessions_per_connection: Annotated[int, Field(gt=0)] = defaults.MAX_SESSIONS_PER_CONNECTION
    max_in_flight_per_connection: Annotated[int, Field(gt=0)] = (
        defaults.MAX_IN_FLIGHT_PER_CONNECTION
    )
    #: a longer params.sessionId is -32602 to that client: it never reaches a probe
    max_session_id_chars: Annotated[int, Field(gt=0)] = defaults.MAX_SESSION_ID_CHARS
    #: on SIGTERM: refuse new clients and fail /readyz for this long before closing the
    #: connected ones (1012, "reconnect elsewhere"); give load balancers time to notice
    drain_seconds: Annotated[float, Field(ge=0)] = 0.0
    #: then close the connected clients (1012) one by one, evenly over this window, so
    #: they do not all reconnect to the other replicas at once (0: all at once)
    close_spread_seconds: Annotated[float, Field(ge=0)] = 0.0
    #: aiohttp's per-request access log (one INFO line per HTTP request, scrapes included)
    access_log: bool = False
    #: accept permessage-deflate from clients that offer it: less bandwidth to remote
    #: editors, more router CPU per frame and ~100 KiB more memory per connection (a zlib
    #: compressor and decompressor each: 117 vs 13 KiB RSS per idle connection, measured
    #: with bench/memory.py); off by default, since ACP frames are small JSON and editors
    #: usually sit near the router (links to backends are never compressed)
    compression: bool = False
    #: the event loop: "uvloop" (the default where it is installed, as it is with the
    #: package on Linux and macOS) or "asyncio" (the standard library's; the default
    #: elsewhere); BENCHMARKS.md says what each costs
    event_loop: EventLoop = Field(default_factory=default_event_loop)
    #: how long opening any link to a backend (connect, upgrade, initialize) may take
    connect_timeout_ms: Annotated[int, Field(gt=0)] = 5000
    #: a TCP connection must send its whole HTTP request (GET /acp's line and headers)
    #: within this, from the moment it is accepted (else HTTP 408 and closed); an idle
    #: keep-alive connection is closed after it too
    handshake_timeout_ms: Annotated[int, Field(gt=0)] = 10_000
    #: an upgraded client must send initialize within this (else close 1008)
    initialize_timeout_ms: Annotated[int, Field(gt=0)] = 10_000
    #: PEM files: with both set the front door is wss:// (TLS), else ws://
    tls_cert: str | None = None
    tls_key: str | None = None
    #: serve /metrics on this HOST:PORT instead of the front door's
    metrics_listen: str | None = None
    #: browser origins that may open the front door ("https://app.example"); a request
    #: with any other Origin header gets 403; requests without one (not browsers) pass
    allowed_origins: list[str] = []
    #: connections open at once from one client address: TCP connections from accept on
    #: (handshakes, WebSockets, keep-alive HTTP), and, without [auth], client connections
    #: (WebSocket and Streamable HTTP; more get HTTP 429)
    max_connections_per_address: Annotated[int, Field(gt=0)] = 1000
    #: with [auth]: client connections (WebSocket and Streamable HTTP) open at once under
    #: one token, from any address (more get HTTP 429); the address no longer counts them
    max_connections_per_principal: Annotated[int, Field(gt=0)] = 1000
    #: session/new and session/fork per minute, from one address and in all (-32014)
    new_sessions_per_minute_per_address: Annotated[int, Field(gt=0)] = 600
    new_sessions_per_minute: Annotated[int, Field(gt=0)] = 60_000
    #: hand clients session ids that say where the session lives (``<id>@<home>.<check>``):
    #: any replica, a fresh one too, then asks that backend first (docs/routing.md: Hinted ids)
    hinted_ids: bool = False
    #: a prompt turn left running by a client connection that is gone (closed, lost, or
    #: closed by the router stopping) is cancelled on its backend (session/cancel),
    #: unless another client connection of this router has the session attached there
    cancel_abandoned_turns: bool = defaults.CANCEL_ABANDONED_TURNS
    #: session/resume, load and close of sessions not attached on the connection,
    #: session/status and session/list pages (each may ask every backend) per minute, per
    #: client connection and per address (-32014); what goes to where a session is
    #: attached costs nothing
    locates_per_minute_per_connection: Annotated[int, Field(gt=0)] = 600
    locates_per_minute_per_address: Annotated[int, Field(gt=0)] = 6000
    #: with [auth], the budget of one token's connections in place of their address's
    locates_per_minute_per_principal: Annotated[int, Field(gt=0)] = 6000
    #: Streamable HTTP: an event stream with nothing to say this long gets ": keepalive"
    http_keepalive_seconds: Annotated[float, Field(gt=0)] = 15.0
    #: Streamable HTTP: a connection with no event stream open and no POST for this long
    #: ends (as if DELETEd)
    http_idle_seconds: Annotated[float, Field(gt=0)] = 300.0
    #: Streamable HTTP: frames held for one event stream the client has not opened yet;
    #: one more ends the connection (the client is not reading)
    http_held_frames: Annotated[int, Field(gt=0)] = 4096
    #: bytes held at once over every connection: POST bodies being read and frames held
    #: for event streams not open yet; a POST past it is answered 503 with Retry-After,
    #: a frame past it ends its connection as an overflow (docs/security.md: Limits)
    max_held_bytes: Annotated[int, Field(gt=0)] = 256 * 1024 * 1024
    #: W3C trace context (docs/operations.md: Trace context): "continue" the trace a
    #: client request names in params._meta.traceparent (one span per such request, its
    #: child traceparent passed to the backend); "always" start one for every request
    #: that names none too; "off": frames go as they came, and no request is traced
    tracing: Literal["off", "continue", "always"] = "continue"
    #: one line per client request on the acp_router.requests logger (docs/operations.md:
    #: Request log): "on", "off", or the fraction of requests to log (above 0, at most 1)
    request_log: Literal["off", "on"] | float = "off"

    @field_validator("request_log", mode="before")
    @classmethod
    def _request_log(cls, value: object) -> object:
        if value in ("off", "on"):
            return value
        if isinstance(value, float | int) and not isinstance(value, bool) and 0 < value <= 1:
            return value
        raise ValueError(
            '\'request_log\' must be "on", "off" or the fraction of requests to log'
            f" (above 0, at most 1, such as 0.1), not {shown(value)}"
        )

    @property
    def request_log_fraction(self) -> float:
        """The share of client requests the request log writes (0: off)."""
        if isinstance(self.request_log, str):
            return 1.0 if self.request_log == "on" else 0.0
        return float(self.request_log)

    @field_validator("listen", "metrics_listen")
    @classmethod
    def _listen(cls, value: str | None, info: ValidationInfo) -> str | None:
        _check_host_port(value, info)
        return value

    @field_validator("allowed_origins")
    @classmethod
    def _origins(cls, origins: list[str]) -> list[str]:
        for number, origin in enumerate(origins, 1):
            if origin != "*" and not _is_origin(origin):
                raise ValueError(
                    f"the {ordinal(number)} item of 'allowed_origins' must be an origin"
                    f' (scheme://host[:port], such as https://editor.example) or "*",'
                    f" not {shown(origin)}"
                )
        return origins

    @field_validator("event_loop")
    @classmethod
    def _event_loop(cls, event_loop: str) -> str:
        if event_loop == "uvloop" and not uvloop_installed():
            raise ValueError(
                """'event_loop' is "uvloop", but uvloop is not installed"""
                """ (pip install 'acp-router[uvloop]', or set it to "asyncio")"""
            )
        return event_loop

    @model_validator(mode="after")
    def _tls_pair(self) -> Self:
        _check_pair(self.tls_cert, self.tls_key)
        return self

    @model_validator(mode="after")
    def _one_body_fits(self) -> Self:
        if self.max_held_bytes < self.max_message_bytes:
            raise ValueError(
                f"'max_held_bytes' ({self.max_held_bytes}) must be at least"
                f" 'max_message_bytes' ({self.max_message_bytes}): one whole frame must fit"
            )
        return self

    @property
    def address(self) -> tuple[str, int]:
        return _split_listen(self.listen)

    @property
    def metrics_address(self) -> tuple[str, int] | None:
        return None if self.metrics_listen is None else _split_listen(self.metrics_listen)

    @property
    def policy(self) -> UnknownPolicy:
        return UnknownPolicy(self.unknown_policy)

    @property
    def split_brain_policy(self) -> SplitBrainPolicy:
        return SplitBrainPolicy(self.split_brain)


class BackendSection(_Section):
    id: Annotated[str, Field(min_length=1)]
    url: str
    weight: Annotated[float, Field(gt=0)] = 1.0
    #: wss:// only: PEM bundle of the CAs to trust for this backend (default: the system's)
    tls_ca: str | None = None
    #: wss:// only: a client certificate and its key, for backends that ask for one
    tls_cert: str | None = None
    tls_key: str | None = None

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        parts = urlsplit(value)
        if parts.scheme not in ("ws", "wss") or not parts.hostname or not _has_valid_port(parts):
            raise ValueError(
                "'url' must be a ws:// or wss:// URL (such as ws://agent-1:9001/acp),"
                f" not {shown(value)}"
            )
        return value

    @model_validator(mode="after")
    def _tls(self) -> Self:
        uses_tls = any(v is not None for v in (self.tls_ca, self.tls_cert, self.tls_key))
        if uses_tls and not self.url.startswith("wss://"):
            raise ValueError(
                f"'tls_ca', 'tls_cert' and 'tls_key' are for a wss:// 'url', not {shown(self.url)}"
            )
        _check_pair(self.tls_cert, self.tls_key)
        return self


class DiscoverySection(_Section):
    """Backends found in DNS (docs/configuration.md: DNS discovery): the A records of ``dns``, each
    named by its reverse (PTR) name, re-resolved every ``interval_seconds``."""

    #: the name to resolve, e.g. a Kubernetes headless Service
    dns: Annotated[str, Field(min_length=1)]
    port: Annotated[int, Field(gt=0, le=65535)]
    path: str = "/acp"
    scheme: Literal["ws", "wss"] = "ws"
    weight: Annotated[float, Field(gt=0)] = 1.0
    interval_seconds: Annotated[float, Field(gt=0)] = 10.0
    #: how long one lookup may take; a failed lookup keeps the last answer
    timeout_ms: Annotated[int, Field(gt=0)] = 2000
    #: HOST:PORT of the DNS server to ask; default: the system's (/etc/resolv.conf)
    nameserver: str | None = None

    @field_validator("path")
    @classmethod
    def _path(cls, value: str) -> str:
        if not value.startswith("/"):
            raise ValueError(f"'path' must start with / (such as /acp), not {shown(value)}")
        return value

    @field_validator("nameserver")
    @classmethod
    def _nameserver(cls, value: str | None, info: ValidationInfo) -> str | None:
        _check_host_port(value, info)
        return value

    @property
    def nameserver_address(self) -> tuple[str, int] | None:
        return None if self.nameserver is None else _split_listen(self.nameserver)


StatusMeaning = Literal["active", "inactive", "not_found"]


class ProbeSection(_Section):
    timeout_ms: Annotated[int, Field(gt=0)] = 500
    #: how long one backend's page of session/list may take (it may read a store); one
    #: that takes longer is left out of the page and named in _meta.unlistedBackends
    list_timeout_ms: Annotated[int, Field(gt=0)] = 5000
    #: what ``session/status`` values mean, added to (or overriding) the defaults: the RFD's
    #: active/inactive, the ACP schema's and TypeScript SDK's open/saved, the first draft's
    #: live/not_found. Any value in neither table counts as inactive (the RFD's rule).
    status_aliases: dict[str, StatusMeaning] = {}

    @property
    def aliases(self) -> Mapping[str, ProbeResult]:
        extra = {word: ProbeResult(meaning) for word, meaning in self.status_aliases.items()}
        return {**acp.DEFAULT_STATUS_ALIASES, **extra}


#: the default ``control.reconnect_max_ms``; a grace set alone that is shorter than three
#: times it lowers it to a third of the grace (:class:`ControlSection`)
RECONNECT_MAX_MS: Final = 5000


class ControlSection(_Section):
    """The persistent, initialized connection the router keeps to each backend.

    The grace alone is enough: without ``reconnect_max_ms`` the backoff's cap follows it
    (:data:`RECONNECT_MAX_MS`, or a third of the grace when that is less), so a file that
    sets only ``down_grace_ms`` is never refused over a default it did not choose. A file
    that sets both so that the grace is shorter than three caps is refused, naming both.
    """

    reconnect_initial_ms: Annotated[int, Field(gt=0)] = 100
    #: the backoff's cap; a link that is down also never waits longer than
    #: down_grace_ms / 10 (:mod:`router.core.reconnect`). Not set: RECONNECT_MAX_MS, or
    #: down_grace_ms / 3 when that is less
    reconnect_max_ms: Annotated[int, Field(gt=0)] = RECONNECT_MAX_MS
    heartbeat_seconds: Annotated[float, Field(gt=0)] = 10.0
    #: how long a backend no link of any kind has reached still counts as maybe holding
    #: its sessions ("unknown": resumes that need it fail closed) before it counts as
    #: gone; a new process ends it at once. At least 3 x reconnect_max_ms.
    down_grace_ms: Annotated[int, Field(ge=0)] = 30_000

    @model_validator(mode="before")
    @classmethod
    def _cap_follows_the_grace(cls, data: object) -> object:
        if not isinstance(data, dict) or "reconnect_max_ms" in data:
            return data
        grace = data.get("down_grace_ms")
        if type(grace) is not int or grace < GRACE_IN_RECONNECTS:
            return data  # absent (the defaults agree), or the checks below say what is wrong
        return {**data, "reconnect_max_ms": min(RECONNECT_MAX_MS, grace // GRACE_IN_RECONNECTS)}

    @model_validator(mode="after")
    def _grace_spans_reconnects(self) -> Self:
        least = GRACE_IN_RECONNECTS * self.reconnect_max_ms
        if self.down_grace_ms >= least:
            return self
        why = (
            "a backend is given up only once its link has tried it throughout the grace,"
            " and a shorter one gives up a backend that is merely restarting"
        )
        if "reconnect_max_ms" not in self.model_fields_set:  # a grace too short for any cap
            raise ValueError(
                f"'down_grace_ms' ({self.down_grace_ms}) must be at least"
                f" {GRACE_IN_RECONNECTS}: {why}"
            )
        given = "down_grace_ms" in self.model_fields_set
        raise ValueError(
            f"'down_grace_ms' ({self.down_grace_ms}{'' if given else ', its default'}) must be"
            f" at least {GRACE_IN_RECONNECTS} x 'reconnect_max_ms' ({self.reconnect_max_ms}),"
            f" {least}: {why}"
            + (" (without 'reconnect_max_ms', the cap follows the grace)" if given else "")
        )


class PlacementSection(_Section):
    """Where new sessions go (:class:`router.core.placement.Spread`)."""

    #: half-life of the count of sessions this replica placed on each backend: placements
    #: keep weighing on a backend's load after their clients leave, fading with this
    decay_seconds: Annotated[float, Field(gt=0)] = defaults.PLACEMENT_DECAY_SECONDS


class CacheSection(_Section):
    """Location hints (session → backend); a hint is probed before it is trusted."""

    ttl_seconds: Annotated[float, Field(gt=0)] = defaults.CACHE_TTL_SECONDS
    max_entries: Annotated[int, Field(gt=0)] = defaults.CACHE_MAX_ENTRIES
    #: how long a hint to a backend without session/status lives: it cannot be probed, so
    #: the hint is the router's only memory of where the session is
    remember_seconds: Annotated[float, Field(gt=0)] = defaults.CACHE_REMEMBER_SECONDS
    #: a hint that says active is trusted alone for this long after a fan-out over the
    #: whole pool confirmed it; then the next locate asks everyone (split brain is seen)
    verify_seconds: Annotated[float, Field(ge=0)] = 5.0
    #: how long the answer "not found there" (a probe's -32002, or a resume's) is
    #: remembered: a repeated resume of an unknown id costs no probe meanwhile; a session
    #: created later directly on an agent under that id is found once it expires
    negative_seconds: Annotated[float, Field(ge=0)] = defaults.CACHE_NEGATIVE_SECONDS
    #: the split-brain audit's budget besides one probe per trusted resume (docs/routing.md: Split
    #: brain is seen, not hidden): how many probes a second it may spend
    audit_probes_per_second: Annotated[float, Field(gt=0)] = 100.0


class FailoverSection(_Section):
    """Failover (docs/routing.md: Failover): when a client's link to a backend is lost, its
    sessions there wait (their frames held) until that backend is known to be back or
    gone, and are then resumed where they live: the same backend, or, when it lost them,
    the one that knows them (a shared store)."""

    #: on by default: a crashed or partitioned agent's sessions go on where they live now
    #: (fencing and the split-brain rule keep a returning backend from running a second copy)
    enabled: bool = defaults.FAILOVER_ENABLED
    #: how long a session waits for its backend to be known back or gone; past it, its
    #: frames go on as for a session not attached (the client resumes it itself)
    wait_ms: Annotated[int, Field(gt=0)] = 60_000


class TokenSection(_Section):
    """Bearer tokens from any of three sources, together: inline, a file (one token a
    line, ``#`` comments; re-read on reload) or an environment variable (tokens
    separated by commas or whitespace)."""

    tokens: Annotated[list[Annotated[str, Field(min_length=1)]], Field(repr=False)] = []
    tokens_file: str | None = None
    token_env: Annotated[str, Field(min_length=1)] | None = None

    @model_validator(mode="after")
    def _has_a_source(self) -> Self:
        if not self.tokens and self.tokens_file is None and self.token_env is None:
            raise ValueError("give at least one of 'tokens', 'tokens_file' and 'token_env'")
        return self


class AuthSection(TokenSection):
    """Client authentication; with no ``[auth]`` section the front door is open."""

    #: a session is usable only under the token it was created with (docs/security.md)
    bind_sessions: bool = False
    #: the key of the session-id MAC; every replica needs the same one
    session_secret: Annotated[str | None, Field(min_length=16, repr=False)] = None
    session_secret_file: str | None = None
    session_secret_env: Annotated[str, Field(min_length=1)] | None = None

    @model_validator(mode="after")
    def _sources(self) -> Self:
        secrets = [self.session_secret, self.session_secret_file, self.session_secret_env]
        given = sum(s is not None for s in secrets)
        if given > 1:
            raise ValueError(
                "give only one of 'session_secret', 'session_secret_file' and 'session_secret_env'"
            )
        if self.bind_sessions and not given:
            raise ValueError(
                "'bind_sessions' needs 'session_secret', 'session_secret_file' or"
                " 'session_secret_env'"
            )
        return self


class AdminSection(TokenSection):
    """The operator's API under ``/admin/`` (docs/operations.md: Admin), with tokens of its own;
    with no ``[admin]`` section it does not exist (404)."""


class Settings(_Section):
    router: RouterSection = RouterSection()
    #: before ``backends``: their check reads it
    discovery: list[DiscoverySection] = []
    backends: Annotated[list[BackendSection], Field(validate_default=True)] = []
    probe: ProbeSection = ProbeSection()
    control: ControlSection = ControlSection()
    cache: CacheSection = CacheSection()
    placement: PlacementSection = PlacementSection()
    failover: FailoverSection = FailoverSection()
    auth: AuthSection | None = None
    admin: AdminSection | None = None

    @field_validator("backends")
    @classmethod
    def _unique_ids(
        cls, backends: list[BackendSection], info: ValidationInfo
    ) -> list[BackendSection]:
        # no "discovery" in info.data: its tables were refused, and the error says why
        if not backends and info.data.get("discovery", [None]) == []:
            raise ValueError("give at least one [[backends]] table (or a [[discovery]] table)")
        ids = [backend.id for backend in backends]
        duplicates = sorted({i for i in ids if ids.count(i) > 1})
        if duplicates:
            repeated = ", ".join(shown(i).removeprefix("the string ") for i in duplicates)
            raise ValueError(f"each [[backends]] table needs a unique 'id'; repeated: {repeated}")
        return backends


def load_settings(path: str | Path) -> Settings:
    """Read and validate a TOML file; raises ConfigError naming the bad key."""
    try:
        with open(path, "rb") as file:
            data = tomllib.load(file)
    except OSError as exc:
        raise ConfigError(f"cannot read config {path}: {exc.strerror or exc}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"config {path} is not valid TOML: {exc}") from None
    return settings_from(data, source=str(path))


def settings_from(data: dict[str, object], *, source: str = "config") -> Settings:
    """Validate parsed TOML; raises ConfigError, one line in plain words naming every
    problem found (``source: 3 problems: ...; ...; ...`` when there are several)."""
    try:
        return Settings.model_validate(data)
    except ValidationError as exc:
        problems = explain_all(exc.errors(), data)
    said = "; ".join(problems)
    if len(problems) > 1:
        said = f"{len(problems)} problems: {said}"
    raise ConfigError(f"{source}: {said}")


# -- errors in the operator's words --------------------------------------------------------------

Location = Sequence[int | str]

#: what a value of the wrong type should have been, by pydantic error type
_EXPECTED = {
    "int_type": "an integer",
    "float_type": "a number",
    "string_type": "a string",
    "bool_type": "true or false",
    "list_type": "an array",
    "dict_type": "a table",
    "model_type": "a table",
    "finite_number": "a finite number",
}
_BOUNDS = {
    "greater_than": ("gt", "greater than"),
    "greater_than_equal": ("ge", "at least"),
    "less_than": ("lt", "less than"),
    "less_than_equal": ("le", "at most"),
}


def explain(error: ErrorDetails) -> str:
    """One validation error as one line: the table it is in (``router``, ``backends (the
    2nd [[backends]] table)``), then what is wrong, naming the key."""
    kind, loc = error["type"], tuple(error["loc"])
    if kind != "model_type" and _table_at(loc) is not None:  # about a whole table
        table, key, index = loc, None, None
    elif loc and isinstance(loc[-1], int) and len(loc) > 1:  # an item of an array
        table, key, index = loc[:-2], str(loc[-2]), loc[-1]
    else:
        table, key, index = loc[:-1], (str(loc[-1]) if loc else None), None
    where = _where(table)
    what = _what(error, table, key, index)
    return f"{where}: {what}" if where else what


def _what(error: ErrorDetails, table: Location, key: str | None, index: int | None) -> str:
    kind, value = error["type"], error["input"]
    context = error.get("ctx") or {}
    subject = "the table" if key is None else f"'{key}'"
    if index is not None:
        subject = f"the {ordinal(index + 1)} item of {subject}"
    section = _table_at(table)
    field = None if section is None or key is None else section.model_fields.get(key)
    secret = field is not None and field.repr is False
    seen = "" if secret else f", not {shown(value)}"
    if kind == "extra_forbidden":
        return _unknown(key or "", value, table)
    if kind == "missing":
        return f"missing key {subject}"
    if kind == "value_error":  # our own checks word their messages, naming their keys
        return error["msg"].removeprefix("Value error, ")
    if kind == "list_type" and _table_at((*table, str(key), 0)) is not None:
        return f"{subject} must be [[{_dotted(table, key)}]] tables{seen}"
    if kind in _EXPECTED:
        return f"{subject} must be {_EXPECTED[kind]}{seen}"
    if kind == "literal_error":
        expected = str(context.get("expected", "")).replace("'", '"')
        return f"{subject} must be {expected}{seen}"
    if kind in _BOUNDS:
        name, words = _BOUNDS[kind]
        return f"{subject} must be {words} {_number(context.get(name))}{seen}"
    if kind in ("string_too_short", "string_too_long") and isinstance(value, str):
        if kind == "string_too_short" and context.get("min_length") == 1:
            return f"{subject} must not be empty"
        bound, words = (
            ("min_length", "at least") if kind == "string_too_short" else ("max_length", "at most")
        )
        return (
            f"{subject} must be {words} {context.get(bound)} characters long (it has {len(value)})"
        )
    return f"{subject}: {error['msg']}"


def explain_all(errors: Sequence[ErrorDetails], data: Mapping[str, object]) -> list[str]:
    """Every validation error as one line (:func:`explain`), in the file's order, each said
    once. An unknown key that is a near miss of a key the table lacks (``ulr`` for
    ``url``, ``[[backend]]`` for ``[[backends]]``) explains what is said about the lacking
    key ("missing key 'url'"), so that is left out: its "did you mean" says it."""
    near_misses = {
        (tuple(error["loc"][:-1]), meant)
        for error in errors
        if error["type"] == "extra_forbidden"
        and (meant := _near_miss(error["loc"], error["input"])) is not None
    }
    kept = [
        error
        for error in errors
        if not (
            (tuple(error["loc"][:-1]), error["loc"][-1] if error["loc"] else None) in near_misses
            and not _given(data, error["loc"])
        )
    ]
    return list(dict.fromkeys(explain(error) for error in kept))


def _given(data: Mapping[str, object], loc: Location) -> bool:
    """Whether the file has a value at ``loc`` (keys, and indices into arrays)."""
    found: object = data
    for part in loc:
        in_array = isinstance(part, int) and isinstance(found, list) and part < len(found)
        in_table = isinstance(part, str) and isinstance(found, Mapping) and part in found
        if not (in_array or in_table):
            return False
        found = found[part]  # type: ignore[index]
    return True


def _near_miss(loc: Location, value: object) -> str | None:
    """The known key an unknown one at ``loc`` is most likely a misspelling of."""
    if not loc:
        return None
    table, key = loc[:-1], str(loc[-1])
    if not table:  # the top level: only a table there can be a misspelled table
        if not _is_table(value):
            return None
        names = list(Settings.model_fields)
    else:
        section = _table_at(table)
        names = list(section.model_fields) if section is not None else []
    close = difflib.get_close_matches(key, names, n=1)
    return close[0] if close else None


def _is_table(value: object) -> bool:
    """A TOML table, or an array of tables (``[[name]]``)."""
    return isinstance(value, dict) or (
        isinstance(value, list) and bool(value) and all(isinstance(v, dict) for v in value)
    )


def _table_name(name: str, value: object = None) -> str:
    """``[name]``, or ``[[name]]`` for an array of tables (a field of the settings that
    holds one, or a value that is one)."""
    field = Settings.model_fields.get(name)
    found = None if field is None else _section_in(field.annotation)
    arrays = isinstance(value, list) if found is None else found[1]
    return f"[[{name}]]" if arrays else f"[{name}]"


def _unknown(key: str, value: object, table: Location) -> str:
    meant = _near_miss((*table, key), value)
    if not table and _is_table(value):
        return f"unknown table {_table_name(key, value)}" + (
            f" (did you mean {_table_name(meant)}?)" if meant else ""
        )
    said = f"unknown key '{key}'"
    if not table:  # a key above every table: say which tables have it
        homes = [_table_name(name) for name, home in _sections() if key in home.model_fields]
        return f"{said} at the top level" + (f" (it goes in {' or '.join(homes)})" if homes else "")
    return said + (f" (did you mean '{meant}'?)" if meant else "")


def _sections() -> list[tuple[str, type[BaseModel]]]:
    """The top-level tables, by name, with their section models."""
    found = ((name, _section_in(field.annotation)) for name, field in Settings.model_fields.items())
    return [(name, section[0]) for name, section in found if section is not None]


def _where(table: Location) -> str:
    """A table's path in words: ``probe.status_aliases``, ``backends (the 2nd [[backends]]
    table)``; the top level is ``""``."""
    parts: list[str] = []
    names: list[str] = []
    for part in table:
        if isinstance(part, int) and parts:
            parts[-1] += f" (the {ordinal(part + 1)} [[{'.'.join(names)}]] table)"
        else:
            parts.append(str(part))
            names.append(str(part))
    return ".".join(parts)


def _dotted(table: Location, key: str | None) -> str:
    return ".".join([*(str(p) for p in table if isinstance(p, str)), str(key)])


def _table_at(path: Location) -> type[BaseModel] | None:
    """The section model of the table at ``path`` (names, with an index after an array of
    tables), or None when ``path`` is not a table."""
    section: type[BaseModel] = Settings
    needs_index = False
    for part in path:
        if needs_index != isinstance(part, int):
            return None
        if isinstance(part, int):
            needs_index = False
            continue
        field = section.model_fields.get(part)
        found = None if field is None else _section_in(field.annotation)
        if found is None:
            return None
        section, needs_index = found
    return None if needs_index else section


def _section_in(annotation: object) -> tuple[type[BaseModel], bool] | None:
    """The section model a field holds, and whether in an array (``list[BackendSection]``)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation, False
    for argument in typing.get_args(annotation):
        found = _section_in(argument)
        if found is not None:
            return found[0], found[1] or typing.get_origin(annotation) is list
    return None


def ordinal(number: int) -> str:
    """1st, 2nd, 3rd, 4th, ... 11th, 12th, 13th, ... 21st."""
    suffix = (
        "th" if 10 <= number % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(number % 10, "th")
    )
    return f"{number}{suffix}"


def shown(value: object) -> str:
    """A value as TOML writes it (shortened), for a message; tables and arrays by kind."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        text = json.dumps(value, ensure_ascii=False)
        return "the string " + (text if len(text) <= 60 else text[:56] + '…"')
    if isinstance(value, int | float):
        return _number(value)
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, list):
        return "an array"
    return f"a {type(value).__name__}"  # TOML dates and times


def _number(value: object) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)
