"""Pool slots shared by every event loop of a process.

An ``asyncio.Semaphore`` belongs to one loop, but a sandbox may be called from several (the
rollout's loop and the reward thread's own loop). Slots are numbered because each one runs as
its own uid.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque


class SlotPool:
    def __init__(self, count: int):
        self._lock = threading.Lock()
        self._free = list(range(count - 1, -1, -1))  # pop() hands out slot 0 first
        self._waiters: deque[tuple[asyncio.AbstractEventLoop, asyncio.Future]] = deque()
        self.in_use = 0

    async def acquire(self) -> int:
        loop = asyncio.get_running_loop()
        with self._lock:
            if self._free and not self._waiters:
                self.in_use += 1
                return self._free.pop()
            waiter = (loop, loop.create_future())
            self._waiters.append(waiter)
        try:
            return await waiter[1]
        except asyncio.CancelledError:
            with self._lock:
                if waiter in self._waiters:
                    self._waiters.remove(waiter)
            # else release() already passed it a slot: _hand sees the cancel and passes it on
            raise

    def release(self, slot: int) -> None:
        with self._lock:
            while self._waiters:
                loop, future = self._waiters.popleft()
                try:
                    loop.call_soon_threadsafe(self._hand, future, slot)
                    return
                except RuntimeError:  # that loop is closed: the next waiter gets the slot
                    continue
            self.in_use -= 1
            self._free.append(slot)

    def _hand(self, future: asyncio.Future, slot: int) -> None:
        if future.done():  # cancelled meanwhile
            self.release(slot)
        else:
            future.set_result(slot)
