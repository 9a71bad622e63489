"""Every process a run started, recorded while it runs, so a test can check none outlives it.

A `DescendantTracker` scans the descendants of a root process (and of every process it has
recorded, so a child re-parented to init keeps being followed) every ``interval`` seconds on
a thread. A record is (pid, start time): a PID the kernel reuses later is not mistaken for a
survivor. It reads /proc itself: psutil.process_iter caches Process objects across calls, and
on a busy machine whose PIDs wrap within minutes a cached object can stand for a new process.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from dataclasses import dataclass


def _stat(pid: int) -> tuple[str, int, int] | None:
    """(state, ppid, start time in clock ticks) of a live process, None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            text = handle.read().decode(errors="replace")
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()  # after "pid (comm) "; comm may hold spaces
    return fields[0], int(fields[1]), int(fields[19])


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return handle.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


@dataclass(frozen=True)
class Recorded:
    pid: int
    start_ticks: int
    cmdline: str

    def alive(self) -> bool:
        stat = _stat(self.pid)
        return stat is not None and stat[2] == self.start_ticks and stat[0] != "Z"

    def kill(self) -> None:
        if self.alive():
            try:
                os.kill(self.pid, signal.SIGKILL)
            except OSError:
                pass


class DescendantTracker:
    """Records the descendants of ``root_pid`` (not the root itself) until ``stop()``."""

    def __init__(self, root_pid: int, interval: float = 0.2):
        self.root_pid = root_pid
        self.interval = interval
        self._recorded: dict[tuple[int, int], Recorded] = {}
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

    def describe(self, records: list[Recorded]) -> list[str]:
        """Each survivor's state and parent, and which processes hold its pipes (a resource tracker
        lives until the last holder of its pipe's other end exits)."""
        return [f"{r} state/ppid {(_stat(r.pid) or ('gone', 0, 0))[:2]} pipes shared with {pipe_holders(r.pid)}"
                for r in records]

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def kill_survivors(self) -> None:
        for record in self.survivors():
            record.kill()

    def scan(self) -> None:
        """One pass over /proc: record every process below the root or below a recorded one."""
        children: dict[int, list[tuple[int, int]]] = {}
        for entry in os.listdir("/proc"):
            if entry.isdigit() and (stat := _stat(int(entry))) is not None:
                children.setdefault(stat[1], []).append((int(entry), stat[2]))
        with self._lock:
            todo = [self.root_pid, *{pid for pid, _ in self._recorded}]
            seen = set(todo)
            while todo:
                for pid, start in children.get(todo.pop(), []):
                    # Re-read while it lives: a child first seen between fork and exec still shows
                    # its parent's command line.
                    cmdline = _cmdline(pid)
                    known = self._recorded.get((pid, start))
                    if known is None or (cmdline and known.cmdline != cmdline):
                        self._recorded[(pid, start)] = Recorded(pid, start, cmdline)
                    if pid not in seen:
                        seen.add(pid)
                        todo.append(pid)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.scan()
            self._stop.wait(self.interval)


def _pipes(pid: int) -> set[str]:
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return set()
    links = set()
    for name in names:
        try:
            links.add(os.readlink(f"/proc/{pid}/fd/{name}"))
        except OSError:
            pass
    return {link for link in links if link.startswith("pipe:")}


def pipe_holders(pid: int) -> dict[int, str]:
    """Other processes that hold one of ``pid``'s pipes open: pid -> command line."""
    pipes = _pipes(pid)
    holders = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != pid and pipes & _pipes(int(entry)):
            holders[int(entry)] = _cmdline(int(entry))[:120]
    return holders
