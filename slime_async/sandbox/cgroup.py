"""A memory cgroup per run: one limit for all of a run's processes together.

RLIMIT_AS bounds each process; without this, a run that forks ``processes`` children could use
``processes x memory_bytes`` of RAM. Uses cgroup v1's memory controller, below this process's
own memory cgroup, where it can create directories (root here); elsewhere ``probe`` returns None
and runs have only their per-process limit.
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from pathlib import Path

log = logging.getLogger(__name__)

V1_ROOT = Path("/sys/fs/cgroup/memory")


class MemoryCgroups:
    def __init__(self, parent: Path):
        self.parent = parent

    @classmethod
    def probe(cls) -> "MemoryCgroups | None":
        try:
            own = next(line.split(":", 2)[2].strip() for line in Path("/proc/self/cgroup").read_text().splitlines()
                       if line.split(":", 2)[1] == "memory")
        except (OSError, StopIteration, IndexError):
            return None
        pool = cls(V1_ROOT / own.lstrip("/"))
        try:
            pool.remove(pool.create(1 << 30))
        except OSError as error:
            log.info("no memory cgroup per sandbox run (%s): each process has RLIMIT_AS only", error)
            return None
        return pool

    def create(self, limit_bytes: int) -> Path:
        path = self.parent / f"slime-sandbox-{os.getpid()}-{uuid.uuid4().hex[:12]}"
        path.mkdir()
        try:
            (path / "memory.limit_in_bytes").write_text(str(limit_bytes))
            try:  # RAM plus swap, so the run cannot swap its way past the limit
                (path / "memory.memsw.limit_in_bytes").write_text(str(limit_bytes))
            except OSError:
                pass  # no swap accounting on this kernel
        except OSError:
            path.rmdir()
            raise
        return path

    @staticmethod
    def oom_killed(path: Path) -> bool:
        """Whether the kernel's OOM killer ended a process of this run at its limit."""
        try:
            for line in (path / "memory.oom_control").read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value) > 0
        except (OSError, ValueError):
            pass
        return False

    @staticmethod
    def remove(path: Path) -> None:
        """rmdir once its last process is gone (the kernel may take a moment after the kill)."""
        for _ in range(40):
            try:
                path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:
                time.sleep(0.05)
        log.warning("could not remove the sandbox memory cgroup %s", path)
