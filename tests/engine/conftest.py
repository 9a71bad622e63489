"""Fixtures for CPU engine tests: tiny model directories and a real engine subprocess."""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import aiohttp
import pytest
import torch
from transformers import AutoModelForCausalLM

from slime_async.tiny_model import build_tiny_model

REPO_ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 120.0


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Qwen2 (GQA, qkv bias) shared by every engine test; treat it as read-only."""
    return build_tiny_model(tmp_path_factory.mktemp("tiny-qwen2"), arch="qwen2", seed=0)


@pytest.fixture(scope="session")
def other_weights_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Same shapes as `tiny_model_dir`, different random weights."""
    return build_tiny_model(tmp_path_factory.mktemp("tiny-qwen2-seed1"), arch="qwen2", seed=1)


@contextlib.contextmanager
def run_engine(model_dir: Path, *extra_args: str) -> Iterator[str]:
    """Start the CPU engine on a free 127.0.0.1 port; yield its URL once /health answers."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "actors.engine.cpu", "--model-path", str(model_dir), "--port", "0", *extra_args],
        cwd=REPO_ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        url = _wait_for_url(proc)
        # Keep reading the engine's output so a chatty engine never blocks on a full pipe.
        threading.Thread(target=_drain, args=(proc,), daemon=True).start()
        _wait_for_health(url, proc)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _drain(proc: subprocess.Popen) -> None:
    assert proc.stdout is not None
    for line in proc.stdout:
        if "Traceback" in line or "ERROR" in line:
            sys.stderr.write("[engine] " + line)


def _wait_for_url(proc: subprocess.Popen) -> str:
    assert proc.stdout is not None
    seen = []
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError(f"engine exited with {proc.wait()} before listening:\n{''.join(seen)}")
        seen.append(line)
        match = re.search(r"listening on (http://\S+)", line)
        if match:
            return match.group(1)
    raise RuntimeError(f"engine did not start within {START_TIMEOUT_S}s:\n{''.join(seen)}")


def _wait_for_health(url: str, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"engine exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=5) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError):
            time.sleep(0.2)
    raise RuntimeError(f"{url}/health did not answer within {START_TIMEOUT_S}s")


@pytest.fixture(scope="session")
def start_engine() -> Callable[..., contextlib.AbstractContextManager[str]]:
    """`with start_engine(model_dir, *flags) as url:` runs a private engine for a test module."""
    return run_engine


@pytest.fixture(scope="session")
def engine_url(tiny_model_dir: Path) -> Iterator[str]:
    """One engine shared by the read-only engine tests (start-up costs seconds of imports).

    It allows 2 running requests and a 64-token prefix cache so that queueing and eviction
    show up with a handful of short requests. Tests that change weights start their own.
    """
    with run_engine(tiny_model_dir, "--max-running-requests", "2", "--prefix-cache-max-tokens", "64") as url:
        yield url


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
        yield session


@pytest.fixture(scope="session")
def hf_model(tiny_model_dir: Path) -> torch.nn.Module:
    """The engine's model loaded by transformers in the test process, as the reference."""
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="session")
def recompute_logprobs(hf_model: torch.nn.Module) -> Callable[[list[int], list[int], float], torch.Tensor]:
    """Logprob of each output token under log_softmax(logits / T), from one full forward."""

    def recompute(prompt: list[int], output: list[int], temperature: float) -> torch.Tensor:
        with torch.no_grad():
            logits = hf_model(torch.tensor([prompt + output])).logits[0].float()
        positions = torch.arange(len(prompt) - 1, len(prompt) + len(output) - 1)
        logprobs = torch.log_softmax(logits[positions] / temperature, dim=-1)
        return logprobs[torch.arange(len(output)), torch.tensor(output)]

    return recompute
