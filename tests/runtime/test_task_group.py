"""slime_async.task_group: owned tasks, and the first failure raised as itself (not an ExceptionGroup)."""

from __future__ import annotations

import asyncio

import pytest

from slime_async.actor import ActorStopped
from slime_async.task_group import gather_or_cancel, task_group


async def test_leaving_the_group_awaits_its_tasks():
    done = []

    async def work():
        await asyncio.sleep(0)
        done.append(True)

    async with task_group() as group:
        group.create_task(work())
    assert done == [True]


async def test_an_error_in_the_block_cancels_the_tasks_and_comes_out_as_itself():
    never = asyncio.Event()
    async with asyncio.timeout(10):  # hang guard
        with pytest.raises(ActorStopped, match="monitor"):
            async with task_group() as group:
                task = group.create_task(never.wait())
                await asyncio.sleep(0)
                raise ActorStopped("actor 'monitor' is not running")
    assert task.cancelled()


async def test_a_failing_task_cancels_the_block_and_comes_out_as_itself():
    async def fail():
        raise ValueError("eval hook broke")

    with pytest.raises(ValueError, match="eval hook broke"):
        async with task_group() as group:
            group.create_task(fail())
            await asyncio.Event().wait()  # cancelled by the task's failure


async def test_gather_or_cancel_returns_results_in_order():
    async def value(v):
        await asyncio.sleep(0)
        return v

    assert await gather_or_cancel(value(1), value(2), value(3)) == [1, 2, 3]


async def test_gather_or_cancel_cancels_the_others_at_the_first_failure():
    cancelled = []

    async def slow():
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.append(True)
            raise

    async def fail():
        await asyncio.sleep(0)
        raise RuntimeError("engine answered 503")

    with pytest.raises(RuntimeError, match="503"):
        await gather_or_cancel(slow(), fail(), slow())
    assert cancelled == [True, True]  # plain asyncio.gather would leave both running


async def test_one_error_that_several_tasks_fail_with_is_raised_and_not_logged_as_more(caplog):
    # A rank's death report: the trainer fails every pending call with the same exception.
    report = RuntimeError("trainer rank 1 (pid 42) died")
    pending = [asyncio.get_running_loop().create_future() for _ in range(3)]

    async def call(future):
        return await future

    async def fail_all():
        await asyncio.sleep(0)
        for future in pending:
            future.set_exception(report)

    with pytest.raises(RuntimeError) as raised:
        await gather_or_cancel(*(call(f) for f in pending), fail_all())
    assert raised.value is report
    assert "more task(s) failed" not in caplog.text
