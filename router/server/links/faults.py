"""The one seam where third-party failures become the router's own errors.

aiohttp raises :class:`aiohttp.ClientError` subclasses and the socket layer raises
:class:`OSError` (``TimeoutError`` included, so a deadline that expires inside
counts too). Past this seam the router speaks only its exception tree
(:mod:`router.protocol.errors`): a backend that cannot be reached, or goes away,
is :class:`~router.protocol.errors.BackendLinkLost` with the reason in its data.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import aiohttp

from router.protocol.errors import BackendLinkLost
from router.protocol.ids import BackendId

#: What reaching a backend can raise that is not ours.
FOREIGN_FAILURES = (aiohttp.ClientError, OSError)


def describe(exc: BaseException) -> str:
    """A one-line reason for a log line or an error's data."""
    return str(exc) or type(exc).__name__


@contextlib.contextmanager
def backend_faults(backend: BackendId) -> Iterator[None]:
    """Translate a foreign failure talking to ``backend`` into :class:`BackendLinkLost`."""
    try:
        yield
    except FOREIGN_FAILURES as exc:
        raise BackendLinkLost(None, {"backend": backend, "reason": describe(exc)}) from exc


def connection_refused(exc: BaseException) -> bool:
    """Whether ``exc`` (or what it was raised from) is a refused connection: nothing
    listens at the backend's address, so the process that held its sessions is gone."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, ConnectionRefusedError):
            return True
        if isinstance(seen, aiohttp.ClientConnectorError) and isinstance(
            seen.os_error, ConnectionRefusedError
        ):
            return True
        seen = seen.__cause__
    return False
