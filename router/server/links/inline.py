"""Running a coroutine inline, from a protocol callback, until it first has to wait.

A WebSocket's frames arrive in ``data_received``, a plain call. Handing each to a task
costs a task and a switch per frame, and an idle connection would keep a task waiting
for the next one. Nearly every frame is handled without waiting at all (its writes go
straight into a transport), so :func:`run_inline` steps the handler's coroutine right
there, in the caller's context, and makes a task only when the coroutine waits on
something (a full transport to drain, a lock): the task then finishes it from where it
stopped. The caller keeps later frames back until that task is done, so their order
holds (:class:`router.server.links.sansio_websocket.SansIoWebSocket`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Generator
from typing import Any


def run_inline(coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None] | None:
    """Run ``coro`` until it ends (then None) or waits (then the task, named ``name``,
    that finishes it). An exception it raises before waiting is raised here."""
    try:
        waiting = coro.send(None)
    except StopIteration:
        return None
    return asyncio.create_task(_finish(coro, waiting), name=name)


async def _finish(coro: Coroutine[Any, Any, None], waiting: Any) -> None:
    await _Resumed(coro, waiting)


class _Resumed:
    """Awaiting it drives ``coro`` on from where :func:`run_inline` left it: waiting on
    ``waiting`` (what it yielded), in the task that awaits this. Values and exceptions
    the task sends in (its cancellation) go through to ``coro``, as ``await`` would do."""

    __slots__ = ("_coro", "_waiting")

    def __init__(self, coro: Coroutine[Any, Any, None], waiting: Any) -> None:
        self._coro = coro
        self._waiting = waiting

    def __await__(self) -> Generator[Any, Any, None]:
        coro, waiting = self._coro, self._waiting
        self._waiting = None
        while True:
            try:
                sent = yield waiting
            except GeneratorExit:
                coro.close()
                raise
            except BaseException as exc:  # noqa: BLE001 (thrown in by the task: passed on)
                try:
                    waiting = coro.throw(exc)
                except StopIteration:
                    return
            else:
                try:
                    waiting = coro.send(sent)
                except StopIteration:
                    return
