"""One torchrun group of Megatron ranks as one supervised child of the trainer actor.

`TorchrunGroup` owns the torchrun process (here or on a node's agent) and watches its ranks' pids:
a rank killed by a signal is gone seconds before its torchrun notices. Its end fails the child with
`TrainerRankDied`, the error the user sees: which rank, its pid, the log's tail and torchrun's own
"first observed failure".
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Sequence
from pathlib import Path

import psutil

from actors.megatron.protocol import RankInfo
from slime_async.actor import Actor, ActorFailed, ActorRef, spawn
from slime_async.exception_text import exception_section, log_exception, log_window
from slime_async.process import ProcessExited, log_tail
from slime_async.task_group import task_group

# How long to let torchrun write its failure summary after a rank died, before reporting.
DEATH_REPORT_GRACE = 5.0
WATCH_INTERVAL = 0.1


class TrainerRankDied(RuntimeError):
    def __init__(self, rank: int | None, pid: int | None, log_path: Path, tail: str, detail: str = "",
                 group: str = "trainer", log_text: str | None = None):
        """``log_text``: the log to find the rank's exception in (``tail`` when None)."""
        who = f"{group} rank {rank} (pid {pid})" if rank is not None else f"the {group} (torchrun)"
        message = f"{who} died{': ' + detail if detail else ''}; last lines of {log_path}:\n{tail}"
        # The rank's own exception last, not torchrun's ChildFailedError summary.
        self.child_exception = exception_section(who, log_exception(tail if log_text is None else log_text))
        if self.child_exception:
            message += f"\n{self.child_exception}"
        super().__init__(message)
        self.rank = rank
        self.pid = pid
        self.log_path = log_path
        self.group = group  # "trainer" (the policy) or "critic"


def _pid_alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


_ROOT_CAUSE = re.compile(r"Root Cause \(first observed failure\):.*?\brank\s*:\s*(\d+)", re.DOTALL)


def _root_cause_rank(torchrun_log: str) -> int | None:
    """The global rank torchrun's failure summary names as the first observed failure, in the
    log since its latest start (``log_window``)."""
    match = _ROOT_CAUSE.search(torchrun_log)
    return int(match.group(1)) if match else None


class TorchrunGroup(Actor):
    """One torchrun (one node's policy ranks, or the critic's) as one supervised child: the
    process (here or on a node's agent) and a watch of the pids of ``ranks()`` (those on this
    host, once they have joined), because a rank killed by a signal is gone seconds before its
    torchrun notices. Its end fails this actor with the `TrainerRankDied` the user sees, handed
    to ``report`` first: pending calls fail at once, not after the other groups have stopped."""

    def __init__(self, process: Actor, group: str, ranks: Callable[[], Sequence[RankInfo]],
                 report: Callable[[TrainerRankDied], None]):
        super().__init__(process.name)
        self.process, self.group, self.ranks, self.report = process, group, ranks, report

    async def on_start(self) -> None:
        await spawn(self.process)
        self.spawn(self._watch(), name=f"{self.name}:watch")

    async def on_stop(self) -> None:
        await self.process.ref.stop()

    async def _watch(self) -> None:
        dead: list[RankInfo] = []
        async with task_group() as tasks:
            exited = tasks.create_task(_exit_error(self.process.ref))
            while not (exited.done() or dead):
                await asyncio.wait([exited], timeout=WATCH_INTERVAL)
                dead = [info for info in self.ranks() if not _pid_alive(info.pid)]
            # When a rank died first, torchrun notices too and prints which rank failed and how.
            await asyncio.wait([exited], timeout=DEATH_REPORT_GRACE)
            exited.cancel()
        error = None if exited.cancelled() else exited.result()
        detail = ""
        if isinstance(error, ProcessExited):
            detail = f"torchrun exited with code {error.returncode}"
        elif error is not None:  # e.g. the agent of its node went away
            detail = str(error).partition("\n")[0] or repr(error)
        tail = log_tail(self.process.log_path, 30)
        # The whole end of the log: torchrun's summary holds the rank's full traceback (@record).
        window = log_window(self.process.log_path)
        # Ranks that torchrun stopped after the first failure are dead too by now: prefer
        # torchrun's own "first observed failure", then the first rank seen dead.
        root = _root_cause_rank(window)
        first = next((info for info in self.ranks() if info.rank == root), None) or (dead[0] if dead else None)
        death = TrainerRankDied(first.rank if first else None, first.pid if first else None,
                                self.process.log_path, tail, detail, group=self.group,
                                log_text=window)
        self.report(death)
        raise death


async def _exit_error(ref: ActorRef) -> BaseException | None:
    """How the actor ended: None when it stopped normally, else its error."""
    try:
        await ref.wait()
    except ActorFailed as failed:
        return failed.error
    return None
