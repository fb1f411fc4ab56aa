"""The event loop a router runs on: ``router.event_loop``.

``"asyncio"`` (the default) is the standard library's loop; ``"uvloop"`` is uvloop's
(libuv underneath), installed with the extra ``pip install 'acp-router[uvloop]'``.
The configuration refuses ``"uvloop"`` when it is not installed (a line naming the
key), so this never has to.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable


def runner(event_loop: str) -> asyncio.Runner:
    """A runner on the loop named by ``router.event_loop``."""
    factory: Callable[[], asyncio.AbstractEventLoop] | None = None
    if event_loop == "uvloop":
        import uvloop

        factory = uvloop.new_event_loop
    return asyncio.Runner(loop_factory=factory)
