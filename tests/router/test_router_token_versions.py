"""Per-token weight versions of requests that span an in-place weight update, through the router,
against a real CPU engine started with --no-weight-version-segments: its answers are SGLang's,
naming only the version each was built under, so the versions come from the stream's chunks
(--router-stream-generate) or, for a plain answer, from the router's conservative fallback."""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import pytest
import pytest_asyncio
import torch
from transformers import AutoModelForCausalLM

from actors.engine.cpu.local import start_local_engine, stop_local_engine
from actors.rollout.config import RolloutConfig
from actors.rollout.generate import GenerateContext
from actors.router import RouterActor, RouterConfig
from actors.router.engine_state import reported_version_lag
from slime_async.actor import ActorRef, spawn
from slime_async.sample import Sample
from examples.models.tiny import build_tiny_model

PROMPT = [5, 6, 7]
LONG = {"temperature": 0, "max_new_tokens": 400, "ignore_eos": True}


@pytest.fixture(scope="module")
def weights(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """Two tiny Qwen2s of the same shapes: the engine starts on the first."""
    return [build_tiny_model(tmp_path_factory.mktemp(f"weights-seed{seed}"), arch="qwen2", seed=seed)
            for seed in (0, 1)]


@pytest.fixture(scope="module")
def sglang_like_engine(weights: list[Path]) -> Iterator[str]:
    log = Path(tempfile.mkdtemp(prefix="cpu-engine-")) / "engine.log"
    process, url = start_local_engine(weights[0], log, "--no-weight-version-segments", "--max-running-requests", "4")
    try:
        yield url
    finally:
        stop_local_engine(process)


@pytest_asyncio.fixture
async def start_router() -> AsyncIterator:
    refs: list[ActorRef] = []

    async def start(url: str, **fields) -> ActorRef:
        config = RouterConfig(**({"router_health_interval": 3600.0, "router_load_interval": 0.0} | fields))
        refs.append(await spawn(RouterActor(config, [url])))
        return refs[-1]

    yield start
    for ref in refs:
        await ref.stop()


async def decode_steps(url: str) -> int:
    async with aiohttp.ClientSession() as http, http.get(url + "/server_info") as response:
        return (await response.json())["internal_states"][0]["num_decode_steps"]


async def after_decode_steps(url: str, steps: int) -> None:
    """Returns once the engine has decoded ``steps`` more steps than now."""
    target = await decode_steps(url) + steps
    async with asyncio.timeout(60):
        while await decode_steps(url) < target:
            await asyncio.sleep(0.005)


async def served(url: str) -> int:
    """The version the engine serves now; its prefix cache is flushed (it is idle), so that no KV
    of earlier weights is reused. Version v is weights[v % 2]."""
    async with aiohttp.ClientSession() as http:
        async with http.get(url + "/flush_cache") as response:
            assert response.status == 200, await response.text()
        async with http.get(url + "/model_info") as response:
            version = (await response.json())["weight_version"]
    return int(version) if version.isdigit() else 0


async def in_place_update(router: ActorRef, url: str, model_dir: Path, version: int) -> None:
    """A weight sync in mode in_place: the running requests wait on the engine with their KV."""
    await router.ask("pause", "in_place", timeout=60)
    async with aiohttp.ClientSession() as http:
        body = {"model_path": str(model_dir), "weight_version": str(version), "flush_cache": False}
        async with http.post(url + "/update_weights_from_disk", json=body) as response:
            assert response.status == 200, await response.text()
    await router.ask("resume", str(version), timeout=60)


async def turn_across_an_update(router: ActorRef, url: str, model_dir: Path, version: int) -> Sample:
    sample = Sample(group_index=0, index=0, tokens=list(PROMPT))
    turn = asyncio.ensure_future(GenerateContext(router, None, RolloutConfig()).generate_turn(sample, LONG))
    await after_decode_steps(url, 8)
    await in_place_update(router, url, model_dir, version)
    async with asyncio.timeout(120):
        assert await turn == "length"
    assert not sample.metadata.get("resumes")  # nothing was aborted
    assert sample.response_length == LONG["max_new_tokens"]
    return sample


def greedy(model_dir: Path, prompt: list[int], n: int) -> list[int]:
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    out = model.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=0)
    return out[0, len(prompt):].tolist()


async def test_a_streamed_request_across_an_in_place_update_keeps_each_tokens_true_version(
        sglang_like_engine, start_router, weights):
    url = sglang_like_engine
    old = await served(url)
    assert "weight_version_segments" not in (await _plain(url))["meta_info"]  # the engine answers like SGLang
    router = await start_router(url, router_stream_generate=True)
    sample = await turn_across_an_update(router, url, weights[(old + 1) % 2], old + 1)
    split = sample.token_versions.index(old + 1)
    # Before the update every token has the old version, after it the new one.
    assert 8 <= split < LONG["max_new_tokens"]
    assert set(sample.token_versions[:split]) == {old} and set(sample.token_versions[split:]) == {old + 1}
    assert sample.response_tokens[:split] == greedy(weights[old % 2], PROMPT, split)  # the old model's tokens


async def test_a_plain_answer_across_an_in_place_update_gets_the_older_version_for_every_token(
        sglang_like_engine, start_router, weights):
    url = sglang_like_engine
    old = await served(url)
    router = await start_router(url, router_stream_generate=False)
    sample = await turn_across_an_update(router, url, weights[(old + 1) % 2], old + 1)
    # SGLang names only the version at the end: no token may look newer than it is.
    assert set(sample.token_versions) == {old}


async def test_an_abort_pause_ends_a_streamed_request_with_its_tokens_and_the_turn_resumes_from_them(
        sglang_like_engine, start_router):
    url = sglang_like_engine
    await served(url)
    router = await start_router(url, router_stream_generate=True)
    uninterrupted = await router.ask("generate", PROMPT, LONG, timeout=120)
    sample = Sample(group_index=0, index=0, tokens=list(PROMPT))
    turn = asyncio.ensure_future(GenerateContext(router, None, RolloutConfig()).generate_turn(sample, LONG))
    await after_decode_steps(url, 8)
    await router.ask("pause", "abort", timeout=60)
    await router.ask("resume", None, timeout=60)
    async with asyncio.timeout(120):
        assert await turn == "length"
    assert sample.metadata["resumes"] == 1 and 8 <= sample.metadata["tokens_kept_on_abort"] < LONG["max_new_tokens"]
    assert sample.response_tokens == uninterrupted["output_ids"]  # resumed from its tokens, greedy as before


def test_the_version_lag_follows_sglangs_scheduler_and_stream_settings():
    assert reported_version_lag({"disable_overlap_schedule": True, "stream_interval": 1}) == 0  # the CPU engine
    assert reported_version_lag({"disable_overlap_schedule": False, "stream_interval": 1}) == 1  # SGLang's default
    assert reported_version_lag({"disable_overlap_schedule": False, "stream_interval": 4}) == 4
    assert reported_version_lag({"disable_overlap_schedule": False, "stream_interval": 1,
                                 "speculative_algorithm": "EAGLE", "speculative_num_draft_tokens": 4}) == 4
    assert reported_version_lag({}) == 0


async def _plain(url: str) -> dict:
    async with aiohttp.ClientSession() as http:
        body = {"input_ids": PROMPT, "sampling_params": {**LONG, "max_new_tokens": 1}, "return_logprob": True}
        async with http.post(url + "/generate", json=body) as response:
            return await response.json()
