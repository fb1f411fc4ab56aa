"""The event loop a router runs on: ``router.event_loop``.

``"uvloop"`` is uvloop's (libuv underneath), the default wherever it is installed (it
is a dependency on every platform it builds for); ``"asyncio"`` is the standard
library's, the default elsewhere and a setting everywhere. The configuration refuses
``"uvloop"`` when it is not installed (a line naming the key), so this never has to.
"""

from __future__ import annotations

import asyncio
import importlib.util
from collections.abc import Callable
from typing import Literal

EventLoop = Literal["asyncio", "uvloop"]


def default_event_loop() -> EventLoop:
    """``router.event_loop`` when the config does not say: uvloop where it is installed."""
    return "uvloop" if uvloop_installed() else "asyncio"


def uvloop_installed() -> bool:
    return importlib.util.find_spec("uvloop") is not None


def runner(event_loop: str) -> asyncio.Runner:
    """A runner on the loop named by ``router.event_loop``."""
    factory: Callable[[], asyncio.AbstractEventLoop] | None = None
    if event_loop == "uvloop":
        import uvloop

        factory = uvloop.new_event_loop
    return asyncio.Runner(loop_factory=factory)


def running_loop() -> str:
    """The loop this code runs on, as ``router.event_loop`` names it (``"uvloop"`` or
    ``"asyncio"``: the package its class comes from)."""
    return type(asyncio.get_running_loop()).__module__.partition(".")[0]
