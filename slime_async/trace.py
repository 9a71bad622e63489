"""A timeline of one run (``--trace-dir``): spans of what each actor did, in Chrome's trace-event
JSON, which Perfetto (ui.perfetto.dev) and chrome://tracing open.

The file is ``{"traceEvents": [...], "otherData": {...}}``: one complete event per span
(``"ph": "X"``, ``ts``/``dur`` in microseconds since the recorder started), ``pid``/``tid``
numbering a lane's process and thread, and metadata events (``"ph": "M"``) naming them.

A lane is one row of the timeline. Work that overlaps itself (an engine's concurrent requests,
rewards scored in parallel) goes to a ``LanePool``: each span takes the lowest-numbered thread of
the pool that is free over its whole interval, so spans on one thread never overlap (Perfetto
and the renderer both need that) and the pool's width shows the concurrency.

One clock: ``time.monotonic()``. Every actor lives in the supervisor's process and times its
spans there. CLOCK_MONOTONIC is one clock for every process of a host, so a child process on the
same host (none records spans today) could send its ``time.monotonic()`` stamps to ``record`` as
they are; a process on another host would first need its offset to this one measured (the
midpoint of a ping's round trip).

Overhead and safety: a span is serialised once, when it ends, and appended to a list in memory;
at most ``max_events`` are kept, the rest are counted (``otherData.dropped_events``). The whole
file is rewritten atomically (a temporary file, then ``os.replace``) at most every
``flush_interval`` seconds — and never more often than keeps writing under 1% of the time — so a
run that crashes leaves the last complete file; ``close`` writes the final one. A periodic write
that fails (disk full, directory gone) is logged once and recording goes on: the trace must never
end the run; only ``close`` raises, so the run's end says the file is missing or stale.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

DEFAULT_MAX_EVENTS = 200_000
DEFAULT_FLUSH_INTERVAL = 10.0  # seconds between rewrites of the file while the run goes on
_WRITE_SHARE = 0.01  # the longest share of wall time the periodic rewrites may take
# Rows from top to bottom (a process whose name starts with one of these; others go last): the
# engines, then what feeds the trainer, then the trainer, then what it sends back.
PROCESS_ORDER = ("engine", "reward", "rollout", "buffer", "train loop", "trainer", "critic", "weight sync")


def process_order(process: str) -> int:
    """The sort index of a process named ``process`` (``PROCESS_ORDER``)."""
    return next((i for i, prefix in enumerate(PROCESS_ORDER) if process.startswith(prefix)), len(PROCESS_ORDER))


@dataclass(frozen=True)
class Lane:
    """One row: a (process, thread) pair of the trace."""

    pid: int
    tid: int


@dataclass
class LanePool:
    """Rows for work that overlaps itself: threads ``<thread> 0``, ``<thread> 1``, ... of one process."""

    process: str
    pid: int
    thread: str
    _ends: list[float] = field(default_factory=list)  # each thread's latest span end (µs)
    _lanes: list[Lane] = field(default_factory=list)


class Span:
    """``TraceRecorder.span``: a context manager for ``with`` and ``async with`` alike (the latter
    joins an ``async with lock, trace.span(...)`` line)."""

    def __init__(self, recorder: TraceRecorder, name: str, lane: Lane | LanePool, cat: str, args: dict[str, Any]):
        self.recorder, self.name, self.lane, self.cat, self.args = recorder, name, lane, cat, args
        self.start = 0.0

    def __enter__(self) -> dict[str, Any]:
        self.start = self.recorder.clock()
        return self.args

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: Any) -> None:
        if kind is not None:
            self.args["error"] = kind.__name__
        self.recorder.record(self.name, self.lane, self.start, cat=self.cat, **self.args)

    async def __aenter__(self) -> dict[str, Any]:
        return self.__enter__()

    async def __aexit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: Any) -> None:
        self.__exit__(kind, error, tb)


class TraceRecorder:
    """Records spans into ``path`` (None: records nothing, at the cost of a few attribute reads);
    ``metadata`` (what was run: mode, transport, ...) goes into the file's ``otherData``."""

    def __init__(self, path: str | Path | None, *, max_events: int = DEFAULT_MAX_EVENTS,
                 flush_interval: float = DEFAULT_FLUSH_INTERVAL, clock: Callable[[], float] = time.monotonic,
                 metadata: dict[str, Any] | None = None):
        if max_events < 0:
            raise ValueError(f"max_events must be >= 0, got {max_events}")
        self.path = Path(path) if path is not None else None
        self.max_events = max_events
        self.flush_interval = flush_interval
        self.clock = clock
        self.origin = clock()
        self.dropped = 0
        self.metadata = dict(metadata or {})
        self._origin_unix = time.time()
        self._events: list[str] = []  # serialised span events, in the order they ended
        self._metadata: list[str] = []  # process / thread names and sort order
        self._processes: dict[str, int] = {}
        self._lanes: dict[tuple[int, str], Lane] = {}
        self._pools: dict[tuple[str, str], LanePool] = {}
        self._next_flush = self.origin + flush_interval
        self.write_errors = 0  # periodic writes that failed (logged once)

    @classmethod
    def off(cls) -> TraceRecorder:
        """A recorder that records nothing (the default of every component)."""
        return cls(None)

    @property
    def enabled(self) -> bool:
        return self.path is not None

    def now(self) -> float:
        """The trace clock (``time.monotonic()`` seconds): pass it to ``record`` as a span's start."""
        return self.clock()

    # ----- lanes ----------------------------------------------------------------------------------
    def lane(self, process: str, thread: str, *, order: int | None = None) -> Lane:
        """The row ``thread`` of ``process``, created on first use; ``order`` sorts the processes
        (default ``process_order``)."""
        pid = self._process(process, order)
        key = (pid, thread)
        lane = self._lanes.get(key)
        if lane is None:
            lane = self._lanes[key] = Lane(pid, len(self._lanes) + 1)
            self._meta("thread_name", lane, name=thread)
            self._meta("thread_sort_index", lane, sort_index=lane.tid)
        return lane

    def pool(self, process: str, thread: str = "slot", *, order: int | None = None) -> LanePool:
        """Rows of ``process`` for overlapping spans (see the module's doc)."""
        key = (process, thread)
        pool = self._pools.get(key)
        if pool is None:
            pool = self._pools[key] = LanePool(process, self._process(process, order), thread)
        return pool

    # ----- spans ----------------------------------------------------------------------------------
    def record(self, name: str, lane: Lane | LanePool, start: float, end: float | None = None, /, *,
               cat: str = "", min_seconds: float = 0.0, **args: Any) -> None:
        """A span from ``start`` to ``end`` (trace-clock seconds; None: now) with ``args``
        (JSON-able values) shown when it is selected; skipped when shorter than ``min_seconds``
        (a wait that did not wait). The first four are positional-only, so any other name may be an arg."""
        if self.path is None:
            return
        end = self.clock() if end is None else end
        if end - start < min_seconds:
            return
        ts = (start - self.origin) * 1e6
        dur = max(0.0, (end - start) * 1e6)
        if isinstance(lane, LanePool):
            lane = self._free_lane(lane, ts, ts + dur)
        if len(self._events) >= self.max_events:
            if not self.dropped:
                log.warning("trace: %d events recorded, later ones are dropped and counted "
                            "(--trace-max-events)", self.max_events)
            self.dropped += 1
        else:
            event = {"name": name, "cat": cat, "ph": "X", "ts": round(ts, 1), "dur": round(dur, 1),
                     "pid": lane.pid, "tid": lane.tid}
            if args:
                event["args"] = args
            self._events.append(json.dumps(event, default=str))
        if end >= self._next_flush:
            self._periodic_flush()

    def span(self, name: str, lane: Lane | LanePool, /, *, cat: str = "", **args: Any) -> Span:
        """Time a ``with`` (or ``async with``) block as a span; the block may add to the args it
        gets. A block that raises is recorded too, with the exception's type in ``args["error"]``."""
        return Span(self, name, lane, cat, args)

    # ----- the file -------------------------------------------------------------------------------
    def flush(self) -> None:
        """Rewrite the file with everything recorded so far (atomically: a reader sees the old
        file or the new one, never half of one)."""
        if self.path is None:
            return
        started = self.clock()
        other = self.metadata | {"clock": "time.monotonic", "origin_unix_s": self._origin_unix,
                                 "max_events": self.max_events, "dropped_events": self.dropped}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        temporary = self.path.with_name(f".{self.path.name}.tmp")
        with temporary.open("w", encoding="utf-8") as out:
            out.write('{"traceEvents": [\n')
            out.write(",\n".join(self._metadata + self._events))
            out.write(f'\n], "displayTimeUnit": "ms", "otherData": {json.dumps(other)}}}\n')
        os.replace(temporary, self.path)
        took = self.clock() - started
        self._next_flush = self.clock() + max(self.flush_interval, took / _WRITE_SHARE)

    def close(self) -> None:
        """Write the final file (raises OSError when it cannot be written)."""
        self.flush()

    def _periodic_flush(self) -> None:
        # Called from record(), i.e. inside the router's and the loop's own code paths: an OSError
        # here would end the run for the sake of a timeline.
        try:
            self.flush()
        except OSError as error:
            if not self.write_errors:
                log.warning("trace: cannot write %s (%s); recording goes on, the next writes are retried "
                            "and close() raises if the last one fails", self.path, error)
            self.write_errors += 1
            self._next_flush = self.clock() + self.flush_interval

    # ----- internals ------------------------------------------------------------------------------
    def _process(self, process: str, order: int | None) -> int:
        pid = self._processes.get(process)
        if pid is None:
            order = process_order(process) if order is None else order
            pid = self._processes[process] = len(self._processes) + 1
            lane = Lane(pid, 0)
            self._meta("process_name", lane, name=process)
            self._meta("process_sort_index", lane, sort_index=order)
        return pid

    def _meta(self, kind: str, lane: Lane, **args: Any) -> None:
        if self.path is not None:
            self._metadata.append(json.dumps({"name": kind, "ph": "M", "pid": lane.pid, "tid": lane.tid,
                                              "args": args}))

    def _free_lane(self, pool: LanePool, ts: float, end: float) -> Lane:
        # Spans are recorded as they end, so a thread whose latest span ended by ``ts`` is free
        # over [ts, end]: everything recorded on it ended no later than that.
        for index, last_end in enumerate(pool._ends):
            if last_end <= ts:
                pool._ends[index] = end
                return pool._lanes[index]
        pool._ends.append(end)
        lane = self.lane(pool.process, f"{pool.thread} {len(pool._lanes)}")
        pool._lanes.append(lane)
        return lane
