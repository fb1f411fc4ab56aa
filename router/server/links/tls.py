"""TLS contexts from the configuration: the front door's (``wss://``) and each
``wss://`` backend's.

A context is built once per configuration (files are read at start, so a missing or
bad PEM file stops the router with a line naming the key) and shared by every link.
"""

from __future__ import annotations

import functools
import ssl

from router.protocol.errors import ConfigError
from router.server.config import BackendSection, RouterSection


def server_context(router: RouterSection) -> ssl.SSLContext | None:
    """The front door's context, or None when it serves plain ``ws://``."""
    if router.tls_cert is None or router.tls_key is None:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    _load_chain(context, router.tls_cert, router.tls_key, "router")
    return context


#: bounded: discovery may name many backends over a long run
@functools.lru_cache(maxsize=1024)
def backend_context(backend: BackendSection) -> ssl.SSLContext | None:
    """The context for a ``wss://`` backend (None for ``ws://``): the system's CAs, or
    only ``tls_ca`` when it is set; host names checked, and the client certificate when one is configured."""
    if not backend.url.startswith("wss://"):
        return None
    try:  # tls_ca replaces the system's CAs: trust exactly what the operator named
        context = ssl.create_default_context(cafile=backend.tls_ca)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"backends.{backend.id}.tls_ca: {backend.tls_ca}: {exc}") from None
    if backend.tls_cert is not None and backend.tls_key is not None:
        _load_chain(context, backend.tls_cert, backend.tls_key, f"backends.{backend.id}")
    return context


def _load_chain(context: ssl.SSLContext, cert: str, key: str, where: str) -> None:
    try:
        context.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"{where}.tls_cert/tls_key: {cert}, {key}: {exc}") from None
