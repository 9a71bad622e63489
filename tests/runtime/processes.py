"""Process checks the tests of stopping a process tree share."""

from __future__ import annotations

import psutil


def alive(pids: set[int]) -> set[int]:
    """Those of ``pids`` that still run (a zombie awaiting its reaper counts as gone)."""
    running = set()
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                running.add(pid)
        except psutil.NoSuchProcess:
            pass
    return running
