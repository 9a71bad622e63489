"""Fixtures for the sandbox tests: real sandboxed processes, real ``slime-async sandbox-server``
subprocesses on 127.0.0.1, and a watcher that records every descendant process so a test can
check that none outlived its run."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest

from slime_async.sandbox import Sandbox, SandboxLimits
from slime_async.sandbox.pool import probe_isolation

# Each sandbox in these tests has its own uid range, away from the default (65000), so a sandbox
# another test (or another program on this machine) runs cannot be mistaken for a leftover.
LIBRARY_UID_BASE = 64100
SERVER_UID_BASES = (64200, 64300)
SLOTS = 4

# Small limits keep the fork bomb and the allocation cheap on 2 busy cores.
TEST_LIMITS = SandboxLimits(timeout_s=10.0, max_timeout_s=30.0, cpu_s=20, memory_bytes=512 << 20,
                            file_bytes=1 << 20, processes=16, output_bytes=64 << 10, uid_base=LIBRARY_UID_BASE)

ISOLATION = probe_isolation()
# What these tests check needs both (as root here); elsewhere they say why they did not run.
FORK_BOMB = """
import os
print("bomb", flush=True)
while True:
    try:
        os.fork()
    except OSError:
        pass
"""

requires_root = pytest.mark.skipif(
    os.geteuid() != 0 or not ISOLATION.namespaces,
    reason=f"the sandbox drops to unprivileged uids only as root; isolation here: {ISOLATION.detail}")


def processes_of_uids(first_uid: int, count: int) -> list[psutil.Process]:
    """Every process on this machine running as one of the sandbox's slot uids."""
    found = []
    for process in psutil.process_iter(["uids"]):
        uids = process.info["uids"]
        if uids is not None and first_uid <= uids.real < first_uid + count:
            found.append(process)
    return found


@dataclass
class DescendantWatch:
    """Scans the descendants of ``root_pid`` every few ms while active; ``survivors()`` are the
    recorded ones that still exist (same pid and start time) afterwards."""

    root_pid: int
    seen: dict[int, float] = field(default_factory=dict)
    # Descendants alive before the watch began (other tests' session fixtures, a CPU engine):
    # not the sandbox's, so never counted as left behind by it.
    before: set[int] = field(default_factory=set)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def _scan(self) -> None:
        try:
            children = psutil.Process(self.root_pid).children(recursive=True)
        except psutil.Error:
            return
        for child in children:
            try:
                self.seen.setdefault(child.pid, child.create_time())
            except psutil.Error:
                pass

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._scan()
            time.sleep(0.005)

    def __enter__(self) -> "DescendantWatch":
        self._scan()
        self.before = set(self.seen)
        self.seen.clear()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def survivors(self, ignore: set[int] = frozenset()) -> list[int]:
        alive = []
        for pid, created in self.seen.items():
            if pid in ignore or pid in self.before:
                continue
            try:
                process = psutil.Process(pid)
                if process.create_time() == created and process.status() != psutil.STATUS_ZOMBIE:
                    alive.append(pid)
            except psutil.Error:
                pass
        return alive


def assert_nothing_left(watch: DescendantWatch, first_uid: int, ignore: set[int] = frozenset()) -> None:
    """No recorded descendant and no process of the sandbox's uids is alive (a short grace for
    the kernel to finish the SIGKILLs it has already sent)."""
    deadline = time.monotonic() + 2.0
    while True:
        survivors = watch.survivors(ignore)
        by_uid = [p.pid for p in processes_of_uids(first_uid, SLOTS)]
        if not survivors and not by_uid:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"processes left behind: descendants {survivors}, sandbox uids {by_uid}")
        time.sleep(0.05)


@pytest.fixture
def sandbox() -> Sandbox:
    return Sandbox(TEST_LIMITS, max_concurrency=SLOTS)


@dataclass
class SandboxServer:
    process: subprocess.Popen
    url: str
    uid_base: int

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


SECRET = "sandbox-test-secret-7f3a"
API_KEY = "test-key"


def start_server(uid_base: int, api_key: str | None = API_KEY) -> SandboxServer:
    env = {**os.environ, "SANDBOX_TEST_SECRET": SECRET}
    argv = [sys.executable, "-m", "actors.loop.cli", "sandbox-server", "--host", "127.0.0.1", "--port", "0",
            "--max-concurrency", str(SLOTS), "--uid-base", str(uid_base), "--timeout-s", "10",
            "--max-timeout-s", "30", "--processes", "16", "--memory-bytes", str(512 << 20),
            "--output-bytes", str(64 << 10), "--log-level", "warning"]
    if api_key:
        argv += ["--api-key", api_key]
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                               cwd=Path(__file__).resolve().parents[2])
    lines = []
    for line in process.stdout:
        lines.append(line)
        if line.startswith("sandbox server listening on "):
            url = line.split()[4]
            # Keep draining its output so a chatty server never blocks on a full pipe.
            threading.Thread(target=lambda: [None for _ in process.stdout], daemon=True).start()
            return SandboxServer(process, url, uid_base)
    process.wait()
    raise RuntimeError(f"sandbox server exited with {process.returncode}:\n{''.join(lines)}")


@pytest.fixture(scope="module")
def server() -> Iterator[SandboxServer]:
    started = start_server(SERVER_UID_BASES[0])
    yield started
    started.stop()
