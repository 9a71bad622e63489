"""What the front measures about itself: the event loop's lag and the latency it adds over the engines.

``added`` is, per generating request, the handler's wall time less the time its engine requests
took (through the router actor, so routing is counted as engine time): template rendering,
tokenizing, the stop-string search, decoding, JSON and the wait for the loop. Concurrent engine
requests of one request (n > 1) are summed, so for those it is a lower bound.

The engine time is gathered through a context variable: the tasks a handler starts (one per
choice) inherit the handler's accumulator, so nothing has to be threaded through the call chain.
"""

from __future__ import annotations

import contextvars
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from slime_async.loop_lag import GcPauses, LoopLagProbe, MsHistogram, buckets_of, quantile_ms

T = TypeVar("T")


class _EngineTime:
    __slots__ = ("seconds", "calls")

    def __init__(self) -> None:
        self.seconds = 0.0
        self.calls = 0


_current: contextvars.ContextVar[_EngineTime | None] = contextvars.ContextVar("front_engine_time", default=None)


class FrontStats:
    def __init__(self, lag_interval: float = 0.01):
        self.probe = LoopLagProbe(lag_interval)
        self.gc = GcPauses()  # started and stopped with the probe (HttpFront)
        self.added = MsHistogram()

    async def timed_request(self, handler: Callable[[], Awaitable[T]]) -> T:
        """Run one request's handler; if it asked the engines anything, record what the front added."""
        engine = _EngineTime()
        token = _current.set(engine)
        start = time.perf_counter()
        try:
            return await handler()
        finally:
            _current.reset(token)
            if engine.calls:
                self.added.add(time.perf_counter() - start - engine.seconds)

    @staticmethod
    async def engine_call(call: Awaitable[T]) -> T:
        """Await one engine request, counting its time as the engine's, not the front's."""
        engine = _current.get()
        start = time.perf_counter()
        try:
            return await call
        finally:
            if engine is not None:
                engine.seconds += time.perf_counter() - start
                engine.calls += 1

    def snapshot(self) -> dict[str, Any]:
        """The ``/front_stats`` answer: both histograms, for a client to subtract two of."""
        return {"loop_lag": self.probe.lag.snapshot(), "loop_lag_interval_ms": self.probe.interval * 1000,
                "front_added": self.added.snapshot(), "gc_pauses": self.gc.snapshot()}

    def metrics(self) -> dict[str, float]:
        lag, added = buckets_of(self.probe.lag.snapshot()), buckets_of(self.added.snapshot())
        out = {"router/loop_lag_max_ms": self.probe.lag.max_ms}
        for name, buckets in (("loop_lag", lag), ("front_added", added)):
            for q in (0.5, 0.99):
                value = quantile_ms(buckets, q)
                if value is not None:
                    out[f"router/{name}_p{round(q * 100)}_ms"] = value
        return out
