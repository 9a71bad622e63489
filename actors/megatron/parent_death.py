"""Die with the parent process: a rank with torchrun, a rank's forked and spawned helpers with the rank.

Light on purpose (the standard library only): a multiprocessing "spawn" child of a rank imports
this before torch, so it holds the rank's resource-tracker pipe (passed to every spawn child) for
as short a time as possible without a death watch. Importing torch takes seconds on a busy host,
and a child killed-by-nobody for that long kept the tracker alive after the rank was gone.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time


def die_with_parent() -> None:
    """SIGKILL this process when its parent dies (PR_SET_PDEATHSIG): nobody would stop it otherwise.

    The signal fires when the parent *thread* that started us ends: torchrun starts its ranks
    from its main thread, and a rank runs its ops (checkpoint saves included) on its main thread.

    A worker program calls it also when it is imported as ``__mp_main__``: a multiprocessing
    "spawn" child of a rank imports the rank's main module under that name. megatron-core's
    checkpoint writer starts such a child at the first save: a Manager (~330 MB, it imports
    torch) whose resource tracker lives as long as it does. Neither would notice the rank being
    killed; this makes the Manager die with it (and the tracker then exits at the end of its pipe).
    """
    parent = os.getppid()
    if parent == 1:  # orphaned already: the parent died before we got here
        os._exit(1)
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except OSError:
            pass
        if os.getppid() != parent:  # the parent died before the signal was armed
            os._exit(1)
    # And a watch of our own, where the death signal does not reach (it is not armed yet, or the
    # kernel has none).
    threading.Thread(target=_exit_when_orphaned, args=(parent,), name="die-with-parent", daemon=True).start()
    # A fork keeps neither the death signal nor the thread: megatron-core's checkpoint writer forks
    # a Manager from the rank, which a fresh-clone suite run found alive, reparented, 30 s after the
    # rank and its torchrun were killed. Each forked child arms both again, against the rank.
    if not _armed_at_fork:
        _armed_at_fork.append(True)
        os.register_at_fork(after_in_child=die_with_parent)


_armed_at_fork: list[bool] = []  # die_with_parent registered itself for forked children (once per process)


def _exit_when_orphaned(parent: int, interval_s: float = 1.0) -> None:
    while os.getppid() == parent:
        time.sleep(interval_s)
    os._exit(1)
