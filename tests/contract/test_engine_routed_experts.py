"""Routed experts (MoE engines started with --enable-return-routed-experts): SGLang's layout, and the
experts a transformers forward's routers pick. Against the CPU engine's Qwen3-MoE half of the suite,
or an SGLang server serving an MoE model (SLIME_ASYNC_TEST_ENGINE_URL, started with the flag); a dense
model is skipped."""

from __future__ import annotations

import base64

import numpy as np
import pytest
import torch

from slime_async.routed_experts import model_routed_layout

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(300)]

PROMPT = [11, 42, 7, 99, 3, 250, 18]
GREEDY = {"temperature": 0.0, "max_new_tokens": 8, "ignore_eos": True}


@pytest.fixture(scope="session")
def layout(model_dir):
    found = model_routed_layout(model_dir)
    if found is None:
        pytest.skip("the engine serves a dense model")
    return found


def router_choices(hf_model, ids: list[int]) -> dict[int, np.ndarray]:
    """Per MoE layer, each position's top-k experts (sorted) as the layer's router picks them."""
    picked: dict[int, np.ndarray] = {}
    handles = []
    for layer, block in enumerate(hf_model.model.layers):
        gate = getattr(block.mlp, "gate", None)
        if gate is None or not hasattr(block.mlp, "experts"):
            continue

        def record(_module, _args, output, layer=layer, mlp=block.mlp):
            indices = output[2] if isinstance(output, tuple) else mlp.route_tokens_to_experts(output)[0]
            picked[layer] = np.sort(indices.numpy(), axis=-1)

        handles.append(gate.register_forward_hook(record))
    try:
        with torch.no_grad():
            hf_model(torch.tensor([ids]))
    finally:
        for handle in handles:
            handle.remove()
    return picked


async def test_routed_experts_cover_every_fed_position_as_the_routers_pick_them(client, hf_model, layout,
                                                                                 engine_under_test):
    answer = await client.generate(PROMPT, GREEDY, return_routed_experts=True)
    meta = answer["meta_info"]
    positions = meta["prompt_tokens"] + meta["completion_tokens"] - 1
    raw = np.frombuffer(base64.b64decode(meta["routed_experts"]), dtype=np.int32)
    assert raw.size == positions * layout.num_layers * layout.top_k  # SGLang's [seqlen - 1, layers, top_k]
    experts = np.sort(layout.decode(meta["routed_experts"], positions), axis=-1)
    expected = router_choices(hf_model, PROMPT + answer["output_ids"][:-1])
    agree = np.mean([(experts[:, i] == expected[layer]).all(axis=-1).mean() for i, layer in enumerate(layout.moe_layers)])
    # The CPU engine's float32 forward picks what transformers picks; a GPU's bf16 kernels may
    # flip near-ties.
    assert agree == 1.0 if engine_under_test.kind == "cpu" else agree >= 0.9


async def test_routed_experts_come_only_when_asked(client, layout):
    answer = await client.generate(PROMPT, GREEDY)
    assert "routed_experts" not in answer["meta_info"]
