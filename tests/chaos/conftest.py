"""Shared fixtures of the chaos suite: a tiny model and data, a run launcher, a process tracker.

A case starts `slime-async train` as a real process tree (CPU engine + Megatron CPU trainer)
with `launch`, injects a fault (kill -9 of a process, a bad hook...), and checks what the run
did (`ChaosRun.metrics`, `.log`) and that no process it started survives
(`ChaosRun.tracker`, see process_tree.py). Every process a case started is killed at its end,
whatever happened, so a failing case leaves nothing behind for the next.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from process_tree import DescendantTracker
from examples.models.tiny import build_tiny_model

REPO_ROOT = Path(__file__).resolve().parents[2]


def base_argv(model: Path, data: Path, *, steps: int = 4, mode: str = "fully-async") -> list[str]:
    """A short run: 2 prompts x 2 samples a step, 16 tokens, disk weight sync every step;
    fully-async with --max-staleness 2 unless ``mode`` says otherwise."""
    return [
        "--hf-checkpoint", str(model), "--prompt-data", str(data),
        "--train-mode", mode, *(["--max-staleness", "2"] if mode == "fully-async" else []),
        "--rollout-batch-size", "2", "--n-samples-per-prompt", "2", "--num-rollout", str(steps),
        "--rollout-max-response-len", "16", "--rm-type", "exact",
        "--engine-type", "cpu", "--micro-batch-size", "4", "--lr", "1e-3",
        # Find a dead engine within a second, not the default 15 s.
        "--router-health-interval", "0.5", "--router-health-failures", "1",
    ]


@dataclass
class ChaosRun:
    """One `slime-async train` process (its own session) and everything it started."""

    process: subprocess.Popen
    run_dir: Path
    log_path: Path
    tracker: DescendantTracker
    started: float = field(default_factory=time.monotonic)

    @property
    def pid(self) -> int:
        return self.process.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def metrics(self) -> list[dict]:
        """metrics.jsonl's rows so far (a row being written is skipped)."""
        path = self.run_dir / "metrics.jsonl"
        rows = []
        if path.is_file():
            for line in path.read_text().splitlines():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError:
                    pass
        return rows

    def train_steps(self) -> list[dict]:
        """The rows of trained steps (they carry train/version)."""
        return [row for row in self.metrics() if "train/version" in row]

    def wait_until(self, predicate: Callable[[], object], timeout: float, what: str) -> object:
        """Poll ``predicate`` every 0.1 s; fail naming ``what`` (with the log's tail) when the run
        exits first or ``timeout`` s pass."""
        deadline = time.monotonic() + timeout
        while True:
            value = predicate()
            if value:
                return value
            if self.process.poll() is not None:
                pytest.fail(f"the run exited ({self.process.returncode}) before {what}:\n{self.log()[-4000:]}")
            if time.monotonic() > deadline:
                pytest.fail(f"no {what} within {timeout:g} s:\n{self.log()[-4000:]}")
            time.sleep(0.1)

    def wait_for_step(self, step: int, timeout: float = 300) -> dict:
        return self.wait_until(lambda: next((m for m in self.train_steps() if m["step"] >= step), None),
                               timeout, f"trained step {step}")

    def wait(self, timeout: float = 300) -> int:
        """The run's exit code (fails the test with the log's tail when it does not end in time)."""
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the run did not end within {timeout:g} s:\n{self.log()[-4000:]}")

    def kill9(self) -> None:
        """SIGKILL the supervisor process alone (not its group): what it started must die by itself."""
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()

    def pids_of(self, text: str) -> list[int]:
        """Live recorded processes whose command line contains ``text``."""
        return [r.pid for r in self.tracker.matching(text) if r.alive()]


def is_trainer_rank(cmdline: str) -> bool:
    return "actors.trainer.worker" in cmdline and "torch.distributed.run" not in cmdline


@pytest.fixture(scope="session")
def chaos_model(tmp_path_factory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("chaos-model") / "model", arch="qwen2", seed=5)


@pytest.fixture(scope="session")
def chaos_data(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("chaos-data") / "prompts.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"{a}+1=", "label": str(a + 1)}) + "\n" for a in range(64)))
    return path


@pytest.fixture
def launch(tmp_path) -> Iterator[Callable[..., ChaosRun]]:
    """``launch(argv, name="run", import_dirs=(), env=None) -> ChaosRun``: start
    ``slime-async train ARGV --run-dir tmp/NAME --no-progress-bar`` in tmp_path (hook modules
    importable from ``import_dirs`` and tmp_path). At the end of the test the run and every
    process it was seen to start are killed."""
    runs: list[ChaosRun] = []

    def start(argv: list[str], name: str = "run", import_dirs: tuple[Path, ...] = (),
              env: dict[str, str] | None = None) -> ChaosRun:
        run_dir = tmp_path / name
        log_path = tmp_path / f"{name}.log"
        pythonpath = os.pathsep.join([str(tmp_path), *map(str, import_dirs), os.environ.get("PYTHONPATH", "")])
        command = [sys.executable, "-m", "actors.loop.cli", "train", "--run-dir", str(run_dir),
                   "--no-progress-bar", *argv]
        with open(log_path, "wb") as log:
            process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path,
                                       env={**os.environ, "PYTHONPATH": pythonpath, **(env or {})},
                                       start_new_session=True)
        run = ChaosRun(process, run_dir, log_path, DescendantTracker(process.pid))
        runs.append(run)
        return run

    yield start
    for run in runs:
        if run.process.poll() is None:
            run.process.kill()
            run.process.wait()
        run.tracker.stop()
        run.tracker.kill_survivors()


@pytest.fixture
def cpu_engine(tmp_path) -> Iterator[Callable[..., "ExternalEngine"]]:
    """``cpu_engine(model, port=0) -> ExternalEngine``: a CPU engine the test owns (an
    "external" engine for the run), stopped at the end of the test."""
    engines: list[ExternalEngine] = []

    def start(model: Path, port: int = 0) -> ExternalEngine:
        engine = ExternalEngine(model, tmp_path / f"engine-{len(engines)}.log", port)
        engine.start()
        engines.append(engine)
        return engine

    yield start
    for engine in engines:
        engine.stop()


@dataclass
class ExternalEngine:
    model: Path
    log_path: Path
    port: int = 0
    process: subprocess.Popen | None = None
    url: str = ""

    def start(self, timeout: float = 120) -> None:
        """Start (or restart, on the same port) ``python -m actors.engine.cpu``; wait until it can generate."""
        from actors.engine.cpu.local import start_local_engine

        self.process, self.url = start_local_engine(self.model, self.log_path, "--port", str(self.port),
                                                    "--num-threads", "1", timeout=timeout)
        self.port = int(self.url.rsplit(":", 1)[1])

    def kill9(self) -> None:
        assert self.process is not None
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()

    def stop(self) -> None:
        from actors.engine.cpu.local import stop_local_engine

        if self.process is not None:
            stop_local_engine(self.process)
