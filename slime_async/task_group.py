"""Structured concurrency for asyncio: every task has an owner that awaits or cancels it.

``asyncio.TaskGroup`` owns its tasks, but reports failures as an ``ExceptionGroup``; callers here
tell failures apart by type (the runtime waits for the tree's reason when the loop lost an actor,
``ActorStopped``) and print them in one line, so these helpers raise the first failure itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable
from typing import Any

log = logging.getLogger(__name__)


@contextlib.asynccontextmanager
async def task_group() -> AsyncIterator[asyncio.TaskGroup]:
    """An ``asyncio.TaskGroup``: leaving the block awaits its tasks; the first failure (of a task
    or of the block) cancels the rest and is raised as itself; other failures at the same time are
    logged (not the first again: one error that several tasks were failed with is one failure)."""
    try:
        async with asyncio.TaskGroup() as group:
            yield group
    except BaseExceptionGroup as errors:
        first, *others = errors.exceptions
        others = [error for error in others if error is not first]
        if others:
            log.warning("%d more task(s) failed with the first (%s); the last: %r", len(others),
                        type(first).__name__, others[-1])
        raise first from first.__cause__


async def gather_or_cancel(*awaitables: Awaitable[Any]) -> list[Any]:
    """``asyncio.gather`` whose first failure cancels the others, waits for them and is raised
    (plain ``gather`` leaves them running, owned by nobody)."""
    async with task_group() as group:
        tasks = [group.create_task(_awaited(a)) for a in awaitables]
    return [task.result() for task in tasks]


async def _awaited(awaitable: Awaitable[Any]) -> Any:
    return await awaitable


async def gather_settled(*awaitables: Awaitable[Any]) -> list[Any]:
    """Await every one of ``awaitables`` to its end; each one's result or exception, in order
    (a failure cancels nothing: for calls whose outcomes are all wanted, such as one per engine)."""
    return list(await asyncio.gather(*awaitables, return_exceptions=True))
