"""Reloading the configuration file while the router runs: the one entry point behind
SIGHUP and ``POST /admin/reload``.

A reload reads and checks everything first (the TOML, every key, the TLS files of new
backends, the client tokens) while the running configuration stays in force; only a
file that passes is applied, all at once. What it changes is decided by
:mod:`router.core.membership`; the pool applies it without touching a client
connection: a removed backend gets no new placements, probes or locates, while the
connections that hold links to it keep them until they end.

What can change at run time (:data:`LIVE`): the backends and discovery tables, the
probe settings, ``router.unknown_policy``, the client tokens and the ``[admin]`` tokens.
Anything else that changed is reported as needing a restart and keeps its running value.

A reload that removes a client token closes the connections that came with it (1008,
the ``revoke`` callback) as it applies the new tokens; one that removes an admin token
refuses it from the next request on.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from router.core.frontdoor import Credentials
from router.core.membership import MembershipChange, needs_restart
from router.protocol.errors import ConfigError
from router.server.config import Settings, TokenSection, load_settings
from router.server.door.auth import TokenSource
from router.server.links.tls import backend_context
from router.server.observability.metrics import Metrics
from router.server.pool.backends import Pool
from router.server.pool.discoveries import Discoveries

logger = logging.getLogger(__name__)

#: the keys a reload applies; every other change needs a restart
LIVE = (
    "backends",
    "discovery",
    "probe",
    "router.unknown_policy",
    "auth.tokens",
    "auth.tokens_file",
    "auth.token_env",
    "admin.tokens",
    "admin.tokens_file",
    "admin.token_env",
)


@dataclass(frozen=True, slots=True)
class Reloaded:
    """The new file was applied."""

    change: MembershipChange
    #: keys that changed but need a restart; their running values stay
    restart_required: tuple[str, ...] = ()

    #: what ``POST /admin/reload`` answers with
    http_status = 200

    def as_json(self) -> dict[str, Any]:
        return {
            "outcome": "ok",
            "added": [m.id for m in self.change.added],
            "removed": list(self.change.removed),
            "reweighted": [m.id for m in self.change.reweighted],
            "replaced": [m.id for m in self.change.replaced],
            "restartRequired": list(self.restart_required),
        }


@dataclass(frozen=True, slots=True)
class ReloadRefused:
    """The new file was refused (the reason names the key); nothing changed."""

    reason: str

    #: what ``POST /admin/reload`` answers with: the file is the client's fault
    http_status = 400

    def as_json(self) -> dict[str, Any]:
        return {"outcome": "refused", "reason": self.reason}


ReloadOutcome = Reloaded | ReloadRefused


@dataclass(frozen=True, slots=True)
class _Prepared:
    settings: Settings
    credentials: Credentials | None
    admin_credentials: Credentials | None
    restart_required: tuple[str, ...]


class Reloader:
    """Re-reads ``path`` on :meth:`reload` and applies it to the running router."""

    def __init__(
        self,
        path: Path | None,
        settings: Settings,
        pool: Pool,
        tokens: TokenSource,
        metrics: Metrics,
        discoveries: Discoveries | None = None,
        *,
        admin_tokens: TokenSource | None = None,
        revoke: Callable[[Credentials | None], object] | None = None,
    ) -> None:
        self.path = path
        self._admin_tokens = admin_tokens
        #: told the client tokens in force after each reload (it closes the connections
        #: whose token went)
        self._revoke = revoke
        self._discoveries = discoveries
        #: the configuration in force (the file's, less what needs a restart)
        self.settings = settings
        self._pool = pool
        self._tokens = tokens
        self._metrics = metrics
        self._lock = asyncio.Lock()
        metrics.config_last_reload_success.set(time.time())

    async def reload(self) -> ReloadOutcome:
        """Read the file again and apply it; one reload at a time. Logged and counted
        (``acp_router_config_reloads_total{result}``)."""
        async with self._lock:
            try:
                prepared = await asyncio.to_thread(self._prepare)
            except ConfigError as exc:
                logger.error("config reload refused, the running configuration stays: %s", exc)
                self._metrics.config_reloads.labels("refused").inc()
                return ReloadRefused(str(exc))
            return self._apply(prepared)

    def _prepare(self) -> _Prepared:
        """Everything that can fail, before anything changes (runs in a thread)."""
        if self.path is None:
            raise ConfigError("the router was started without a config file: nothing to reload")
        new = load_settings(self.path)
        old = self.settings
        for backend in new.backends:
            backend_context(backend)  # a bad TLS file refuses the reload, naming the key
        merged = _merge(old, new)
        credentials = self._tokens.read(merged.auth)
        admin = self._admin_tokens.read(merged.admin) if self._admin_tokens is not None else None
        restart = needs_restart(old.model_dump(), new.model_dump(), LIVE)
        return _Prepared(merged, credentials, admin, restart)

    def _apply(self, prepared: _Prepared) -> Reloaded:
        settings = prepared.settings
        self._tokens.use(settings.auth, prepared.credentials)
        if self._admin_tokens is not None:
            self._admin_tokens.use(settings.admin, prepared.admin_credentials)
        if self._revoke is not None:
            self._revoke(prepared.credentials)
        change = self._pool.set_static(settings)
        if self._discoveries is not None:
            self._discoveries.apply(settings.discovery)
        self.settings = settings
        self._metrics.config_reloads.labels("ok").inc()
        self._metrics.config_last_reload_success.set(time.time())
        logger.info("config reloaded from %s: %s", self.path, change.summary())
        for key in prepared.restart_required:
            logger.warning("config: %s changed; it needs a restart, the running value stays", key)
        return Reloaded(change, prepared.restart_required)


def _merge(old: Settings, new: Settings) -> Settings:
    """``old`` with the keys in :data:`LIVE` taken from ``new``."""
    auth = old.auth
    if old.auth is not None and new.auth is not None:
        auth = old.auth.model_copy(update=_token_sources(new.auth))
    admin = old.admin
    if old.admin is not None and new.admin is not None:
        admin = old.admin.model_copy(update=_token_sources(new.admin))
    router = old.router.model_copy(update={"unknown_policy": new.router.unknown_policy})
    return old.model_copy(
        update={
            "backends": new.backends,
            "discovery": new.discovery,
            "probe": new.probe,
            "router": router,
            "auth": auth,
            "admin": admin,
        }
    )


def _token_sources(section: TokenSection) -> dict[str, Any]:
    return {
        "tokens": section.tokens,
        "tokens_file": section.tokens_file,
        "token_env": section.token_env,
    }
