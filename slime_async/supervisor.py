"""Supervisors in the manner of Erlang/OTP.

A supervisor starts its children in order and stops them in reverse. A child marked
``start_early`` begins starting with the supervisor, beside the children before it (a process
that needs seconds to come up need not wait for theirs); it still takes its place in the order,
so it is stopped as if it had started at its turn. When a child ends, its
restart type decides what happens: ``permanent`` children are always restarted, ``transient``
ones only after a failure, ``temporary`` ones never. The strategy says which children restart
together: ``one_for_one`` restarts only the failed child, ``rest_for_one`` also those started
after it (they may depend on it). More than ``max_restarts`` restarts within ``max_seconds``
means something is persistently broken: the supervisor stops all children and fails with
``SupervisorGaveUp`` naming the child and its last error, which propagates to its own
supervisor (supervisors are actors, so they nest) and, at the root, ends the run non-zero.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from slime_async.actor import Actor, ActorFailed, ActorRef, _Message

log = logging.getLogger(__name__)


class Restart(enum.Enum):
    PERMANENT = "permanent"
    TRANSIENT = "transient"
    TEMPORARY = "temporary"


class Strategy(enum.Enum):
    ONE_FOR_ONE = "one_for_one"
    REST_FOR_ONE = "rest_for_one"


@dataclass(frozen=True)
class ChildSpec:
    """How to start a child (``start`` returns a running actor) and whether to restart it."""

    name: str
    start: Callable[[], Awaitable[ActorRef]]
    restart: Restart = Restart.PERMANENT
    start_early: bool = False  # the first start only; a restart starts at its turn


class SupervisorGaveUp(RuntimeError):
    def __init__(self, supervisor: str, child: str, error: BaseException | None, restarts: int, seconds: float):
        reason = f"{type(error).__name__}: {error}" if error is not None else "exited"
        super().__init__(
            f"supervisor {supervisor!r} gave up: child {child!r} needed more than {restarts} "
            f"restarts in {seconds:g} s; last error: {reason}"
        )
        self.child = child
        self.error = error


@dataclass
class _Running:
    spec: ChildSpec
    ref: ActorRef
    watcher: asyncio.Task


class Supervisor(Actor):
    def __init__(
        self,
        name: str,
        children: list[ChildSpec],
        *,
        strategy: Strategy = Strategy.ONE_FOR_ONE,
        max_restarts: int = 3,
        max_seconds: float = 5.0,
    ):
        super().__init__(name)
        names = [spec.name for spec in children]
        if len(set(names)) != len(names):
            raise ValueError(f"supervisor {name!r}: duplicate child names in {names}")
        self.specs = list(children)
        self.strategy = strategy
        self.max_restarts = max_restarts
        self.max_seconds = max_seconds
        self._live: dict[str, _Running] = {}
        self._restart_times: deque[float] = deque()

    # ----- lifecycle ------------------------------------------------------------------------
    async def on_start(self) -> None:
        loop = asyncio.get_running_loop()
        early = {spec.name: loop.create_task(spec.start(), name=f"{self.name}:start:{spec.name}")
                 for spec in self.specs if spec.start_early}
        try:
            for spec in self.specs:
                await self._start_child(spec, early.pop(spec.name, None))
        except BaseException:
            await _abandon(list(early.values()))
            await self._stop_children(list(self._live))
            raise

    async def on_stop(self) -> None:
        await self._stop_children([spec.name for spec in self.specs if spec.name in self._live])

    # ----- handlers -------------------------------------------------------------------------
    def children(self) -> dict[str, ActorRef]:
        """The running children by name, in start order."""
        return {s.name: self._live[s.name].ref for s in self.specs if s.name in self._live}

    def child(self, name: str) -> ActorRef:
        if name not in self._live:
            raise KeyError(f"supervisor {self.name!r} has no running child {name!r}")
        return self._live[name].ref

    async def _child_exited(self, name: str, error: BaseException | None) -> None:
        running = self._live.pop(name, None)
        if running is None:  # we stopped it ourselves
            return
        spec = running.spec
        if error is not None:
            log.error("supervisor %s: child %s failed: %s", self.name, name, error)
        else:
            log.info("supervisor %s: child %s exited", self.name, name)
        if spec.restart is Restart.TEMPORARY or (spec.restart is Restart.TRANSIENT and error is None):
            if spec.restart is Restart.TEMPORARY:
                self.specs.remove(spec)
            return
        if not self._may_restart():
            self.fail(SupervisorGaveUp(self.name, name, error, self.max_restarts, self.max_seconds))
            return
        to_restart = [spec]
        if self.strategy is Strategy.REST_FOR_ONE:
            later = self.specs[self.specs.index(spec) + 1 :]
            await self._stop_children([s.name for s in later if s.name in self._live])
            to_restart += later
        for restart_spec in to_restart:
            try:
                await self._start_child(restart_spec)
            except Exception as start_error:  # noqa: BLE001
                log.error("supervisor %s: restarting %s failed: %s", self.name, restart_spec.name, start_error)
                # A failed restart counts against the intensity like any other failure.
                await self._child_exited_unstarted(restart_spec, start_error)
                return

    async def _child_exited_unstarted(self, spec: ChildSpec, error: BaseException) -> None:
        if not self._may_restart():
            self.fail(SupervisorGaveUp(self.name, spec.name, error, self.max_restarts, self.max_seconds))
            return
        self._mailbox.put_nowait(_Message("_retry_start", (spec.name, error), {}))

    async def _retry_start(self, name: str, error: BaseException) -> None:
        spec = next(s for s in self.specs if s.name == name)
        try:
            await self._start_child(spec)
        except Exception as start_error:  # noqa: BLE001
            await self._child_exited_unstarted(spec, start_error)

    # ----- internals ------------------------------------------------------------------------
    def _may_restart(self) -> bool:
        now = time.monotonic()
        while self._restart_times and now - self._restart_times[0] > self.max_seconds:
            self._restart_times.popleft()
        if len(self._restart_times) >= self.max_restarts:
            return False
        self._restart_times.append(now)
        return True

    async def _start_child(self, spec: ChildSpec, started: Awaitable[ActorRef] | None = None) -> ActorRef:
        ref = await (spec.start() if started is None else started)
        watcher = asyncio.get_running_loop().create_task(self._watch(spec.name, ref), name=f"{self.name}:watch:{spec.name}")
        self._live[spec.name] = _Running(spec, ref, watcher)
        return ref

    async def _watch(self, name: str, ref: ActorRef) -> None:
        try:
            await ref.wait()
            error = None
        except ActorFailed as failed:
            error = failed.error
        except asyncio.CancelledError:
            return
        if self.running:
            # Route the exit through the mailbox so restarts are serialised with other messages.
            self._mailbox.put_nowait(_Message("_child_exited", (name, error), {}))

    async def _stop_children(self, names: list[str]) -> None:
        for name in reversed(names):
            running = self._live.pop(name, None)
            if running is None:
                continue
            running.watcher.cancel()
            try:
                await running.ref.stop()
            except Exception as error:  # noqa: BLE001
                log.error("supervisor %s: stopping %s failed: %r", self.name, name, error)


async def _abandon(starts: list[asyncio.Task]) -> None:
    """Early starts of a supervisor whose start failed: cancel those still starting, stop those
    already up (their actors undo a cancelled start themselves, as under a signal)."""
    for task in starts:
        task.cancel()
    for result in await asyncio.gather(*starts, return_exceptions=True):
        if isinstance(result, ActorRef):
            try:
                await result.stop()
            except Exception as error:  # noqa: BLE001
                log.error("stopping an early-started child failed: %r", error)
