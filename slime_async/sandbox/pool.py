"""``Sandbox``: runs code in a contained child process, at most ``max_concurrency`` at once.

Each run starts ``jail.py`` (which sets up the namespaces, limits and the unprivileged uid),
feeds it the spec and the program's stdin, reads stdout/stderr incrementally up to
``output_bytes`` each, and kills its whole process group on the wall timeout or when the
output limit is passed. Everything here is asyncio: the caller's loop never blocks on a child.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from slime_async.sandbox.cgroup import MemoryCgroups
from slime_async.sandbox.limits import RunResult, SandboxLimits, check_request
from slime_async.sandbox.slots import SlotPool

log = logging.getLogger(__name__)

JAIL = str(Path(__file__).with_name("jail.py"))
CODE_FILES = {"python": "_main.py", "bash": "_main.sh"}
SYSTEM_PATH = "/usr/local/bin:/usr/bin:/bin"
READ_CHUNK = 64 << 10
PIPE_GRACE_S = 5.0  # after the kill, how long the output pipes may stay open
# How a program says an allocation failed under RLIMIT_AS (Python, libc, C++, bash).
MEMORY_ERROR = re.compile(r"MemoryError|Cannot allocate memory|std::bad_alloc|out of memory")
# ... and that a write passed RLIMIT_FSIZE (Python ignores SIGXFSZ and gets EFBIG; bash reports the
# child that SIGXFSZ killed).
FILE_SIZE_ERROR = re.compile(r"File too large|File size limit exceeded")


class SandboxError(RuntimeError):
    """The sandbox itself failed (not the code it ran): a setup error of the jail."""


@dataclass(frozen=True)
class Isolation:
    """What containment this machine allows, probed once when a ``Sandbox`` is made."""

    namespaces: bool  # new network, PID, mount, IPC and UTS namespaces per run
    as_root: bool  # runs drop to an unprivileged uid/gid (and RLIMIT_NPROC counts per run)
    detail: str

    @property
    def network_isolated(self) -> bool:
        return self.namespaces


def probe_isolation() -> Isolation:
    as_root = os.geteuid() == 0
    try:
        done = subprocess.run([sys.executable, "-I", "-S", JAIL, "--probe"], capture_output=True, text=True, timeout=30)
        report = json.loads(done.stdout)
    except (OSError, ValueError, subprocess.SubprocessError) as error:
        return Isolation(False, as_root, f"probe failed: {error}")
    if report["namespaces"]:
        how = "as root" if as_root else "inside a user namespace"
        return Isolation(True, as_root, f"network/PID/mount namespaces {how}")
    return Isolation(False, as_root, f"namespaces unavailable: {report['error']}")


def real_interpreter(python: str) -> str:
    """``python`` with the directories on its way resolved (a clone's ``.venv`` may be a symlink to
    another checkout's, which the run's own /tmp would not show), its file name kept: a venv's
    ``bin/python`` is a link to the base interpreter, and only its own path makes it the venv's."""
    path = Path(python).absolute()
    return str(path.parent.resolve() / path.name)


def interpreter_paths(python: str) -> list[Path]:
    """The directories the interpreter needs: its install prefix and, for a venv, the venv."""
    if python == real_interpreter(sys.executable):
        paths = {Path(sys.base_prefix).resolve(), Path(sys.prefix).resolve()}
    else:
        paths = {Path(python).resolve().parent.parent, Path(python).absolute().parent.parent}
    return sorted(paths)


def closed_ancestors(python: str) -> list[Path]:
    """Ancestors of the interpreter's directories that other users cannot enter (pyenv under
    /root): through them the run's uid could not even start it."""
    closed = []
    for path in interpreter_paths(python):
        for ancestor in reversed(path.parents):  # from / down
            if ancestor != Path("/") and not ancestor.stat().st_mode & stat.S_IXOTH:
                closed.append(ancestor)
                break
    return closed


def hidden_mounts(python: str, hidden_paths: tuple[str, ...]) -> list[tuple[str, list[str]]]:
    """(directory shown empty, paths below it bound back): the directories ``hidden_paths`` names
    and the closed ancestors of the interpreter; the interpreter's own directories stay visible."""
    needed = interpreter_paths(python)
    mounts: list[tuple[str, list[str]]] = []
    for directory in sorted({Path(p).resolve() for p in hidden_paths} | set(closed_ancestors(python))):
        if any(Path(earlier) in directory.parents for earlier, _ in mounts):
            continue  # already inside a hidden directory
        mounts.append((str(directory), [str(p) for p in needed if p == directory or directory in p.parents]))
    return mounts


class Sandbox:
    """In-process runner; see ``SandboxRunner`` for the ``run`` contract. One instance may serve
    several event loops (threads) at once; ``max_concurrency`` bounds them all together."""

    def __init__(self, limits: SandboxLimits | None = None, max_concurrency: int = 4,
                 isolation: Isolation | None = None):
        """``isolation``: what to use instead of probing (tests of the fallback without namespaces)."""
        self.limits = (limits or SandboxLimits()).validate(max_concurrency)
        self.max_concurrency = max_concurrency
        self.python = real_interpreter(self.limits.python or sys.executable)
        self.isolation = isolation or probe_isolation()
        self._hidden = hidden_mounts(self.python, self.limits.hidden_paths)
        # The run's /tmp is its own tmpfs: interpreter directories under the host's /tmp are bound back.
        self._workdir_keep = [str(p) for p in interpreter_paths(self.python) if Path("/tmp") in p.parents]
        if not self.isolation.namespaces:
            closed = closed_ancestors(self.python)
            if closed and self.isolation.as_root:
                raise ValueError(f"sandbox: the interpreter {self.python} lives under {closed[0]}, which the "
                                 "sandbox's uids cannot enter, and without a mount namespace it cannot be exposed "
                                 "to them; set the python limit (--python) to an interpreter every user can run")
            if self.limits.hidden_paths:
                raise ValueError("sandbox: hidden_paths needs a mount namespace, which this machine does not allow "
                                 f"({self.isolation.detail})")
        if not self.isolation.namespaces:
            log.warning("SANDBOX IS NOT ISOLATED: %s. Runs can reach the network, see this machine's "
                        "processes, and a double-forked daemon can outlive its run.", self.isolation.detail)
        if not self.isolation.as_root:
            log.warning("sandbox runs as uid %d (not root): no uid drop, no RLIMIT_NPROC; the process limit "
                        "is only watched (every 50 ms), not enforced by the kernel", os.geteuid())
        self._cgroups = MemoryCgroups.probe() if self.isolation.as_root else None
        if self._cgroups is None:
            log.warning("sandbox: no memory cgroup per run; a run may use up to processes x memory_bytes "
                        "(%d x %d bytes) of memory", self.limits.processes, self.limits.memory_bytes)
        self._slots = SlotPool(max_concurrency)
        self.runs = 0  # finished runs, for /health

    @property
    def running(self) -> int:
        return self._slots.in_use

    def describe(self) -> dict:
        return {"network_isolated": self.isolation.network_isolated, "namespaces": self.isolation.namespaces,
                "unprivileged_uid": self.isolation.as_root, "isolation": self.isolation.detail,
                "memory_cgroup": self._cgroups is not None,
                "max_concurrency": self.max_concurrency, "running": self.running, "runs": self.runs,
                "limits": self.limits.to_dict()}

    async def close(self) -> None:
        """Nothing outlives a run, so there is nothing to stop."""

    async def run(self, code: str, language: str = "python", stdin: str = "",
                  files: dict[str, str] | None = None, timeout_s: float | None = None) -> RunResult:
        timeout = check_request(self.limits, code, language, stdin, files, timeout_s)
        files = dict(files or {})
        code_file = CODE_FILES[language]
        if code_file in files:
            raise ValueError(f"files: {code_file!r} is where the sandbox puts the code; use another name")
        files[code_file] = code
        slot = await self._slots.acquire()
        try:
            return await self._run(slot, language, code_file, stdin, files, timeout)
        finally:
            self.runs += 1
            self._slots.release(slot)

    def _spec(self, slot: int, language: str, code_file: str, files: dict[str, str],
              host_workdir: str | None, cgroup: Path | None) -> dict:
        limits = self.limits
        uid = limits.uid_base + slot if self.isolation.as_root else None
        workdir = "/tmp" if self.isolation.namespaces else host_workdir
        if language == "python":
            # -I: no PYTHON* variables, no user site, no script dir on sys.path; -u: nothing is
            # lost in a buffer when the run is killed.
            argv = [self.python, "-I", "-u", "-B", code_file]
        else:
            argv = [shutil.which("bash") or "/bin/bash", "--noprofile", "--norc", code_file]
        env = {"PATH": f"{Path(self.python).parent}:{SYSTEM_PATH}", "HOME": workdir, "TMPDIR": workdir,
               "LANG": "C.UTF-8",
               # one thread per BLAS library: threads count against the process limit
               "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
        rlimits = {"CPU": limits.cpu_s, "AS": limits.memory_bytes, "FSIZE": limits.file_bytes,
                   "NOFILE": limits.open_files, "CORE": 0}
        if uid is not None:
            rlimits["NPROC"] = limits.processes  # counted per uid, and each slot has its own uid
        return {"isolate": self.isolation.namespaces, "hide": self._hidden, "workdir_keep": self._workdir_keep,
                "uid": uid, "gid": uid, "argv": argv,
                "env": env, "rlimits": rlimits, "files": files, "workdir_bytes": limits.workdir_bytes,
                "processes": limits.processes, "host_workdir": host_workdir,
                "cgroup_procs": str(cgroup / "cgroup.procs") if cgroup else None}

    async def _run(self, slot: int, language: str, code_file: str, stdin: str, files: dict[str, str],
                   timeout: float) -> RunResult:
        host_workdir = None if self.isolation.namespaces else tempfile.mkdtemp(prefix="slime-sandbox-")
        cgroup = None
        try:
            if self._cgroups is not None:
                cgroup = self._cgroups.create(self.limits.run_memory_bytes)
            return await self._run_in(host_workdir, cgroup, slot, language, code_file, stdin, files, timeout)
        finally:
            if host_workdir is not None:
                await asyncio.to_thread(shutil.rmtree, host_workdir, True)
            if cgroup is not None:
                await asyncio.to_thread(self._cgroups.remove, cgroup)

    async def _run_in(self, host_workdir: str | None, cgroup: Path | None, slot: int, language: str,
                      code_file: str, stdin: str, files: dict[str, str], timeout: float) -> RunResult:
        # ASCII JSON: a lone surrogate in the code travels as an escape, not as invalid UTF-8.
        spec = json.dumps(self._spec(slot, language, code_file, files, host_workdir, cgroup)).encode()
        payload = b"%d\n" % len(spec) + spec + stdin.encode("utf-8", "surrogatepass")
        status_read, status_write = os.pipe()
        started = time.monotonic()
        try:
            process = await asyncio.create_subprocess_exec(
                sys.executable, "-I", "-S", JAIL, str(status_write), stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, pass_fds=(status_write,),
                start_new_session=True, env={"PATH": SYSTEM_PATH, "LANG": "C.UTF-8"})
        except BaseException:
            os.close(status_read)
            raise
        finally:
            os.close(status_write)
        try:
            stdout, stderr, reason = await self._supervise(process, payload, timeout)
            wall_s = time.monotonic() - started
            status = _read_status(status_read)
        finally:
            _kill_group(process)
            os.close(status_read)
        oom_killed = cgroup is not None and MemoryCgroups.oom_killed(cgroup)
        return self._result(stdout, stderr, reason, status, process.returncode, wall_s, oom_killed)

    async def _supervise(self, process: asyncio.subprocess.Process, payload: bytes,
                         timeout: float) -> tuple[bytes, bytes, str | None]:
        limit = self.limits.output_bytes
        overflow = asyncio.Event()
        stdout, stderr = bytearray(), bytearray()

        async def pump(stream: asyncio.StreamReader, into: bytearray) -> None:
            # Past the limit it keeps reading (and drops) until EOF: asyncio's wait() only returns
            # once every pipe is closed, and a pipe nobody reads never sees its EOF.
            while chunk := await stream.read(READ_CHUNK):
                room = limit - len(into)
                if len(chunk) > room:
                    into += chunk[:room]
                    overflow.set()
                else:
                    into += chunk

        async def feed() -> None:
            try:
                process.stdin.write(payload)
                await process.stdin.drain()
                process.stdin.close()
            except (BrokenPipeError, ConnectionResetError):
                pass  # the program ended without reading all of its stdin

        tasks = [asyncio.create_task(feed()), asyncio.create_task(pump(process.stdout, stdout)),
                 asyncio.create_task(pump(process.stderr, stderr))]
        finished = asyncio.gather(process.wait(), tasks[1], tasks[2])
        overflowed = asyncio.create_task(overflow.wait())
        reason = None
        try:
            await asyncio.wait({finished, overflowed}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
            if not finished.done():
                reason = "output_limit" if overflow.is_set() else "timeout"
                _kill_group(process)
            # The pipes close when the namespace is gone; without one, an escaped daemon may hold
            # them open, and then they are closed here.
            try:
                await asyncio.wait_for(asyncio.shield(finished), PIPE_GRACE_S)
            except asyncio.TimeoutError:
                log.warning("sandbox: a process outside the run's process group still holds its output pipes")
                process._transport.close()  # noqa: SLF001 - the public API has no way to drop the pipes
                await process.wait()
        finally:
            for task in (*tasks, overflowed):
                task.cancel()
            finished.cancel()
            await asyncio.gather(*tasks, overflowed, finished, return_exceptions=True)
        return bytes(stdout), bytes(stderr), reason

    def _result(self, stdout: bytes, stderr: bytes, reason: str | None, status: dict | None,
                jail_exit: int | None, wall_s: float, oom_killed: bool) -> RunResult:
        exit_code = None
        if reason is None and status is None and oom_killed:
            reason = "memory"  # the OOM killer took the jail's own processes too
        if reason is None:
            if status is None:
                raise SandboxError(f"the sandbox's jail ended (exit code {jail_exit}) without reporting the "
                                   f"program's status; stderr: {stderr[-2000:].decode(errors='replace')}")
            if status["error"]:
                raise (ValueError if status.get("bad_request") else SandboxError)(status["error"])
            sig = status["signal"]
            exit_code = -sig if sig is not None else status["exit_code"]
            if status["processes_exceeded"]:
                reason, exit_code = "processes", None
            elif oom_killed:
                reason = "memory"  # the run's memory cgroup was full: the kernel killed a process
            elif sig == signal.SIGXCPU or (sig == signal.SIGKILL and status["cpu_s"] >= self.limits.cpu_s - 0.05):
                reason = "cpu"
            elif sig == signal.SIGXFSZ:
                reason = "file_size"
            elif exit_code != 0:
                tail = stderr[-4096:].decode(errors="replace")
                if MEMORY_ERROR.search(tail):
                    reason = "memory"
                elif FILE_SIZE_ERROR.search(tail):
                    reason = "file_size"
        return RunResult(stdout=stdout.decode("utf-8", "replace"), stderr=stderr.decode("utf-8", "replace"),
                         exit_code=exit_code, timed_out=reason == "timeout", killed_reason=reason,
                         wall_s=round(wall_s, 4))


def _kill_group(process: asyncio.subprocess.Process) -> None:
    """SIGKILL the jail's process group: the jail, the init (whose death empties the namespace) and
    the program."""
    if process.returncode is not None:
        return  # reaped: its pid (the group's id) may belong to someone else by now
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _read_status(fd: int) -> dict | None:
    os.set_blocking(fd, False)
    try:
        data = os.read(fd, 1 << 16)
    except BlockingIOError:
        return None
    return json.loads(data) if data else None
