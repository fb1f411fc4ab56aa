"""router.tasks.cancel_and_wait: the task's cancellation ends there, the caller's does not."""

from __future__ import annotations

import asyncio

import pytest

from router.tasks import cancel_all_and_wait, cancel_and_wait
from tests.support import WAIT


async def test_a_cancelled_task_is_waited_for_and_its_cancellation_ends_there() -> None:
    started = asyncio.Event()

    async def forever() -> None:
        started.set()
        await asyncio.Event().wait()

    task = asyncio.create_task(forever())
    await started.wait()
    await cancel_and_wait(task)
    assert task.cancelled()


async def test_the_callers_own_cancellation_is_never_swallowed() -> None:
    started, stopping, release = asyncio.Event(), asyncio.Event(), asyncio.Event()

    async def slow_to_stop() -> None:
        try:
            started.set()
            await asyncio.Event().wait()
        finally:
            stopping.set()
            await release.wait()  # still cleaning up when the caller is cancelled

    child = asyncio.create_task(slow_to_stop())
    await started.wait()
    caller = asyncio.create_task(cancel_and_wait(child))
    await stopping.wait()
    caller.cancel()
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await caller
    assert caller.cancelled()


async def test_another_error_of_the_task_propagates() -> None:
    started = asyncio.Event()

    async def fails_on_cancel() -> None:
        try:
            started.set()
            await asyncio.Event().wait()
        finally:
            raise RuntimeError("cleanup failed")

    task = asyncio.create_task(fails_on_cancel())
    await started.wait()
    with pytest.raises(RuntimeError, match="cleanup failed"):
        await cancel_and_wait(task)


async def test_stopping_several_cancels_them_all_before_waiting_for_any() -> None:
    # on the old control link, a caller cancelled while it waited for the first of two
    # tasks left the second running (and destroyed pending at the loop's close)
    started, stopping, release = asyncio.Event(), asyncio.Event(), asyncio.Event()

    async def slow_to_stop() -> None:
        try:
            started.set()
            await asyncio.Event().wait()
        finally:
            stopping.set()
            await release.wait()

    async def forever() -> None:
        await asyncio.Event().wait()

    first, second = asyncio.create_task(slow_to_stop()), asyncio.create_task(forever())
    await started.wait()
    caller = asyncio.create_task(cancel_all_and_wait(first, second))
    await stopping.wait()
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    await asyncio.wait({second}, timeout=WAIT)
    assert second.cancelled()  # cancelled before the caller waited for anything
    release.set()
    await asyncio.wait({first}, timeout=WAIT)
    assert first.done()
