"""Every process a run started, recorded while it runs, so a test can check none outlives it.

A `DescendantTracker` scans the descendants of a root process (and of every process it has
recorded, so a child re-parented to init keeps being followed) every ``interval`` seconds on
a thread. A record is (pid, create time): a PID the kernel reuses later is not mistaken for
a survivor.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import psutil


@dataclass(frozen=True)
class Recorded:
    pid: int
    create_time: float
    cmdline: str

    def alive(self) -> bool:
        try:
            process = psutil.Process(self.pid)
            return process.create_time() == self.create_time and process.status() != psutil.STATUS_ZOMBIE
        except psutil.Error:
            return False

    def kill(self) -> None:
        try:
            process = psutil.Process(self.pid)
            if process.create_time() == self.create_time:
                process.kill()
        except psutil.Error:
            pass


class DescendantTracker:
    """Records the descendants of ``root_pid`` (not the root itself) until ``stop()``."""

    def __init__(self, root_pid: int, interval: float = 0.2):
        self.root_pid = root_pid
        self.interval = interval
        self._recorded: dict[tuple[int, float], Recorded] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"descendants-of-{root_pid}", daemon=True)
        self._thread.start()

    def recorded(self) -> list[Recorded]:
        with self._lock:
            return list(self._recorded.values())

    def matching(self, text: str) -> list[Recorded]:
        """Recorded processes whose command line contains ``text``."""
        return [r for r in self.recorded() if text in r.cmdline]

    def survivors(self) -> list[Recorded]:
        return [r for r in self.recorded() if r.alive()]

    def wait_all_gone(self, timeout: float) -> list[Recorded]:
        """Wait up to ``timeout`` s for every recorded process to end; returns those left."""
        deadline = time.monotonic() + timeout
        while (left := self.survivors()) and time.monotonic() < deadline:
            time.sleep(0.2)
        return left

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def kill_survivors(self) -> None:
        for record in self.survivors():
            record.kill()

    def scan(self) -> None:
        """One pass over /proc: record every process below the root or below a recorded one."""
        children: dict[int, list[psutil.Process]] = {}
        for process in psutil.process_iter(["ppid"]):
            children.setdefault(process.info["ppid"], []).append(process)
        with self._lock:
            known = {key[0] for key in self._recorded}
        todo = [self.root_pid, *known]
        seen = set(todo)
        while todo:
            for child in children.get(todo.pop(), []):
                try:
                    key = (child.pid, child.create_time())
                    # Re-read while it lives: a child first seen between fork and exec still shows
                    # its parent's command line.
                    cmdline = " ".join(child.cmdline())
                    if key not in self._recorded or self._recorded[key].cmdline != cmdline:
                        with self._lock:
                            self._recorded[key] = Recorded(child.pid, key[1], cmdline)
                except psutil.Error:
                    continue
                if child.pid not in seen:
                    seen.add(child.pid)
                    todo.append(child.pid)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.scan()
            self._stop.wait(self.interval)
