"""The program around a supervision tree: a signal during start-up stops it at once, and the
console's last line names the first failure, not the symptom the loop saw."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

from tests.runtime.processes import alive

PY = sys.executable
HERE = Path(__file__).parent
REPO = HERE.parent.parent


def _program(mode: str, log_dir: Path, **kwargs) -> subprocess.Popen:
    return subprocess.Popen([PY, str(HERE / "tree_program.py"), mode, str(log_dir)], text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO)}, **kwargs)


def test_sigterm_during_start_up_stops_the_tree_and_every_descendant(tmp_path):
    main = _program("startup", tmp_path, stderr=subprocess.PIPE)
    try:
        seen: set[int] = set()
        deadline = time.monotonic() + 30
        # grandparent + its grandchild + the child that never gets ready: start-up is under way
        while len(seen) < 3 and time.monotonic() < deadline:
            try:
                seen |= {p.pid for p in psutil.Process(main.pid).children(recursive=True)}
            except psutil.Error:
                pass
            time.sleep(0.05)
        assert len(seen) >= 3, "the tree did not start its children"
        main.send_signal(signal.SIGTERM)
        assert main.wait(timeout=15) == 128 + signal.SIGTERM.value
        deadline = time.monotonic() + 5
        while alive(seen) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not alive(seen)
        assert "received SIGTERM during start-up" in main.stderr.read()
    finally:
        main.kill()


def test_the_last_line_names_the_child_that_failed_not_the_actor_the_loop_lost(tmp_path):
    main = _program("lost", tmp_path, stderr=subprocess.PIPE)
    try:
        _, stderr = main.communicate(timeout=60)
    finally:
        main.kill()
    assert main.returncode == 1
    last = stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") and "child 'worker'" in last and "exited with code 3" in last, stderr[-2000:]
    assert "ActorStopped" not in stderr
