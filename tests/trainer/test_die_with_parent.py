"""A rank dies with the torchrun that started it, also where the kernel's death signal does not
reach it (a fresh-clone suite run found a rank alive, reparented, 30 s after its torchrun died)."""

import os
import subprocess
import sys
import time

import psutil

# The grandchild: prctl is made to fail, so only die_with_parent's own watch of its parent is left.
GRANDCHILD = """
import ctypes, time
class _NoPrctl:
    def __init__(self, *args, **kwargs): pass
    def __getattr__(self, name): raise OSError("no prctl here")
ctypes.CDLL = _NoPrctl
import os
from actors.megatron.worker import die_with_parent
die_with_parent()
if os.environ.get("FORK_HELPER"):  # as megatron-core's checkpoint writer forks its Manager
    helper = os.fork()
    if helper == 0:
        time.sleep(120)
        os._exit(0)
    print("armed", helper, flush=True)
else:
    print("armed", os.getpid(), flush=True)
time.sleep(120)
"""

# The child: starts the grandchild, says its pid once it is armed, then dies without a word.
CHILD = f"""
import os, subprocess, sys
grandchild = subprocess.Popen([sys.executable, "-c", {GRANDCHILD!r}], stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, text=True)
word, pid = grandchild.stdout.readline().split()
assert word == "armed"
if os.environ.get("FORK_HELPER"):
    grandchild.kill()  # the rank dies: its forked helper must follow
print(pid, flush=True)
os._exit(0)
"""


def wait_gone(pid: int) -> None:
    deadline = time.monotonic() + 30
    while psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline, f"pid {pid} outlived its parent by 30 s"
        time.sleep(0.1)


def test_a_process_whose_parent_died_exits_even_without_the_death_signal():
    child = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=120)
    wait_gone(int(child.stdout.strip()))


def test_a_helper_the_rank_forked_exits_when_the_rank_dies():
    env = {**os.environ, "FORK_HELPER": "1"}
    child = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=120, env=env)
    wait_gone(int(child.stdout.strip()))


def test_a_spawn_child_arms_its_death_watch_before_it_imports_torch():
    # A spawn child holds the rank's resource-tracker pipe from its start: the watch must not wait
    # for torch's import (seconds on a busy host), or the tracker outlives a killed rank that long.
    import subprocess
    import sys

    probe = ("import sys, actors.megatron.parent_death as p; assert 'torch' not in sys.modules, 'torch imported';"
             "import actors.trainer.worker, actors.critic.worker")
    subprocess.run([sys.executable, "-c", probe], check=True, timeout=300)
