"""The CPU engine's routed experts (SGLang's --enable-return-routed-experts / return_routed_experts),
on tiny Qwen3-MoE (layer 1 dense) and GLM-4.5 (layer 0 dense, group-limited sigmoid routing with a
score bias) models: the ids are the ones a plain transformers forward's routers pick, for every
position but the last, also from the prefix cache, across an abort and its resume, and on a
sample the rollout hands the buffer after two turns."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from actors.buffer import BufferActor, BufferConfig
from actors.engine.cpu.local import LocalEngineError
from actors.rollout.actor import RolloutActor
from actors.rollout.config import RolloutConfig
from actors.rollout.data import Prompt
from actors.router import RouterActor, RouterConfig
from slime_async.actor import spawn
from slime_async.engine_client import EngineClient
from slime_async.generation import CompletionSpec, GenerationFailed, complete
from slime_async.routed_experts import model_routed_layout
from tests.trainer.conftest import build_tiny_hf_model

pytestmark = pytest.mark.timeout(300)

PROMPT = [5, 17, 33, 2, 60, 8, 91]
GREEDY = {"temperature": 0.0, "max_new_tokens": 6, "ignore_eos": True}
ARCHS = ("qwen3_moe", "glm4_moe")


@pytest.fixture(scope="module")
def moe_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("routed")
    return {arch: build_tiny_hf_model(root / arch, arch) for arch in ARCHS}


@pytest.fixture(scope="module")
def routed_urls(start_engine, moe_dirs: dict[str, Path]) -> Iterator[dict[str, str]]:
    """One engine per family, recording the experts; the Qwen3-MoE one holds 2 requests at once."""
    with start_engine(moe_dirs["qwen3_moe"], "--enable-return-routed-experts", "--max-running-requests", "2") as qwen, \
            start_engine(moe_dirs["glm4_moe"], "--enable-return-routed-experts") as glm:
        yield {"qwen3_moe": qwen, "glm4_moe": glm}


def reference_experts(model_dir: Path, ids: list[int]) -> np.ndarray:
    """[len(ids), num_hidden_layers, top_k] from one transformers forward over ``ids``: what each MoE
    layer's router picks (its own output, not the experts' input the engine hooks), sorted per row;
    dense layers zeros."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    config = model.config
    picked = np.zeros((len(ids), config.num_hidden_layers, config.num_experts_per_tok), dtype=np.int64)

    def hook(layer: int, mlp: torch.nn.Module):
        def record(_gate, _args, output):
            if isinstance(output, tuple):  # Qwen3-MoE's router: (logits, weights, indices)
                indices = output[2]
            else:  # GLM-4.5's router gives logits; the block picks (bias, groups) from them
                indices = mlp.route_tokens_to_experts(output)[0]
            picked[:, layer] = np.sort(indices.numpy(), axis=-1)
        return record

    for layer, block in enumerate(model.model.layers):
        if hasattr(block.mlp, "gate"):
            block.mlp.gate.register_forward_hook(hook(layer, block.mlp))
    with torch.no_grad():
        model(torch.tensor([ids]))
    return picked


def decode_raw(meta: dict, model_dir: Path) -> np.ndarray:
    layout = model_routed_layout(model_dir)
    rows = meta["prompt_tokens"] + meta["completion_tokens"] - 1
    raw = np.frombuffer(base64.b64decode(meta["routed_experts"]), dtype=np.int32)
    return raw.reshape(rows, layout.num_layers, layout.top_k)


async def generate(url: str, prompt: list[int], **extra) -> dict:
    async with EngineClient(url) as client:
        return await client.generate(prompt, GREEDY, return_routed_experts=True, **extra)


@pytest.mark.parametrize("arch", ARCHS)
async def test_the_experts_of_every_fed_position_are_the_ones_transformers_routers_pick(arch, routed_urls, moe_dirs):
    answer = await generate(routed_urls[arch], PROMPT)
    meta = answer["meta_info"]
    experts = decode_raw(meta, moe_dirs[arch])  # the size must be prompt + completion - 1 rows
    layout = model_routed_layout(moe_dirs[arch])

    dense = [layer for layer in range(layout.num_layers) if layer not in layout.moe_layers]
    assert dense and not experts[:, dense].any()  # SGLang's rows of dense layers: zeros
    reference = reference_experts(moe_dirs[arch], PROMPT + answer["output_ids"][:-1])
    np.testing.assert_array_equal(np.sort(experts, axis=-1)[:, list(layout.moe_layers)],
                                  reference[:, list(layout.moe_layers)])


async def test_a_prefix_cache_hit_returns_the_experts_its_cached_positions_were_computed_with(routed_urls):
    url = routed_urls["qwen3_moe"]
    first = await generate(url, PROMPT)
    again = await generate(url, PROMPT)
    assert again["meta_info"]["cached_tokens"] == len(PROMPT) - 1
    assert again["meta_info"]["routed_experts"] == first["meta_info"]["routed_experts"]


async def test_an_aborted_completion_resumes_with_experts_for_every_position(routed_urls, moe_dirs):
    url = routed_urls["qwen3_moe"]
    layout = model_routed_layout(moe_dirs["qwen3_moe"])
    async with EngineClient(url) as client, aiohttp.ClientSession() as http:
        async def aborted_once_running() -> None:
            async with asyncio.timeout(60):
                while True:  # a few tokens in, so the abort cuts the request mid-way
                    async with http.get(url + "/server_info") as resp:
                        if (await resp.json())["internal_states"][0]["num_decode_steps"] >= steps + 3:
                            break
                    await asyncio.sleep(0.01)
            await client.abort_request(abort_all=True)

        async with http.get(url + "/server_info") as resp:
            steps = (await resp.json())["internal_states"][0]["num_decode_steps"]
        spec = CompletionSpec(PROMPT, {"temperature": 0.0, "ignore_eos": True}, 160, routed=layout)
        abort = asyncio.create_task(aborted_once_running())
        out = await complete(lambda ids, params, **extra: client.generate(ids, params, **extra), spec, None)
        await abort
    assert out.resumes == 1 and len(out.output_ids) == 160
    assert out.routed_experts.shape == (len(PROMPT) + 160 - 1, len(layout.moe_layers), layout.top_k)
    reference = reference_experts(moe_dirs["qwen3_moe"], PROMPT + out.output_ids[:-1])
    np.testing.assert_array_equal(np.sort(out.routed_experts, axis=-1), reference[:, list(layout.moe_layers)])


async def two_turns(ctx, sample, sampling_params):
    """A multi-turn hook: a turn, an observation the model did not generate, another turn."""
    await ctx.generate_turn(sample, sampling_params)
    sample.append_observation([40, 41, 42])
    await ctx.generate_turn(sample, sampling_params)
    return sample


class OnePrompt:
    def __init__(self):
        self.position = 0

    def next_prompt(self):
        self.position += 1
        return Prompt(index=0, epoch=0, prompt="p", prompt_ids=PROMPT, label="x") if self.position == 1 else None

    def state_dict(self):
        return {"position": self.position}


async def test_a_rollout_sample_carries_the_experts_of_all_its_tokens_but_the_last(routed_urls, moe_dirs):
    config = RolloutConfig(rm_type="exact", rollout_batch_size=1, n_samples_per_prompt=1, rollout_max_response_len=4,
                           rollout_temperature=0.0, use_rollout_routing_replay=True,
                           custom_generate_function_path=f"{__name__}:two_turns")
    router = await spawn(RouterActor(RouterConfig(), [routed_urls["glm4_moe"]]))
    buffer = await spawn(BufferActor(BufferConfig(buffer_capacity=1), groups_per_step=1))
    actor = RolloutActor(config, router=router, buffer=buffer, dataset=OnePrompt(), tokenizer=None)
    actor.ctx.routed_layout = layout = model_routed_layout(moe_dirs["glm4_moe"])  # as launch sets it
    rollout = await spawn(actor)
    try:
        rollout.tell("start")
        [group] = await buffer.ask("get", 1, 0, timeout=120)
    finally:
        for ref in (rollout, buffer, router):
            await ref.stop()
    sample = group[0]
    assert sample.tokens[:len(PROMPT)] == PROMPT and sample.loss_mask.count(0) == 3  # two turns, one observation
    assert sample.rollout_routed_experts.shape == (len(sample.tokens) - 1, len(layout.moe_layers), layout.top_k)
    reference = reference_experts(moe_dirs["glm4_moe"], sample.tokens[:-1])
    np.testing.assert_array_equal(np.sort(sample.rollout_routed_experts, axis=-1), reference[:, list(layout.moe_layers)])


async def test_without_the_server_flag_the_answer_has_no_experts_and_the_loop_names_the_flag(engine_url):
    # SGLang 0.5.17 does not refuse the request: its no-op capturer leaves the field out.
    answer = await generate(engine_url, PROMPT)
    assert "routed_experts" not in answer["meta_info"] and answer["output_ids"]
    async with EngineClient(engine_url) as client:
        spec = CompletionSpec(PROMPT, {"temperature": 0.0}, 2, routed=model_routed_layout_of_qwen3())
        with pytest.raises(GenerationFailed, match="start it with --enable-return-routed-experts"):
            await complete(lambda ids, params, **extra: client.generate(ids, params, **extra), spec, None)


def model_routed_layout_of_qwen3():
    from slime_async.routed_experts import RoutedLayout

    return RoutedLayout(num_layers=2, top_k=2, moe_layers=(0, 1))


def test_the_server_flag_on_a_dense_model_stops_the_engine_at_start_naming_it(start_engine, tiny_model_dir):
    with pytest.raises(LocalEngineError, match="--enable-return-routed-experts: the model .* has no mixture-of-experts"):
        with start_engine(tiny_model_dir, "--enable-return-routed-experts"):
            pass


async def test_a_trajectory_the_front_records_carries_the_experts_of_its_turns(routed_urls, moe_dirs):
    """Two turns through the router's HTTP front (SGLang's /generate of a session), the second's
    prompt extending the first's with tokens the model did not generate: the collected sample has
    the experts of all its tokens but the last."""
    from actors.rollout.generate import GenerateContext
    from actors.router.text_model import TextModel
    from slime_async.sample import Sample

    model = TextModel.load(moe_dirs["glm4_moe"])
    model.routed_layout = layout = model_routed_layout(moe_dirs["glm4_moe"])  # as launch sets it
    router = await spawn(RouterActor(RouterConfig(router_health_interval=3600.0, router_load_interval=0.0),
                                     [routed_urls["glm4_moe"]], model=model))
    try:
        url = await router.ask("front_url")
        ctx = GenerateContext(router, model.tokenizer, config=None, router_url=url)
        sample = Sample(group_index=0, index=0, prompt="p", tokens=list(PROMPT))
        endpoint = ctx.openai_base_url(sample).removesuffix("/v1") + "/generate"
        async with aiohttp.ClientSession() as http:
            async with http.post(endpoint, json={"input_ids": PROMPT, "sampling_params": GREEDY}) as response:
                first = (await response.json())["output_ids"]
            second_prompt = PROMPT + first + [40, 41, 42]
            async with http.post(endpoint, json={"input_ids": second_prompt, "sampling_params": GREEDY}) as response:
                second = (await response.json())["output_ids"]
            [piece] = await ctx.collect_trajectory(sample)
    finally:
        await router.stop()
    assert piece.tokens == second_prompt + second
    assert piece.rollout_routed_experts.shape == (len(piece.tokens) - 1, len(layout.moe_layers), layout.top_k)
    reference = reference_experts(moe_dirs["glm4_moe"], piece.tokens[:-1])
    np.testing.assert_array_equal(np.sort(piece.rollout_routed_experts, axis=-1), reference[:, list(layout.moe_layers)])
