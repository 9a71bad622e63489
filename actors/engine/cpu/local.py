"""The CPU engine as a plain local subprocess, for benchmarks and tests (runs use ProcessChild).

`start_local_engine` starts ``python -m actors.engine.cpu`` on a free port in its own process
group with output to a log file, reads the URL the engine logs, and waits for
``/health_generate``; `stop_local_engine` stops the whole group (SIGTERM, then SIGKILL).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from slime_async.child_env import PACKAGES_ROOT, child_env
from slime_async.process import log_tail


class LocalEngineError(RuntimeError):
    """The engine exited or was not ready in time; the message holds its log's tail."""


def start_local_engine(
    model_dir: Path, log_path: Path, *extra_args: str, timeout: float = 180.0
) -> tuple[subprocess.Popen, str]:
    """Start a CPU engine serving ``model_dir``; return (process, URL) once it can generate."""
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "actors.engine.cpu", "--model-path", str(model_dir), "--port", "0", *extra_args],
            stdout=log, stderr=subprocess.STDOUT, cwd=PACKAGES_ROOT, env=child_env(),
            start_new_session=True,  # its own process group, so stopping reaches everything it spawned
        )
    deadline = time.monotonic() + timeout
    url = None
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise LocalEngineError(
                f"CPU engine exited with code {process.returncode}; log {log_path}:\n{log_tail(log_path, 40)}")
        if url is None:
            match = re.search(r"listening on (http://\S+)", log_path.read_text(errors="replace"))
            url = match.group(1) if match else None
        if url is not None:
            try:
                with urllib.request.urlopen(url + "/health_generate", timeout=30) as response:
                    if response.status == 200:
                        return process, url
            except (urllib.error.URLError, OSError):
                pass
        time.sleep(0.2)
    stop_local_engine(process)
    raise LocalEngineError(f"CPU engine not ready within {timeout:g} s; log {log_path}:\n{log_tail(log_path, 40)}")


def stop_local_engine(process: subprocess.Popen) -> None:
    if process.poll() is not None:
        return
    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
