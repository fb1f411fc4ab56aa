"""Owned asyncio tasks, for the I/O shells (server, host): stopping one without
swallowing a cancellation meant for the caller."""

from __future__ import annotations

import asyncio
from typing import Any


async def cancel_all_and_wait(*tasks: asyncio.Task[Any]) -> None:
    """:func:`cancel_and_wait` for several tasks: all are cancelled first, so that a
    cancellation of the caller while it waits for one leaves none of them running on."""
    for task in tasks:
        task.cancel()
    for task in tasks:
        await cancel_and_wait(task)


async def cancel_and_wait(task: asyncio.Task[Any]) -> None:
    """Cancel ``task`` and wait until it has finished.

    The task's own ``CancelledError`` ends here; one aimed at the caller (it is being
    cancelled while it waits) propagates. Any other exception of the task propagates too.
    """
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        current = asyncio.current_task()
        if current is not None and current.cancelling():
            raise
