"""Running reward functions off the supervisor's event loop, with a deadline.

Every actor of a run shares one event loop, so a reward that blocks it (``time.sleep`` in an
``async def``, sympy, a subprocess waited on synchronously) would stall the whole tree and no
timeout could fire. Here a coroutine function runs on a dedicated thread's own event loop and a
plain function in a worker thread; the caller waits at most ``timeout`` seconds, then stops
waiting (``asyncio.TimeoutError``) and the call is cancelled where it can be (a coroutine at its
next ``await``; a thread cannot be interrupted and finishes in the background).

The caller's context variables travel with the call (``call_soon_threadsafe`` runs the
scheduling callback in a copy of the caller's context), so what a hook's adapter set for its
sample (the router key of slime-style ``post()``) holds inside the reward too.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
from collections.abc import Callable
from typing import Any


class RewardRunner:
    """One reward thread with its own event loop, started at the first coroutine call."""

    def __init__(self, name: str = "rewards"):
        self.name = name
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    async def call(self, function: Callable[..., Any], *args: Any, timeout: float | None) -> Any:
        """``function(*args)`` off this loop; its result, or TimeoutError after ``timeout`` s."""
        if inspect.iscoroutinefunction(function):
            future = asyncio.wrap_future(asyncio.run_coroutine_threadsafe(_resolved(function, args), self._reward_loop()))
        else:
            future = asyncio.to_thread(_call_resolved, function, args)
        # wait_for cancels the wrapped future at the deadline, which cancels the reward task on
        # its own loop; it never waits for a blocked reward to notice.
        return await asyncio.wait_for(future, timeout)

    def _reward_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(target=loop.run_forever, name=f"{self.name}-loop", daemon=True)
                thread.start()
                self._loop, self._thread = loop, thread
            return self._loop

    def close(self) -> None:
        """Stop the reward loop (rewards still running there are abandoned)."""
        with self._lock:
            loop, thread, self._loop, self._thread = self._loop, self._thread, None, None
        if loop is None:
            return
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=1.0)
        if not thread.is_alive():
            loop.close()


async def _resolved(function: Callable[..., Any], args: tuple) -> Any:
    result = function(*args)
    return await result if inspect.isawaitable(result) else result


def _call_resolved(function: Callable[..., Any], args: tuple) -> Any:
    result = function(*args)
    if inspect.isawaitable(result):  # a sync wrapper that hands back a coroutine
        return asyncio.run(_await(result))
    return result


async def _await(awaitable: Any) -> Any:
    return await awaitable
