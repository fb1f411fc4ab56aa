"""Stopping the router: the signals, the drain window, and closing clients spread out.

The first SIGINT or SIGTERM starts the stop: ``/readyz`` turns 503 and new clients are
refused for ``router.drain_seconds`` (load balancers and Kubernetes take the replica
out), while connected clients carry on. Then the connected clients are closed with 1012
(service restart: reconnect, to another replica, and resume), spread evenly over
``router.close_spread_seconds`` so that they do not all land on the other replicas in
the same instant. A second signal cuts both waits short: the clients still connected
are closed at once and the router exits. SIGHUP reloads the configuration.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from typing import Protocol

from router.core.ending import STOPPING, Ending
from router.tasks import cancel_and_wait

logger = logging.getLogger(__name__)

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StopSignals:
    """SIGINT and SIGTERM as two events: the first signal asks to stop, the next to hurry."""

    def __init__(self) -> None:
        self.stop = asyncio.Event()
        self.hurry = asyncio.Event()

    def _received(self) -> None:
        if self.stop.is_set():
            logger.warning("second stop signal: closing every client now")
            self.hurry.set()
        else:
            logger.info("stopping")
            self.stop.set()

    @contextlib.contextmanager
    def installed(self) -> Iterator[StopSignals]:
        """Handle the signals on the running loop for the duration of the block; after a
        stop, ignore them from then on."""
        loop = asyncio.get_running_loop()
        for signum in SIGNALS:
            loop.add_signal_handler(signum, self._received)
        try:
            yield self
        finally:
            # held back while the handlers change: asyncio puts the default action back
            # (death, for SIGTERM) before SIG_IGN replaces it below
            held = signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS)
            try:
                for signum in SIGNALS:
                    with contextlib.suppress(ValueError, RuntimeError):
                        loop.remove_signal_handler(signum)
                    if self.stop.is_set():
                        # on the way out already: a later signal must not turn a clean
                        # exit into death by signal while the interpreter tears down
                        signal.signal(signum, signal.SIG_IGN)
            finally:
                signal.pthread_sigmask(signal.SIG_SETMASK, held)


@contextlib.asynccontextmanager
async def reloading_on_hangup(reload: Callable[[], Awaitable[object]]) -> AsyncIterator[None]:
    """SIGHUP calls ``reload`` (the config reload, :mod:`router.server.operator.reload`) for the
    duration of the block; hang-ups that come during a reload make one more reload
    after it, not one each."""
    hangup = asyncio.Event()
    loop = asyncio.get_running_loop()

    async def reload_on_request() -> None:
        while True:
            await hangup.wait()
            hangup.clear()
            logger.info("SIGHUP: reloading the configuration")
            try:
                await reload()
            except Exception:  # the reload task's boundary: the router keeps running
                logger.exception("config reload failed inside the router")

    loop.add_signal_handler(signal.SIGHUP, hangup.set)
    task = asyncio.create_task(reload_on_request(), name="reload-on-sighup")
    try:
        yield
    finally:
        with contextlib.suppress(ValueError, RuntimeError):
            loop.remove_signal_handler(signal.SIGHUP)
        await cancel_and_wait(task)


async def wait_unless(hurry: asyncio.Event, seconds: float) -> bool:
    """Wait ``seconds``, or less if ``hurry`` is set first; True when hurried."""
    if hurry.is_set():
        return True
    if seconds <= 0:
        return False
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            await hurry.wait()
    return hurry.is_set()


class Closable(Protocol):
    """A client connection, on any transport."""

    async def shut(self, ending: Ending) -> None: ...


async def close_restart(client: Closable) -> None:
    """Close one client with 1012 (service restart)."""
    await client.shut(STOPPING)


async def close_spread(clients: Sequence[Closable], window: float, hurry: asyncio.Event) -> None:
    """Close ``clients`` one at a time, evenly over ``window`` seconds (all at once when
    ``hurry`` is set), and wait for the closing handshakes."""
    gap = window / len(clients) if clients else 0.0
    closing: list[asyncio.Task[None]] = []
    try:
        for index, client in enumerate(clients):
            if index:
                await wait_unless(hurry, gap)
            closing.append(asyncio.create_task(close_restart(client), name="close-client"))
        await asyncio.gather(*closing, return_exceptions=True)
    finally:
        for task in closing:
            task.cancel()
