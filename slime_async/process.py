"""Process children: actors that own one OS process (an SGLang server, a CPU engine, torchrun).

The process runs in its own process group (``start_new_session``), so stopping it with
``killpg`` also reaches its grandchildren (torchrun's ranks, SGLang's scheduler processes).
Its stdout/stderr go to ``<log_dir>/<name>.log``; the console only shows the last lines when it
fails. An exit that nobody asked for is noticed at once (a task awaits ``wait()``) and fails
the actor, which is how its supervisor learns of it.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import os
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import psutil

from slime_async.actor import Actor
from slime_async.exception_text import exception_section, log_exception, log_window

log = logging.getLogger(__name__)

ReadinessProbe = Callable[[], Awaitable[bool]]


@dataclass
class ProcessSpec:
    """What to run and how to tell it is ready."""

    name: str
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)  # added to this process's environment
    cwd: str | None = None
    ready: ReadinessProbe | None = None  # None: ready as soon as it is started
    ready_timeout: float = 120.0
    ready_interval: float = 0.2
    stop_timeout: float = 10.0  # SIGTERM grace period before SIGKILL


class ProcessExited(RuntimeError):
    """The process ended although nobody stopped it; the message ends with the exception it
    printed, if any (``child_exception``: what the console shows last)."""

    def __init__(self, name: str, returncode: int | None, log_path: Path, tail: str, exception: str = ""):
        self.child_exception = exception_section(name, exception)
        super().__init__(
            f"process {name!r} exited with code {returncode}; last lines of {log_path}:\n{tail}"
            + (f"\n{self.child_exception}" if self.child_exception else "")
        )
        self.returncode = returncode
        self.log_path = log_path
        self.exception = exception


class ReadinessTimeout(RuntimeError):
    def __init__(self, message: str, exception: str = ""):
        self.child_exception = exception
        super().__init__(message + (f"\n{exception}" if exception else ""))


def exited(name: str, returncode: int | None, log_path: Path) -> ProcessExited:
    """The ProcessExited of the child logging to ``log_path``: its tail and its own exception."""
    return ProcessExited(name, returncode, log_path, log_tail(log_path), log_exception(log_window(log_path)))


def http_ready(url: str, timeout: float = 2.0) -> ReadinessProbe:
    """A probe that is ready when ``GET url`` answers 200."""

    async def probe() -> bool:
        try:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as session:
                async with session.get(url) as response:
                    return response.status == 200
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
            return False

    probe.url = url  # lets a node agent run the same probe on the child's node (slime_async.cluster)
    return probe


def log_tail(path: Path, lines: int = 20) -> str:
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - 64 * 1024))
            text = handle.read().decode("utf-8", "replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


class ProcessChild(Actor):
    def __init__(self, spec: ProcessSpec, log_dir: str | Path):
        super().__init__(spec.name)
        self.spec = spec
        self.log_path = Path(log_dir) / f"{spec.name}.log"
        self.process: asyncio.subprocess.Process | None = None
        self._stopping_process = False

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    async def on_start(self) -> None:
        spec = self.spec
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log_file:
            log_file.write(f"=== {time.strftime('%F %T')} start: {' '.join(spec.argv)}\n".encode())
            log_file.flush()
            self.process = await asyncio.create_subprocess_exec(
                *spec.argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=log_file,
                stderr=asyncio.subprocess.STDOUT,
                env={**os.environ, **spec.env},
                cwd=spec.cwd,
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        log.info("started %s (pid %d), log %s", spec.name, self.process.pid, self.log_path)
        try:
            await self._await_ready()
        except BaseException:
            await self._terminate()
            raise
        self.spawn(self._watch_exit(), name=f"{spec.name}:exit")

    async def _await_ready(self) -> None:
        spec = self.spec
        if spec.ready is None:
            return
        deadline = time.monotonic() + spec.ready_timeout
        while True:
            if self.process.returncode is not None:
                raise exited(spec.name, self.process.returncode, self.log_path)
            if await spec.ready():
                return
            if time.monotonic() > deadline:
                # A server whose worker died may hang instead of exiting: its exception says why.
                raise ReadinessTimeout(
                    f"process {spec.name!r} was not ready within {spec.ready_timeout:g} s; "
                    f"last lines of {self.log_path}:\n{log_tail(self.log_path)}",
                    exception_section(spec.name, log_exception(log_window(self.log_path))),
                )
            await asyncio.sleep(spec.ready_interval)

    async def _watch_exit(self) -> None:
        returncode = await self.process.wait()
        if self._stopping_process:
            return
        if returncode == 0:  # finished its job: a normal exit (transient children stay down)
            log.info("%s exited with code 0", self.spec.name)
            self.exit()
            return
        raise exited(self.spec.name, returncode, self.log_path)

    async def on_stop(self) -> None:
        await self._terminate()

    async def _terminate(self) -> None:
        """SIGTERM the process group, wait, then SIGKILL everything that is left."""
        process = self.process
        if process is None:
            return
        self._stopping_process = True
        started = time.monotonic()
        # Descendants that left the group (setsid) are found through the process tree.
        descendants = _descendants(process.pid)
        _signal_group(process.pid, signal.SIGTERM)
        try:
            await asyncio.wait_for(process.wait(), self.spec.stop_timeout)
        except asyncio.TimeoutError:
            log.warning("%s ignored SIGTERM for %g s: killing it", self.spec.name, self.spec.stop_timeout)
        _signal_group(process.pid, signal.SIGKILL)
        for child in descendants:
            try:
                child.kill()
            except psutil.Error:
                pass
        await process.wait()
        log.info("stopped %s (pid %d) in %.1f s", self.spec.name, process.pid, time.monotonic() - started)


def _descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In the child before exec: get SIGKILL if the supervisor dies without cleaning up
    (e.g. it was SIGKILLed itself), so no engine or trainer outlives a crashed run."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        except OSError:
            pass
