"""The chaos driver's processes: each tree it starts is followed while it runs and stopped whole,
and recorded on disk so that the next call on the same host can end what a killed call left.

On the one-GPU host a fault's run must be gone, every SGLang scheduler with it, before the next
fault's SGLang starts: a survivor would hold GPU memory and the next engine would not fit. And a
device call cut at its time limit kills the driver, not the run (its own session): the run and
its engine would hold the GPU into the next call unless that call ends them first (``reap``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import psutil


class Tree:
    """A process started in its own session (its group id is its pid) and every descendant seen
    while it ran (``track``), kept even once re-parented to init."""

    def __init__(self, process: subprocess.Popen, registry: Path | None = None):
        self.process = process
        self.seen: dict[int, psutil.Process] = {}
        self.registry = registry
        if registry is not None:
            record(registry, process.pid)

    def track(self) -> None:
        roots = [self.process.pid, *self.seen]
        for pid in roots:
            try:
                for child in psutil.Process(pid).children(recursive=True):
                    self.seen.setdefault(child.pid, child)
            except psutil.Error:
                pass

    def members(self) -> list[psutil.Process]:
        """The live processes of the tree: its descendants, then the root."""
        self.track()
        alive = [proc for proc in self.seen.values() if _alive(proc)]
        if self.process.poll() is None:
            alive.append(psutil.Process(self.process.pid))
        return alive

    def kill9(self, timeout: float = 60.0) -> None:
        """SIGKILL of the whole tree at once (a crash), then until every member is gone."""
        members = self.members()
        _signal_group(self.process.pid, signal.SIGKILL)
        for proc in members:
            _send(proc, signal.SIGKILL)
        self.process.wait()
        psutil.wait_procs(members, timeout=timeout)
        if self.registry is not None:
            forget(self.registry, self.process.pid)

    def stop(self, grace: float = 30.0) -> None:
        """SIGTERM (the run stops its children in order), SIGKILL of what is left after ``grace``
        seconds, and back only once every member is gone (GPU memory freed)."""
        members = self.members()
        if self.process.poll() is None:
            _signal_group(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                pass
        _, left = psutil.wait_procs(members, timeout=grace if self.process.poll() is None else 10.0)
        if left or self.process.poll() is None:
            self.kill9()
        if self.registry is not None:
            forget(self.registry, self.process.pid)


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _send(proc: psutil.Process, sig: int) -> None:
    try:
        proc.send_signal(sig)
    except psutil.Error:
        pass


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _entries(registry: Path) -> list[dict]:
    try:
        return json.loads(registry.read_text())
    except (OSError, ValueError):
        return []


def record(registry: Path, pid: int) -> None:
    """Note a session leader this driver started: (pid, its start time), so a reused pid is not mistaken."""
    entries = _entries(registry)
    entries.append({"pid": pid, "created": psutil.Process(pid).create_time()})
    registry.write_text(json.dumps(entries))


def forget(registry: Path, pid: int) -> None:
    registry.write_text(json.dumps([e for e in _entries(registry) if e["pid"] != pid]))


def reap(registry: Path) -> list[str]:
    """End every tree an earlier driver recorded and did not stop (it was killed); what was ended."""
    ended = []
    for entry in _entries(registry):
        try:
            proc = psutil.Process(entry["pid"])
            if abs(proc.create_time() - entry["created"]) > 0.01:
                continue  # the pid was reused
            members = [*proc.children(recursive=True), proc]
            ended.append(f"{proc.pid} ({' '.join(proc.cmdline())[:120]})")
        except psutil.Error:
            continue
        _signal_group(entry["pid"], signal.SIGKILL)
        for member in members:
            _send(member, signal.SIGKILL)
        psutil.wait_procs(members, timeout=60)
    registry.unlink(missing_ok=True)
    return ended
