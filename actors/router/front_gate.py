"""How many requests the HTTP front works on at once: the bound on the event loop's lag under load.

The front runs on one event loop (the supervisor's, in a training run). With a thousand agent
sessions, a thousand handlers can be ready at once: the loop then runs a step of each before it
gets back to anything else, so every other coroutine (health checks, weight syncs, the lag
probe) waits for the whole round: 0.4-0.8 s measured at 1,000 sessions
(benchmarks/front_load.py, docs/agents.md "The front under load").

A request holds one of ``limit`` slots while it works (parsing, chat rendering and tokenizing,
decoding, stop search, building and writing chunks) and gives it back while it waits: for an
engine (`waiting` around each engine request) or for its client to read a streamed chunk
(`GatedStream.write`). So a round of the loop holds at most ``limit`` requests' steps, while the
number of requests at the engines is not limited (their batches stay full); the rest wait their
turn in a FIFO queue, where waiting costs nothing. A client that stops reading holds no slot.

A request's tasks (one per choice with n > 1) share its slot: while any of them waits for an
engine the slot is free, so such a request can run n steps at once (a bound n times looser).
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import TypeVar

from aiohttp import web

T = TypeVar("T")


class _Slot:
    __slots__ = ("gate", "held", "waits")

    def __init__(self, gate: FrontGate):
        self.gate = gate
        self.held = False
        self.waits = 0  # engine requests and writes of this request in progress


_current: contextvars.ContextVar[_Slot | None] = contextvars.ContextVar("front_gate_slot", default=None)


class FrontGate:
    """At most ``limit`` requests at work in the front; ``limit`` 0 = no bound."""

    def __init__(self, limit: int):
        if limit < 0:
            raise ValueError(f"--router-front-concurrency must be >= 0, got {limit}")
        self.limit = limit
        self._slots = asyncio.Semaphore(limit) if limit else None

    async def run(self, handler: Callable[[], Awaitable[T]]) -> T:
        """Run one request's handler holding a slot (given back while it waits, see the module)."""
        if self._slots is None:
            return await handler()
        slot = _Slot(self)
        token = _current.set(slot)  # the handler's tasks inherit it
        try:
            await self._slots.acquire()
            slot.held = True
            return await handler()
        finally:
            _current.reset(token)
            if slot.held:
                slot.held = False
                self._slots.release()


@asynccontextmanager
async def waiting() -> AsyncIterator[None]:
    """Give the current request's slot back while the body waits for something outside the loop's
    work (an engine, a client's read); take it again after (at the back of the queue). On an
    error the slot is not taken again: the request only reports it and ends."""
    slot = _current.get()
    if slot is None:  # no gate, or not a request of the front (the rollout's own calls)
        yield
        return
    slot.waits += 1
    if slot.waits == 1 and slot.held:
        slot.held = False
        slot.gate._slots.release()
    try:
        yield
    finally:
        slot.waits -= 1
    if slot.waits == 0 and not slot.held:
        await slot.gate._slots.acquire()
        slot.held = True


class GatedStream(web.StreamResponse):
    """A streamed answer whose writes give the request's slot back while they wait for the client."""

    async def write(self, data: bytes | bytearray | memoryview) -> None:
        async with waiting():
            await super().write(data)


def sse_response() -> GatedStream:
    """A server-sent-events answer, not yet prepared."""
    return GatedStream(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
