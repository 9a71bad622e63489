"""Against the shared CPU engine (real HTTP; 2 running requests at most): the rollout keeps twice
as many generations in flight as the engine holds (read from its /server_info by the router, before the first
group starts), and
a weight sync in mode in_place keeps the running requests running (nothing aborted, nothing
prefilled again) with their later tokens on the new version, after which the engine serves
exactly the new weights. The engine gets its original weights back afterwards."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
import torch
from transformers import AutoModelForCausalLM

from actors.buffer import BufferActor, BufferConfig
from actors.weight_sync.actor import WeightSyncActor
from actors.rollout.actor import RolloutActor
from actors.rollout.config import RolloutConfig
from actors.rollout.data import Prompt
from actors.rollout.generate import GenerateContext
from actors.router import RouterActor, RouterConfig
from actors.router.dispatch import _label_in_place_span
from slime_async.actor import Actor, spawn
from slime_async.sample import Sample

PROMPT = [5, 6, 7]
LONG = {"temperature": 0, "max_new_tokens": 96, "ignore_eos": True}
SPLIT = 8  # output tokens each request has when the in-place sync lands


@pytest.fixture
def own_engine_url(start_engine, tiny_model_dir: Path) -> Iterator[str]:
    """A private engine like the shared one (2 running requests), for a test that may kill it."""
    with start_engine(tiny_model_dir, "--max-running-requests", "2") as url:
        yield url


async def server_stats(url: str) -> dict:
    async with aiohttp.ClientSession() as http, http.get(url + "/server_info") as resp:
        return (await resp.json())["internal_states"][0]


class Prompts:
    def __init__(self, n: int):
        self.prompts = [Prompt(index=i, epoch=0, prompt=f"p{i}", prompt_ids=PROMPT, label="x") for i in range(n)]
        self.position = 0

    def next_prompt(self):
        self.position += 1
        return self.prompts[self.position - 1] if self.position <= len(self.prompts) else None

    def state_dict(self):
        return {"position": self.position}


async def test_the_rollout_keeps_twice_as_many_generations_in_flight_as_the_engine_runs_at_once(engine_url):
    # 2 x min(2 running, 65536 KV tokens // (3 prompt + 40 response tokens)) = 4 (policies.concurrency
    # has the cases where the KV binds); the explicit cap 8 is above it. The rollout waits for the
    # router's first read itself: no polling here.
    config = RolloutConfig(rm_type="exact", rollout_batch_size=2, n_samples_per_prompt=2, rollout_max_response_len=40,
                           rollout_concurrency=8)
    router = await spawn(RouterActor(RouterConfig(), [engine_url]))
    buffer = await spawn(BufferActor(BufferConfig(buffer_capacity=4), groups_per_step=2))
    rollout = await spawn(RolloutActor(config, router=router, buffer=buffer, dataset=Prompts(2), tokenizer=None))
    try:
        before = await server_stats(engine_url)
        rollout.tell("start")
        async with asyncio.timeout(60):
            while (await server_stats(engine_url))["num_finished"] < before["num_finished"] + 4:
                await asyncio.sleep(0.1)
        metrics = await rollout.ask("metrics")
        stats = await server_stats(engine_url)
    finally:
        for ref in (rollout, buffer, router):
            await ref.stop()
    assert metrics["rollout/concurrency"] == 4.0
    assert stats["max_running_batch"] == 2  # the other two waited in the engine's queue


class ExportingTrainer(Actor):
    """The trainer's part of a disk sync: its export is the new weights' checkpoint."""

    name = "trainer"

    def __init__(self, weights: Path):
        super().__init__()
        self.weights = weights

    def export_hf(self, path: str) -> None:
        shutil.copytree(self.weights, path)


def greedy_reference(model_dir: Path, prompt: list[int], n: int) -> list[int]:
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    out = model.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=0)
    return out[0, len(prompt):].tolist()


async def post_ok(http: aiohttp.ClientSession, url: str, body: dict) -> dict:
    async with http.post(url, json=body) as resp:
        assert resp.status == 200, await resp.text()
        return await resp.json()


# On a private engine: the suite's engines are strict (tests/conftest.py), so a sync that sent SGLang
# a request it dies on (a flushing update while requests are paused in place) would end this one.
async def test_an_in_place_sync_keeps_requests_running_and_their_later_tokens_carry_the_new_version(
        own_engine_url, tiny_model_dir, other_weights_dir, tmp_path):
    engine_url, old_dir, new_dir = own_engine_url, tiny_model_dir, other_weights_dir
    router = await spawn(RouterActor(RouterConfig(), [engine_url]))
    trainer = await spawn(ExportingTrainer(new_dir))
    sync = await spawn(WeightSyncActor(trainer, router, "disk", "in_place", tmp_path))
    ctx = GenerateContext(router, None, RolloutConfig())
    samples = [Sample(group_index=0, index=i, tokens=list(PROMPT)) for i in range(2)]
    before = await server_stats(engine_url)
    try:
        async with aiohttp.ClientSession() as http:
            # No race with the generations: the engine holds both until they are there, so they join
            # its batch in one step (two requests sent apart can start steps apart under load), and it
            # pauses in place once they have SPLIT tokens; the sync's own pause then finds them there.
            await post_ok(http, engine_url + "/pause_generation", {"mode": "in_place"})
            turns = [asyncio.ensure_future(ctx.generate_turn(s, LONG)) for s in samples]
            async with asyncio.timeout(60):
                while (await server_stats(engine_url))["num_held_reqs"] < len(samples):
                    await asyncio.sleep(0.01)
            async with http.post(engine_url + "/debug/pause_in_place_at", json={"output_tokens": SPLIT}) as armed:
                assert armed.status == 200  # the headers come once armed
                await post_ok(http, engine_url + "/continue_generation", {})
                paused = await armed.json()
        assert paused["output_tokens"] == SPLIT
        await sync.ask("sync", 1)
        async with asyncio.timeout(120):
            finishes = await asyncio.gather(*turns)
        after = await server_stats(engine_url)
        # The update did not flush (the engine held the two requests); the flush the sync left
        # pending happens once they are done and the engine is idle: no KV of the old weights stays.
        async with asyncio.timeout(30):
            while (state := await server_stats(engine_url))["flush_pending"] or state["prefix_cache_tokens"]:
                await asyncio.sleep(0.01)
        fresh = await router.ask("generate", PROMPT, {**LONG, "max_new_tokens": 10}, timeout=60)
    finally:
        for ref in (sync, router, trainer):
            await ref.stop()
    assert finishes == ["length"] * 2
    assert after["num_aborted"] == before["num_aborted"] and after["num_retracted"] == before["num_retracted"]
    assert after["num_prefills"] - before["num_prefills"] == 2  # one each: nothing was prefilled again
    old_greedy = greedy_reference(old_dir, PROMPT, LONG["max_new_tokens"])
    for sample in samples:
        assert not sample.metadata.get("resumes")
        assert sample.response_length == LONG["max_new_tokens"]
        # Version 0 up to the sync (the old model's greedy tokens), version 1 after it.
        assert sample.token_versions == [0] * SPLIT + [1] * (LONG["max_new_tokens"] - SPLIT)
        assert sample.response_tokens[:SPLIT] == old_greedy[:SPLIT]
    assert fresh["output_ids"] == greedy_reference(new_dir, PROMPT, 10)  # the weights are exactly the new ones
    assert fresh["meta_info"]["weight_version"] == "1"


def test_without_the_engines_split_every_token_of_a_request_across_an_in_place_sync_gets_the_older_version():
    # SGLang's answer names only the version at its end.
    response = {"output_ids": [1, 2, 3], "meta_info": {"weight_version": "4",
                                                       "output_token_logprobs": [[-1.0, t, None] for t in (1, 2, 3)]}}
    _label_in_place_span(response, "3")
    assert response["meta_info"]["weight_version_segments"] == [["3", 3]]
    exact = {"output_ids": [1], "meta_info": {"weight_version_segments": [["3", 1]]}}
    _label_in_place_span(exact, "2")
    assert exact["meta_info"]["weight_version_segments"] == [["3", 1]]  # the engine's own split stands
