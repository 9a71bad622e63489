"""How late the event loop runs a task that asked to wake up: the lag every coroutine on it sees.

A probe task sleeps ``interval`` seconds at a time and records how much later than asked it woke
up; anything that holds the loop (a tokenizer call, a template render, a big JSON encode) shows
up as lag. `GcPauses` times the garbage collector's collections, which stop the loop too. Lags go into a ``MsHistogram``: sparse 1-ms buckets, so two snapshots can be
subtracted to get the quantiles of one stretch of time (a benchmark reads one before its load
and one after) and p99 is exact to the millisecond without keeping every sample.
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections import Counter
from typing import Any


class MsHistogram:
    """Counts of durations by whole millisecond (bucket b holds [b, b+1) ms) and the largest one."""

    def __init__(self) -> None:
        self.buckets: Counter[int] = Counter()
        self.max_ms = 0.0

    def add(self, seconds: float) -> None:
        ms = max(seconds, 0.0) * 1000.0
        self.buckets[int(ms)] += 1
        self.max_ms = max(self.max_ms, ms)

    @property
    def count(self) -> int:
        return sum(self.buckets.values())

    def snapshot(self) -> dict[str, Any]:
        """JSON-ready: ``{"count", "max_ms", "buckets": {ms: count}}``."""
        return {"count": self.count, "max_ms": round(self.max_ms, 3),
                "buckets": {str(b): n for b, n in sorted(self.buckets.items())}}


def buckets_of(snapshot: dict[str, Any], since: dict[str, Any] | None = None) -> Counter[int]:
    """The buckets of ``snapshot`` less those of an earlier ``since`` snapshot of the same histogram."""
    out = Counter({int(b): n for b, n in snapshot["buckets"].items()})
    if since is not None:
        out.subtract({int(b): n for b, n in since["buckets"].items()})
    return +out  # drops zero and negative counts


def quantile_ms(buckets: Counter[int], q: float) -> float | None:
    """The upper edge (ms) of the bucket holding the ``q`` quantile; None when there is no sample."""
    total = sum(buckets.values())
    if total == 0:
        return None
    rank, seen = q * total, 0
    for bucket in sorted(buckets):
        seen += buckets[bucket]
        if seen >= rank:
            return float(bucket + 1)
    return float(max(buckets) + 1)


class LoopLagProbe:
    """Samples the running loop's lag every ``interval`` seconds while started."""

    def __init__(self, interval: float = 0.01):
        if interval <= 0:
            raise ValueError(f"loop lag probe interval must be > 0, got {interval}")
        self.interval = interval
        self.lag = MsHistogram()
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="loop-lag-probe")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def _run(self) -> None:
        while True:
            asked = time.perf_counter()
            await asyncio.sleep(self.interval)
            self.lag.add(time.perf_counter() - asked - self.interval)


class GcPauses:
    """How long each garbage collection held the interpreter (and so the loop), while started.

    A full collection walks every tracked object; in a process that imported torch and
    transformers that was 80-430 ms per collection until start-up's objects were frozen
    (slime_async.runtime.freeze_startup_objects)."""

    def __init__(self) -> None:
        self.pauses = MsHistogram()
        self.seconds_by_generation: Counter[int] = Counter()
        self.collections_by_generation: Counter[int] = Counter()
        self.collected = 0  # cyclic garbage freed: objects that reference counting could not free
        # CPU time of the collections: on a busy machine their wall time also counts waits for a core
        self.cpu_seconds_by_generation: Counter[int] = Counter()
        self._began: float | None = None
        self._began_cpu = 0.0

    def start(self) -> None:
        if self._callback not in gc.callbacks:
            gc.callbacks.append(self._callback)

    def stop(self) -> None:
        if self._callback in gc.callbacks:
            gc.callbacks.remove(self._callback)

    def snapshot(self) -> dict[str, Any]:
        """``MsHistogram.snapshot`` plus ``seconds_by_generation`` and ``collections_by_generation``."""
        return self.pauses.snapshot() | {
            "seconds_by_generation": {str(g): round(s, 4) for g, s in sorted(self.seconds_by_generation.items())},
            "collections_by_generation": {str(g): n for g, n in sorted(self.collections_by_generation.items())},
            "cpu_seconds_by_generation": {str(g): round(s, 4) for g, s in sorted(self.cpu_seconds_by_generation.items())},
            "collected": self.collected}

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        now, cpu = time.perf_counter(), time.thread_time()
        if phase == "start":
            self._began, self._began_cpu = now, cpu
        elif self._began is not None:
            self.cpu_seconds_by_generation[info["generation"]] += cpu - self._began_cpu
            self.pauses.add(now - self._began)
            self.seconds_by_generation[info["generation"]] += now - self._began
            self.collections_by_generation[info["generation"]] += 1
            self.collected += info["collected"]
            self._began = None
