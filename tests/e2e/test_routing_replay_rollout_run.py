"""`slime-async train --use-rollout-routing-replay --debug-rollout-only` on a tiny Qwen3-MoE with the
CPU engine: the run starts its engine recording experts, and every sample it would train carries
them, [len(tokens) - 1, MoE layers, top-k], the ones a transformers forward's routers pick. (The
trainer's replay of them is the trainer's side of R3.)"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from actors.loop.debug_dump import load_groups
from examples.models.tiny import build_tiny_model
from train_process import train

pytestmark = pytest.mark.timeout(600)


def test_every_sample_of_the_run_carries_the_engines_routed_experts(tmp_path):
    model = build_tiny_model(tmp_path / "model", arch="qwen3_moe", num_experts=4)
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"What is {i} + 1?", "label": str(i + 1)}) + "\n" for i in range(4)))
    train(tmp_path, ["--hf-checkpoint", str(model), "--prompt-data", str(data), "--debug-rollout-only",
                     "--use-rollout-routing-replay", "--engine-type", "cpu", "--num-rollout", "1",
                     "--rollout-batch-size", "2", "--n-samples-per-prompt", "2", "--rollout-max-response-len", "6",
                     "--rm-type", "exact"])
    samples = [s for _, groups in load_groups(tmp_path / "dump") for group in groups for s in group]
    assert len(samples) == 4
    hf = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval()
    for sample in samples:
        experts = sample.rollout_routed_experts
        assert experts.dtype == np.int32 and experts.shape == (len(sample.tokens) - 1, 2, 2)  # both layers sparse, top-2
    with torch.no_grad():
        routers = hf(torch.tensor([samples[0].tokens[:-1]]), output_router_logits=True).router_logits
    for layer, logits in enumerate(routers):
        picked = torch.topk(logits.float(), 2, dim=-1).indices.sort(dim=-1).values.numpy()
        np.testing.assert_array_equal(np.sort(samples[0].rollout_routed_experts[:, layer], axis=-1), picked)
