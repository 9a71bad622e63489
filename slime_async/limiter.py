"""A counting limiter whose limit can change while tasks hold and wait for it.

``asyncio.Semaphore`` has a fixed size; the rollout's concurrency follows the engines it can
send to (they join, leave, report their limits), so its slots must grow and shrink. Shrinking
never takes a slot from a holder: the extra holders finish, and nobody new gets in until the
count is under the new limit.
"""

from __future__ import annotations

import asyncio
from collections import deque


class Limiter:
    """Up to ``limit`` holders at once; waiters are served first come, first served."""

    def __init__(self, limit: int) -> None:
        self._limit = _checked(limit)
        self._held = 0
        self._waiters: deque[asyncio.Future] = deque()

    @property
    def limit(self) -> int:
        """The current number of holders allowed at once."""
        return self._limit

    @property
    def held(self) -> int:
        """Slots held now (above ``limit`` for a while after a shrink)."""
        return self._held

    def resize(self, limit: int) -> None:
        """Change the limit (>= 1); a larger one admits waiters at once, a smaller one takes
        nothing from holders."""
        self._limit = _checked(limit)
        self._wake()

    async def acquire(self) -> None:
        """Wait for a slot and take it; cancelled while waiting, it holds nothing."""
        if self._held < self._limit and not self._waiters:
            self._held += 1
            return
        future = asyncio.get_running_loop().create_future()
        self._waiters.append(future)
        try:
            await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                self.release()  # granted as it was cancelled: give the slot back
            raise

    def release(self) -> None:
        """Give one slot back (and admit the next waiter if the limit allows)."""
        if self._held <= 0:
            raise RuntimeError("Limiter.release without a matching acquire")
        self._held -= 1
        self._wake()

    async def __aenter__(self) -> None:
        await self.acquire()

    async def __aexit__(self, *_exc: object) -> None:
        self.release()

    def _wake(self) -> None:
        while self._waiters and self._held < self._limit:
            future = self._waiters.popleft()
            if future.done():  # cancelled while waiting
                continue
            self._held += 1
            future.set_result(None)


def _checked(limit: int) -> int:
    if limit < 1:
        raise ValueError(f"a limiter's limit must be >= 1, got {limit}")
    return limit
