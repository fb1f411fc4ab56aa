"""Running a frame's handler inline (:func:`router.server.links.inline.run_inline`): a coroutine
that never waits finishes in the call, with no task; one that waits is finished by a task
from where it stopped, its result and its own exceptions as ``await`` would give them;
cancelling that task cancels the coroutine where it waits."""

from __future__ import annotations

import asyncio

import pytest

from router.server.links.inline import run_inline
from tests.support import WAIT


async def test_a_coroutine_that_never_waits_finishes_in_the_call() -> None:
    seen: list[str] = []

    async def handle() -> None:
        seen.append("handled")

    assert run_inline(handle(), "frame") is None
    assert seen == ["handled"]


async def test_a_coroutine_that_waits_is_finished_by_a_task_from_where_it_stopped() -> None:
    ready: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    seen: list[str] = []

    async def handle() -> None:
        seen.append("before")
        seen.append(await ready)
        seen.append(str(asyncio.current_task() is not None))

    task = run_inline(handle(), "frame")
    assert task is not None
    assert seen == ["before"]  # ran inline up to its first wait
    ready.set_result("after")
    async with asyncio.timeout(WAIT):
        await task
    assert seen == ["before", "after", "True"]  # then in the task


async def test_an_exception_after_the_wait_is_the_tasks() -> None:
    ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    async def handle() -> None:
        await ready
        raise ValueError("broken")

    task = run_inline(handle(), "frame")
    assert task is not None
    ready.set_result(None)
    with pytest.raises(ValueError, match="broken"):
        async with asyncio.timeout(WAIT):
            await task


async def test_cancelling_the_task_cancels_the_coroutine_where_it_waits() -> None:
    seen: list[str] = []

    async def handle() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            seen.append("cancelled where it waited")
            raise

    task = run_inline(handle(), "frame")
    assert task is not None
    await asyncio.sleep(0)  # the task steps once: it now waits on the coroutine's behalf
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        async with asyncio.timeout(WAIT):
            await task
    assert seen == ["cancelled where it waited"]


async def test_an_exception_before_any_wait_is_raised_in_the_call() -> None:
    async def handle() -> None:
        raise KeyError("at once")

    with pytest.raises(KeyError):
        run_inline(handle(), "frame")
