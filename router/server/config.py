"""The router's configuration: TOML validated by pydantic.

A bad file fails at start with one :class:`~router.protocol.errors.ConfigError` line that
names the key (``backends.1.url: ...``). Unknown keys are errors too, so a typo
never silently falls back to a default, and values are not coerced: TOML has types,
so ``timeout_ms = "500"`` or ``weight = true`` is a mistake, not a number.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Literal, Self
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

from router.core.locate import UnknownPolicy
from router.protocol import acp
from router.protocol.acp import ProbeResult
from router.protocol.errors import ConfigError
from router.protocol.jsonrpc import DEFAULT_MAX_MESSAGE_BYTES


class _Section(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True, allow_inf_nan=False)


def _split_listen(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not (port.isascii() and port.isdigit()) or int(port) > 65535:
        raise ValueError(f"expected HOST:PORT, got {value!r}")
    return host.strip("[]"), int(port)


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


def _check_pair(cert: str | None, key: str | None, what: str) -> None:
    if (cert is None) != (key is None):
        raise ValueError(f"a {what} certificate needs both tls_cert and tls_key")


class RouterSection(_Section):
    listen: str = "127.0.0.1:8765"
    #: what to do when no backend says active and some backend did not answer
    unknown_policy: Literal["fail_closed", "place_anyway"] = "fail_closed"
    max_connections: Annotated[int, Field(gt=0)] = 10_000
    max_message_bytes: Annotated[int, Field(gt=0)] = DEFAULT_MAX_MESSAGE_BYTES
    max_sessions_per_connection: Annotated[int, Field(gt=0)] = 1024
    max_in_flight_per_connection: Annotated[int, Field(gt=0)] = 1024
    #: a longer params.sessionId is -32602 to that client: it never reaches a probe
    max_session_id_chars: Annotated[int, Field(gt=0)] = 1024
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
    #: compressor and decompressor each: 145 vs 41 KiB RSS per idle connection, measured
    #: with bench/memory.py); off by default, since ACP frames are small JSON and editors
    #: usually sit near the router (links to backends are never compressed)
    compression: bool = False
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
    #: TCP connections open at once from one client address, from accept on (handshakes,
    #: WebSockets, keep-alive HTTP; more get HTTP 429)
    max_connections_per_address: Annotated[int, Field(gt=0)] = 1000
    #: session/new and session/fork per minute, from one address and in all (-32014)
    new_sessions_per_minute_per_address: Annotated[int, Field(gt=0)] = 600
    new_sessions_per_minute: Annotated[int, Field(gt=0)] = 60_000

    @field_validator("listen", "metrics_listen")
    @classmethod
    def _listen(cls, value: str | None) -> str | None:
        if value is not None:
            _split_listen(value)
        return value

    @field_validator("allowed_origins")
    @classmethod
    def _origins(cls, origins: list[str]) -> list[str]:
        for origin in origins:
            if origin != "*" and not _is_origin(origin):
                raise ValueError(f"expected scheme://host[:port] or *, got {origin!r}")
        return origins

    @model_validator(mode="after")
    def _tls_pair(self) -> Self:
        _check_pair(self.tls_cert, self.tls_key, "router")
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
            raise ValueError(f"expected a ws:// or wss:// URL, got {value!r}")
        return value

    @model_validator(mode="after")
    def _tls(self) -> Self:
        uses_tls = any(v is not None for v in (self.tls_ca, self.tls_cert, self.tls_key))
        if uses_tls and not self.url.startswith("wss://"):
            raise ValueError("tls_ca, tls_cert and tls_key need a wss:// url")
        _check_pair(self.tls_cert, self.tls_key, "backend")
        return self


class DiscoverySection(_Section):
    """Backends found in DNS (README: DNS discovery): the A records of ``dns``, each
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
            raise ValueError(f"expected a path starting with /, got {value!r}")
        return value

    @field_validator("nameserver")
    @classmethod
    def _nameserver(cls, value: str | None) -> str | None:
        if value is not None:
            _split_listen(value)
        return value

    @property
    def nameserver_address(self) -> tuple[str, int] | None:
        return None if self.nameserver is None else _split_listen(self.nameserver)


StatusMeaning = Literal["active", "inactive", "not_found"]


class ProbeSection(_Section):
    timeout_ms: Annotated[int, Field(gt=0)] = 500
    #: what ``session/status`` values mean, added to (or overriding) the defaults: the RFD's
    #: active/inactive, the ACP schema's and TypeScript SDK's open/saved, the first draft's
    #: live/not_found. Any value in neither table counts as inactive (the RFD's rule).
    status_aliases: dict[str, StatusMeaning] = {}

    @property
    def aliases(self) -> Mapping[str, ProbeResult]:
        extra = {word: ProbeResult(meaning) for word, meaning in self.status_aliases.items()}
        return {**acp.DEFAULT_STATUS_ALIASES, **extra}


class ControlSection(_Section):
    """The persistent, initialized connection the router keeps to each backend."""

    reconnect_initial_ms: Annotated[int, Field(gt=0)] = 100
    reconnect_max_ms: Annotated[int, Field(gt=0)] = 5000
    heartbeat_seconds: Annotated[float, Field(gt=0)] = 10.0
    #: how long a backend whose link is down still counts as maybe holding its sessions
    #: ("unknown": resumes that need it fail closed) before it counts as gone; a refused
    #: reconnect or a new process ends it at once
    down_grace_ms: Annotated[int, Field(ge=0)] = 30_000


class PlacementSection(_Section):
    """Where new sessions go (:class:`router.core.placement.Spread`)."""

    #: half-life of the count of sessions this replica placed on each backend: placements
    #: keep weighing on a backend's load after their clients leave, fading with this
    decay_seconds: Annotated[float, Field(gt=0)] = 300.0


class CacheSection(_Section):
    """Location hints (session → backend); a hint is probed before it is trusted."""

    ttl_seconds: Annotated[float, Field(gt=0)] = 30.0
    max_entries: Annotated[int, Field(gt=0)] = 100_000
    #: how long a hint to a backend without session/status lives: it cannot be probed, so
    #: the hint is the router's only memory of where the session is
    remember_seconds: Annotated[float, Field(gt=0)] = 86_400.0
    #: a hint that says active is trusted alone for this long after a fan-out over the
    #: whole pool confirmed it; then the next locate asks everyone (split brain is seen)
    verify_seconds: Annotated[float, Field(ge=0)] = 5.0


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
            raise ValueError("give tokens, tokens_file or token_env")
        return self


class AuthSection(TokenSection):
    """Client authentication; with no ``[auth]`` section the front door is open."""

    #: a session is usable only under the token it was created with (README: Security)
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
            raise ValueError("give one of session_secret, session_secret_file, session_secret_env")
        if self.bind_sessions and not given:
            raise ValueError(
                "bind_sessions needs session_secret, session_secret_file or session_secret_env"
            )
        return self


class AdminSection(TokenSection):
    """The operator's API under ``/admin/`` (README: Admin), with tokens of its own;
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
    auth: AuthSection | None = None
    admin: AdminSection | None = None

    @field_validator("backends")
    @classmethod
    def _unique_ids(
        cls, backends: list[BackendSection], info: ValidationInfo
    ) -> list[BackendSection]:
        if not backends and not info.data.get("discovery"):
            raise ValueError("give at least one [[backends]] table (or a [[discovery]] table)")
        ids = [backend.id for backend in backends]
        duplicates = sorted({i for i in ids if ids.count(i) > 1})
        if duplicates:
            raise ValueError(f"backend ids must be unique, repeated: {', '.join(duplicates)}")
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
    try:
        return Settings.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        key = ".".join(str(part) for part in first["loc"]) or "(top level)"
        message = first["msg"].removeprefix("Value error, ")
        raise ConfigError(f"{source}: {key}: {message}") from None
