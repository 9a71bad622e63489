"""The restart-external-engine fault's engine: a server the driver starts itself, gives the run as
``--rollout-external-engine-addrs``, kills with SIGKILL mid-run and starts again on the same port.

The run never starts nor kills an external engine; it must notice the restart (a healthy engine
that reports other weights) and bring it to the current version before routing to it again.
The same train flags serve every fault: for this one the owned engine's flags (``--engine-type``,
``--rollout-share-trainer-gpus``, ...) are left out of the run's, and its ``--sglang-<field>``
flags become the external SGLang server's own ``--<field>`` flags.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from benchmarks.gpu.chaos_procs import Tree

# Flags that only mean something for engines the run starts, with the values each takes.
OWNED_ENGINE_FLAGS = {"--engine-type": 1, "--rollout-share-trainer-gpus": 0, "--rollout-num-gpus": 1,
                      "--rollout-num-gpus-per-engine": 1, "--rollout-num-engines": 1, "--engine-base-port": 1,
                      "--engine-start-timeout": 1}
SGLANG_PREFIX = "--sglang-"


def split_engine_flags(argv: list[str]) -> tuple[list[str], list[str]]:
    """(the train flags without the owned engine's, the ``--sglang-*`` ones as SGLang's own flags)."""
    rest: list[str] = []
    sglang: list[str] = []
    i = 0
    while i < len(argv):
        token = argv[i]
        name = token.split("=", 1)[0]
        if name.startswith(SGLANG_PREFIX):
            sglang.append("--" + token[len(SGLANG_PREFIX):])
            i += 1
            while i < len(argv) and not argv[i].startswith("--"):  # its values
                sglang.append(argv[i])
                i += 1
        elif name in OWNED_ENGINE_FLAGS:
            i += 1 + (0 if "=" in token else OWNED_ENGINE_FLAGS[name])
        else:
            rest.append(token)
            i += 1
    return rest, sglang


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ExternalEngine:
    """One server on one port for the whole fault: ``start`` (again after ``kill9``), ``stop``."""

    def __init__(self, kind: str, model: str, log_path: Path, sglang_flags: list[str], registry: Path):
        self.kind, self.model, self.log_path, self.registry = kind, model, log_path, registry
        self.sglang_flags = sglang_flags
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.tree: Tree | None = None
        self.starts = 0

    def argv(self) -> list[str]:
        if self.kind == "cpu":
            return [sys.executable, "-m", "actors.loop.cli", "serve-engine", "--model-path", self.model,
                    "--port", str(self.port)]
        from actors.engine.sglang import build_sglang_argv

        return [*build_sglang_argv(self.model, port=self.port, python=sys.executable), *self.sglang_flags]

    def start(self) -> None:
        self.starts += 1
        with open(self.log_path, "ab") as log:
            log.write(f"--- start {self.starts}: {' '.join(self.argv())}\n".encode())
            log.flush()
            process = subprocess.Popen(self.argv(), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                       start_new_session=True)
        self.tree = Tree(process, self.registry)

    def wait_ready(self, deadline: float) -> None:
        """Until ``/health_generate`` answers 200; RuntimeError when the server exits or the deadline passes."""
        assert self.tree is not None
        while time.monotonic() < deadline:
            if self.tree.process.poll() is not None:
                raise RuntimeError(f"the external engine exited with code {self.tree.process.returncode} at start "
                                   f"(log {self.log_path})")
            try:
                with urllib.request.urlopen(self.url + "/health_generate", timeout=30) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.5)
        raise RuntimeError(f"the external engine did not answer /health_generate before the deadline "
                           f"(log {self.log_path})")

    def kill9(self) -> None:
        assert self.tree is not None
        self.tree.kill9()

    def stop(self) -> None:
        if self.tree is not None:
            self.tree.stop(grace=15.0)
