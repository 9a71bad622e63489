"""End-to-end: a short run on reasoning-gym data whose reward is the task's own scorer."""

import json

import pytest

from actors.rollout.reasoning_gym import rows
from examples.models.tiny import build_tiny_model
from train_process import train

STEPS = 2


@pytest.mark.slow
def test_a_run_on_reasoning_gym_rows_trains_on_the_generators_scores(tmp_path):
    model = build_tiny_model(tmp_path / "model", arch="qwen2", seed=0)
    data = tmp_path / "train.jsonl"
    task = rows("spell_backward", {"min_word_len": 3, "max_word_len": 4}, size=16, seed=0)
    data.write_text("".join(json.dumps(row) + "\n" for row in task))
    result = train(tmp_path, [
        "--hf-checkpoint", str(model), "--prompt-data", str(data), "--rm-type", "reasoning_gym",
        "--rollout-batch-size", "2", "--n-samples-per-prompt", "4", "--num-rollout", str(STEPS),
        "--rollout-max-response-len", "8", "--engine-type", "cpu", "--micro-batch-size", "8", "--lr", "1e-4",
    ])
    steps = [m for m in result["metrics"] if "train/update_successful" in m]
    assert len(steps) == STEPS and all(m["train/update_successful"] == 1.0 for m in steps)
    assert steps[-1].get("rollout/reward_errors", 0) == 0
    assert 0.0 <= steps[-1]["rollout/exact_match"] <= 1.0  # logged beside the partial-credit reward
    samples = result["samples"]
    assert samples and all(s["status"] != "failed" and 0.0 <= s["reward"] <= 1.0 for s in samples)
    assert all(s["metadata"]["reasoning_gym"]["dataset"] == "spell_backward" for s in samples)
