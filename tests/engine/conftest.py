"""Fixtures for CPU engine tests: tiny model directories and a real engine subprocess."""

from __future__ import annotations

import contextlib
import sys
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import aiohttp
import pytest
import torch
from transformers import AutoModelForCausalLM

from actors.engine.cpu.local import start_local_engine, stop_local_engine
from slime_async.process import log_tail
from examples.models.tiny import build_tiny_model

START_TIMEOUT_S = 120.0
SHARED_ENGINE_FLAGS = ("--max-running-requests", "2", "--prefix-cache-max-tokens", "64")


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
    """Start the CPU engine on a free 127.0.0.1 port; yield its URL once it can generate."""
    log_path = Path(tempfile.mkdtemp(prefix="cpu-engine-")) / "engine.log"
    process, url = start_local_engine(model_dir, log_path, *extra_args, timeout=START_TIMEOUT_S)
    try:
        yield url
    finally:
        stop_local_engine(process)
        # pytest shows a failing test's stderr: the engine's tracebacks belong there.
        errors = [line for line in log_tail(log_path, 200).splitlines() if "Traceback" in line or "ERROR" in line]
        if errors:
            sys.stderr.write("".join(f"[engine] {line}\n" for line in errors) + f"[engine] full log: {log_path}\n")


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
    with run_engine(tiny_model_dir, *SHARED_ENGINE_FLAGS) as url:
        yield url


@pytest.fixture(scope="session")
def lenient_engine_url(tiny_model_dir: Path) -> Iterator[str]:
    """Like `engine_url`, but it refuses (HTTP 400, counted) the control requests SGLang dies on
    instead of exiting as the suite's engines do (tests/conftest.py): for the tests of those
    refusals. Tests that change its weights put them back."""
    with run_engine(tiny_model_dir, *SHARED_ENGINE_FLAGS, "--no-strict-sglang-preconditions") as url:
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
