"""End-to-end: a plug-in written in slime's style trains in a real run with only its imports changed.

tests/compat/slime_style_plugin.py POSTs text to ``http://{args.sglang_router_ip}:{args.sglang_router_port}
/generate`` (the router's HTTP front) for three turns with a local calculator, appends tokens with
``append_response_tokens`` and scores with ``rm(args, sample)`` reading ``sample.response``. The
launch line uses slime's flag spellings: dotted hook paths, a dynamic filter from slime's
``filter_hub``, ``--use-kl-loss --kl-loss-coef 0.0``, a Megatron-LM model block, named eval sets.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from examples.models.tiny import build_tiny_model
from train_process import train

PLUGIN_DIR = Path(__file__).parents[1] / "compat"

# Megatron-LM's description of build_tiny_model(arch="qwen2"), as a slime scripts/models/*.sh block.
MODEL_ARGS = [
    "--swiglu", "--num-layers", "2", "--hidden-size", "64", "--ffn-hidden-size", "128", "--num-attention-heads", "4",
    "--group-query-attention", "--num-query-groups", "2", "--use-rotary-position-embeddings",
    "--disable-bias-linear", "--add-qkv-bias", "--normalization", "RMSNorm", "--norm-epsilon", "1e-6",
    "--rotary-base", "10000", "--vocab-size", "512", "--untie-embeddings-and-output-weights",
]
STEPS = 3


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("slime-plugin")
    model = build_tiny_model(root / "model", arch="qwen2", seed=0)
    data, heldout = root / "prompts.jsonl", root / "heldout.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{a}+{a + 2}=", "label": str(2 * a + 2)}) + "\n" for a in range(40)))
    heldout.write_text("".join(json.dumps({"prompt": f"{a}*2=", "label": str(2 * a)}) + "\n" for a in range(3)))
    return train(root, [
        "--hf-checkpoint", str(model), "--prompt-data", str(data),
        "--custom-generate-function-path", "slime_style_plugin.generate",
        "--custom-rm-path", "slime_style_plugin.rm",
        "--dynamic-sampling-filter-path",
        "slime_async.compat.slime.rollout.filter_hub.dynamic_sampling_filters.check_reward_nonzero_std",
        "--train-mode", "sync", "--rollout-batch-size", "2", "--n-samples-per-prompt", "2",
        "--num-rollout", str(STEPS), "--rollout-max-response-len", "48", "--rollout-max-context-len", "256",
        "--eval-prompt-data", "doubling", str(heldout), "--n-samples-per-eval-prompt", "2",
        "--use-kl-loss", "--kl-loss-coef", "0.0", "--kl-loss-type", "low_var_kl", *MODEL_ARGS,
        "--engine-type", "cpu", "--micro-batch-size", "4", "--lr", "1e-4", "--use-tis",
    ], import_dirs=(PLUGIN_DIR,))


def train_steps(metrics):
    return [m for m in metrics if "train/pg_loss" in m]


def test_the_slime_style_plugin_trains_every_step(run):
    steps = train_steps(run["metrics"])
    assert [m["train/version"] for m in steps] == [1.0, 2.0, 3.0]
    assert all("train/grad_norm" in m and "train/kl_loss" in m for m in steps)  # KL logged at coef 0


def test_trained_samples_hold_the_model_turns_and_the_tool_output_the_slime_way(run):
    samples = run["samples"]
    assert len(samples) == STEPS * 2 * 2
    for sample in samples:
        mask = sample["loss_mask"]
        assert len(mask) == sample["response_length"] == len(sample["rollout_logprobs"]) == len(sample["token_versions"])
        assert 0 in mask and 1 in mask  # calculator output untrained, model turns trained
        assert sample["response"].count("<calc>") == 2 and sample["metadata"]["tool_calls"] == 2
        assert len(sample["weight_versions"]) == 3  # one per model turn, from the front's meta_info
        assert all(lp == 0.0 for lp, m in zip(sample["rollout_logprobs"], mask) if not m)
        assert any(lp < 0.0 for lp, m in zip(sample["rollout_logprobs"], mask) if m)


def test_the_reward_is_the_plugins_rm_of_the_response_text(run):
    for sample in run["samples"]:
        model_text = re.sub(r"<calc>.*?</calc>", "", sample["response"], flags=re.DOTALL)
        expected = sum(c.isdigit() for c in model_text) / max(1, len(model_text))
        assert sample["reward"] == pytest.approx(expected)


def test_the_named_eval_set_is_logged_under_its_name(run):
    evals = [m for m in run["metrics"] if "eval/doubling/reward_mean" in m]
    assert [m["step"] for m in evals] == [0, STEPS]
    assert all(m["eval/doubling/samples"] == 6.0 for m in evals)
