"""End-to-end: a reward that returns NaN for one sample of every group never poisons the policy.

Before, the NaN reached the advantages, the loss and the weights, the engine answered HTTP 500
and the run died after a step or two; now each NaN is a counted reward error and every step
trains on finite numbers.
"""

import json
import math
import textwrap

import pytest

from examples.models.tiny import build_tiny_model
from train_process import train

REWARD_MODULE = textwrap.dedent('''
    async def rm(ctx, sample):
        return float("nan") if sample.index == 0 else float(len(sample.response_tokens) % 2)
''')

STEPS = 3
GROUPS = 2


@pytest.mark.slow
def test_a_nan_reward_per_group_is_counted_and_every_step_trains(tmp_path):
    model = build_tiny_model(tmp_path / "model", arch="qwen2", seed=0)
    data = tmp_path / "prompts.jsonl"
    data.write_text("\n".join(json.dumps({"prompt": f"{a}+{a}=", "label": str(2 * a)}) for a in range(16)) + "\n")
    (tmp_path / "nan_reward.py").write_text(REWARD_MODULE)
    result = train(tmp_path, [
        "--hf-checkpoint", str(model), "--prompt-data", str(data), "--custom-rm-path", "nan_reward:rm",
        "--rollout-batch-size", str(GROUPS), "--n-samples-per-prompt", "4", "--num-rollout", str(STEPS),
        "--rollout-max-response-len", "8", "--engine-type", "cpu", "--micro-batch-size", "4", "--lr", "1e-4",
    ], import_dirs=(tmp_path,))
    steps = [m for m in result["metrics"] if "train/update_successful" in m]
    assert len(steps) == STEPS
    assert [m["train/version"] for m in steps] == [1.0, 2.0, 3.0]
    assert all(m["train/update_successful"] == 1.0 and math.isfinite(m["train/grad_norm"]) for m in steps)
    # One NaN per group, GROUPS groups per step: counted cumulatively.
    assert steps[-1]["rollout/reward_errors"] >= STEPS * GROUPS
    trained = [s for s in result["samples"] if s["index"] == 0]
    assert trained and all(s["reward"] == 0.0 and s["status"] == "failed" for s in trained)
