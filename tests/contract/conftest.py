"""Fixtures for the engine protocol contract suite.

By default the suite runs against the embedded CPU engine, started here as a subprocess
(`python -m actors.engine.cpu`) on a tiny model built by `build_tiny_model`. Set
`SLIME_ASYNC_TEST_ENGINE_URL` to run the very same tests against a running SGLang server
instead, with `SLIME_ASYNC_TEST_ENGINE_MODEL` = the HF directory that server loaded (needed
to recompute logprobs with transformers and for the weight-update tests), and optionally
`SLIME_ASYNC_TEST_ENGINE_API_KEY`, `SLIME_ASYNC_TEST_LOGPROB_ATOL` (bf16 GPU kernels do not
reach the CPU engine's 1e-4), `SLIME_ASYNC_TEST_WEIGHT_BACKEND` (nccl by default for a URL;
gloo lets the trainer side share the engine's only GPU, which NCCL refuses) and
`SLIME_ASYNC_TEST_TRAINER_GPU` (CUDA_VISIBLE_DEVICES of the trainer-side process under nccl).

The CPU engine runs the suite twice: on a tiny Qwen2 and on a tiny Qwen3-MoE (every weight update
then goes through the per-expert checkpoint names; the engine records routed experts). Each engine
is shared by its half of the session; tests that change its weights restore the original ones
afterwards (fixture `restore_weights`).
"""

from __future__ import annotations

import json
import os
import shutil
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest
import pytest_asyncio
import torch

from actors.engine.cpu.local import LocalEngineError, start_local_engine, stop_local_engine
from slime_async.engine_client import EngineClient

ENGINE_START_TIMEOUT_S = 180.0


# The CPU engine's models: a dense one and a mixture-of-experts one (one parametrization, tiny).
CPU_ARCHS = ("qwen2", "qwen3_moe")


@dataclass(frozen=True)
class EngineUnderTest:
    url: str
    model_dir: Path | None  # the HF directory the engine serves; None if unknown (external)
    backend: str  # weight-update group backend: gloo (CPU engine) or nccl (GPU SGLang)
    api_key: str | None
    kind: str  # "cpu" or "external"
    logprob_atol: float
    trainer_env: dict[str, str]  # extra environment of the trainer-side broadcast process
    arch: str = "external"  # the CPU engine's tiny model (CPU_ARCHS)


@pytest.fixture(scope="session", params=["external"] if os.environ.get("SLIME_ASYNC_TEST_ENGINE_URL") else CPU_ARCHS)
def engine_under_test(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> EngineUnderTest:
    atol = float(os.environ.get("SLIME_ASYNC_TEST_LOGPROB_ATOL", "1e-4"))
    api_key = os.environ.get("SLIME_ASYNC_TEST_ENGINE_API_KEY") or None
    external_url = os.environ.get("SLIME_ASYNC_TEST_ENGINE_URL")
    if external_url:
        model = os.environ.get("SLIME_ASYNC_TEST_ENGINE_MODEL")
        backend = os.environ.get("SLIME_ASYNC_TEST_WEIGHT_BACKEND", "nccl")
        gpu = os.environ.get("SLIME_ASYNC_TEST_TRAINER_GPU")
        trainer_env = {"CUDA_VISIBLE_DEVICES": gpu} if gpu is not None else {}
        yield EngineUnderTest(external_url.rstrip("/"), Path(model) if model else None, backend, api_key,
                              "external", atol, trainer_env)
        return

    from examples.models.tiny import build_tiny_model

    arch = request.param
    model_dir = build_tiny_model(tmp_path_factory.mktemp(f"tiny_{arch}") / "model", arch=arch, num_experts=4)
    log_path = tmp_path_factory.mktemp("cpu_engine") / "engine.log"
    routed = ["--enable-return-routed-experts"] if arch == "qwen3_moe" else []
    try:
        process, url = start_local_engine(model_dir, log_path, "--host", "127.0.0.1", "--num-threads", "1", *routed,
                                          timeout=ENGINE_START_TIMEOUT_S)
    except LocalEngineError as exc:
        pytest.fail(str(exc))
    try:
        yield EngineUnderTest(url, model_dir, "gloo", None, "cpu", atol, {}, arch)
    finally:
        stop_local_engine(process)


@pytest.fixture(scope="session")
def model_dir(engine_under_test: EngineUnderTest) -> Path:
    if engine_under_test.model_dir is None:
        pytest.skip("set SLIME_ASYNC_TEST_ENGINE_MODEL to the HF directory the engine serves")
    return engine_under_test.model_dir


@pytest.fixture(scope="session")
def hf_model(model_dir: Path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="session")
def context_length(engine_under_test: EngineUnderTest, hf_model) -> int:
    """The engine's context window: what it reports, else the model config's."""
    request = urllib.request.Request(engine_under_test.url + "/get_server_info")
    if engine_under_test.api_key:
        request.add_header("Authorization", f"Bearer {engine_under_test.api_key}")
    with urllib.request.urlopen(request, timeout=30) as response:
        reported = json.loads(response.read()).get("context_length")
    return int(reported or hf_model.config.max_position_embeddings)


@pytest.fixture(scope="session")
def vocab_size(hf_model) -> int:
    return int(hf_model.config.vocab_size)


def _copy_non_weight_files(source: Path, target: Path) -> None:
    for path in source.iterdir():
        if path.is_file() and path.suffix not in (".safetensors", ".bin") and not (target / path.name).exists():
            shutil.copy2(path, target / path.name)


@pytest.fixture(scope="session")
def perturbed_model_dir(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The served model with every weight moved by noise: same shapes, different outputs."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    generator = torch.Generator().manual_seed(1234)
    with torch.no_grad():
        for param in model.parameters():
            scale = param.float().std().clamp(min=1e-3) if param.numel() > 1 else torch.tensor(1e-3)
            param.add_((torch.randn(param.shape, generator=generator) * scale).to(param.dtype))
    out = tmp_path_factory.mktemp("perturbed") / "model"
    model.save_pretrained(out, safe_serialization=True)
    _copy_non_weight_files(model_dir, out)
    return out


@pytest.fixture(scope="session")
def mismatched_model_dir(engine_under_test: EngineUnderTest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A checkpoint whose tensors have other shapes than the served model's."""
    if engine_under_test.kind != "cpu":
        pytest.skip("needs a model of the served architecture with other shapes; only built for the CPU engine")
    from examples.models.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("mismatched") / "model", arch=engine_under_test.arch,
                            hidden_size=32, intermediate_size=64, num_layers=1, num_experts=4)


@pytest_asyncio.fixture
async def client(engine_under_test: EngineUnderTest):
    async with EngineClient(engine_under_test.url, api_key=engine_under_test.api_key, timeout=300.0) as client:
        yield client


@pytest_asyncio.fixture
async def restore_weights(client: EngineClient, model_dir: Path):
    """Put the served model (and its weight version) back after a test that changes them."""
    version = await client.get_weight_version()
    yield
    await client.update_weights_from_disk(str(model_dir), weight_version=version)
