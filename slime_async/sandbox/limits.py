"""What a sandboxed run may use, what it returns, and the interface both runners share.

``SandboxLimits`` is resolved once (``validate``) when a ``Sandbox`` or the server starts;
``check_request`` validates one call's arguments with the same messages for the library and
the HTTP service (which answers them as 400s).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path, PurePosixPath
from typing import Protocol, runtime_checkable

LANGUAGES = ("python", "bash")

# The reasons a run can end early; ``RunResult.killed_reason`` is one of these or None.
KILLED_REASONS = ("timeout", "cpu", "memory", "output_limit", "processes", "file_size")


@dataclass(frozen=True)
class SandboxLimits:
    timeout_s: float = 10.0  # wall clock per run, unless the call asks for another
    max_timeout_s: float = 120.0  # the most a call may ask for
    cpu_s: int = 10  # RLIMIT_CPU per process (SIGXCPU, then SIGKILL one second later)
    memory_bytes: int = 1 << 30  # RLIMIT_AS per process
    run_memory_bytes: int = 2 << 30  # RAM (+swap) of all of a run's processes, where a memory cgroup exists
    file_bytes: int = 16 << 20  # RLIMIT_FSIZE: the largest file a run may write
    workdir_bytes: int = 64 << 20  # size of the private tmpfs working directory
    processes: int = 32  # processes and threads a run may have at once (reaching it ends the run)
    open_files: int = 256  # RLIMIT_NOFILE
    output_bytes: int = 1 << 20  # per stream (stdout, stderr); more ends the run
    max_code_bytes: int = 1 << 20
    max_input_bytes: int = 8 << 20  # stdin plus all files
    python: str = ""  # interpreter for language="python"; "" = the one running the sandbox
    uid_base: int = 65000  # as root, pool slot i runs as uid/gid uid_base + i (a uid no real user has)
    # Directories the code sees empty (the task's answers, the repository); the interpreter's own
    # directories below them stay visible. Everything else is visible read-only.
    hidden_paths: tuple[str, ...] = ()

    def validate(self, max_concurrency: int = 1) -> "SandboxLimits":
        for name in ("timeout_s", "max_timeout_s"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ValueError(f"sandbox limit {name} must be a positive number of seconds, got {value!r}")
        if self.timeout_s > self.max_timeout_s:
            raise ValueError(f"sandbox limit timeout_s={self.timeout_s} exceeds max_timeout_s={self.max_timeout_s}")
        for name in ("cpu_s", "memory_bytes", "run_memory_bytes", "file_bytes", "workdir_bytes", "processes",
                     "open_files", "output_bytes", "max_code_bytes", "max_input_bytes"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"sandbox limit {name} must be a positive integer, got {value!r}")
        if self.processes < 2:
            raise ValueError(f"sandbox limit processes must be at least 2 (the shell and one command), "
                             f"got {self.processes}")
        if not isinstance(max_concurrency, int) or max_concurrency < 1:
            raise ValueError(f"sandbox max_concurrency must be a positive integer, got {max_concurrency!r}")
        if not (1 <= self.uid_base and self.uid_base + max_concurrency - 1 < 65534):
            raise ValueError(f"sandbox uid_base={self.uid_base} with max_concurrency={max_concurrency} "
                             "must give uids between 1 and 65533")
        for path in self.hidden_paths:
            if not (isinstance(path, str) and path.startswith("/") and path.rstrip("/") and Path(path).is_dir()):
                raise ValueError(f"sandbox limit hidden_paths: {path!r} must be an existing directory's absolute "
                                 "path (not /)")
        return self

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class RunResult:
    stdout: str  # decoded UTF-8 (invalid bytes replaced), at most output_bytes bytes of output
    stderr: str
    exit_code: int | None  # the program's exit status; -N if signal N ended it; None if the sandbox killed it
    timed_out: bool
    # one of KILLED_REASONS: a limit ended the run ("memory", "file_size": the program failed on one)
    killed_reason: str | None
    wall_s: float

    def to_dict(self) -> dict:
        return asdict(self)


@runtime_checkable
class SandboxRunner(Protocol):
    """Runs one piece of code; ``Sandbox`` (in this process) and ``RemoteSandbox`` (HTTP)."""

    async def run(self, code: str, language: str = "python", stdin: str = "",
                  files: dict[str, str] | None = None, timeout_s: float | None = None) -> RunResult: ...

    async def close(self) -> None: ...


def check_request(limits: SandboxLimits, code: object, language: object, stdin: object, files: object,
                  timeout_s: object) -> float:
    """Raise ValueError naming the bad field; return the wall timeout this run gets."""
    if language not in LANGUAGES:
        raise ValueError(f"language must be one of {', '.join(LANGUAGES)}, got {language!r}")
    if not isinstance(code, str):
        raise ValueError(f"code must be a string, got {type(code).__name__}")
    if len(code.encode("utf-8", "surrogatepass")) > limits.max_code_bytes:
        raise ValueError(f"code is longer than max_code_bytes={limits.max_code_bytes}")
    if not isinstance(stdin, str):
        raise ValueError(f"stdin must be a string, got {type(stdin).__name__}")
    total = len(stdin.encode("utf-8", "surrogatepass"))
    if files is not None:
        if not isinstance(files, dict):
            raise ValueError(f"files must be an object of relative path -> text, got {type(files).__name__}")
        for path, text in files.items():
            check_file_path(path)
            if not isinstance(text, str):
                raise ValueError(f"files[{path!r}] must be a string, got {type(text).__name__}")
            total += len(text.encode("utf-8", "surrogatepass"))
    if total > limits.max_input_bytes:
        raise ValueError(f"stdin plus files is {total} bytes, more than max_input_bytes={limits.max_input_bytes}")
    if timeout_s is None:
        return float(limits.timeout_s)
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not math.isfinite(timeout_s) \
            or timeout_s <= 0:
        raise ValueError(f"timeout_s must be a positive number of seconds, got {timeout_s!r}")
    if timeout_s > limits.max_timeout_s:
        raise ValueError(f"timeout_s={timeout_s} exceeds this sandbox's max_timeout_s={limits.max_timeout_s}")
    return float(timeout_s)


def check_file_path(path: object) -> None:
    if not isinstance(path, str) or not path:
        raise ValueError(f"files: each key must be a non-empty relative path, got {path!r}")
    parts = PurePosixPath(path).parts
    if path.startswith("/") or path.endswith("/") or ".." in parts or "\0" in path:
        raise ValueError(f"files: path {path!r} must be a file's path relative to the working directory, "
                         "without '..'")
