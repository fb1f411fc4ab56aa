"""The router's configuration: TOML validated by pydantic.

A bad file fails at start with one :class:`~router.protocol.errors.ConfigError` line that
names the key (``backends.1.url: ...``). Unknown keys are errors too, so a typo
never silently falls back to a default, and values are not coerced: TOML has types,
so ``timeout_ms = "500"`` or ``weight = true`` is a mistake, not a number.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Annotated, Literal
from urllib.parse import SplitResult, urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from router.core.locate import UnknownPolicy
from router.protocol.errors import ConfigError


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


class RouterSection(_Section):
    listen: str = "127.0.0.1:8765"
    #: what to do when no backend says active and some backend did not answer
    unknown_policy: Literal["fail_closed", "place_anyway"] = "fail_closed"
    max_connections: Annotated[int, Field(gt=0)] = 10_000
    max_message_bytes: Annotated[int, Field(gt=0)] = 16 * 1024 * 1024
    max_sessions_per_connection: Annotated[int, Field(gt=0)] = 1024
    max_in_flight_per_connection: Annotated[int, Field(gt=0)] = 1024
    #: a longer params.sessionId is -32602 to that client: it never reaches a probe
    max_session_id_chars: Annotated[int, Field(gt=0)] = 1024
    #: on SIGTERM: refuse new clients and fail /readyz for this long before closing the
    #: connected ones (1012, "reconnect elsewhere"); give load balancers time to notice
    drain_seconds: Annotated[float, Field(ge=0)] = 0.0
    #: accept permessage-deflate from clients that offer it: less bandwidth to remote
    #: editors, more router CPU per frame (links to backends are never compressed)
    compression: bool = True
    #: how long opening any link to a backend (connect, upgrade, initialize) may take
    connect_timeout_ms: Annotated[int, Field(gt=0)] = 5000

    @field_validator("listen")
    @classmethod
    def _listen(cls, value: str) -> str:
        _split_listen(value)
        return value

    @property
    def address(self) -> tuple[str, int]:
        return _split_listen(self.listen)

    @property
    def policy(self) -> UnknownPolicy:
        return UnknownPolicy(self.unknown_policy)


class BackendSection(_Section):
    id: Annotated[str, Field(min_length=1)]
    url: str
    weight: Annotated[float, Field(gt=0)] = 1.0

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        parts = urlsplit(value)
        if parts.scheme not in ("ws", "wss") or not parts.hostname or not _has_valid_port(parts):
            raise ValueError(f"expected a ws:// or wss:// URL, got {value!r}")
        return value


class ProbeSection(_Section):
    timeout_ms: Annotated[int, Field(gt=0)] = 500


class ControlSection(_Section):
    """The persistent, initialized connection the router keeps to each backend."""

    reconnect_initial_ms: Annotated[int, Field(gt=0)] = 100
    reconnect_max_ms: Annotated[int, Field(gt=0)] = 5000
    heartbeat_seconds: Annotated[float, Field(gt=0)] = 10.0


class CacheSection(_Section):
    """Location hints (session → backend); a hint is probed before it is trusted."""

    ttl_seconds: Annotated[float, Field(gt=0)] = 30.0
    max_entries: Annotated[int, Field(gt=0)] = 100_000


class Settings(_Section):
    router: RouterSection = RouterSection()
    backends: Annotated[list[BackendSection], Field(min_length=1)]
    probe: ProbeSection = ProbeSection()
    control: ControlSection = ControlSection()
    cache: CacheSection = CacheSection()

    @field_validator("backends")
    @classmethod
    def _unique_ids(cls, backends: list[BackendSection]) -> list[BackendSection]:
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
