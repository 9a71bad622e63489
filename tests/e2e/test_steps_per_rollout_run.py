"""End-to-end: --global-batch-size half the rollout makes PPO's clipping act (issue 12's acceptance).

A short sync run (2 rollouts of 2 prompts × 4 samples, --global-batch-size 4, a high LR): each
rollout takes 2 optimizer steps on one recomputed π_old, so the second step's ratio π_θ/π_old is
off 1 — train/ppo_kl and train/pg_clipfrac are non-zero in metrics.jsonl and TensorBoard (with
one step per rollout both were 0 at every step).
"""

import json
import textwrap

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from slime_async.tiny_model import build_tiny_model
from train_process import train

pytestmark = pytest.mark.slow

# A reward that differs between samples (almost surely), so every group has advantages to follow.
REWARD_MODULE = textwrap.dedent('''
    async def rm(ctx, sample):
        return (sum(sample.response_tokens) % 97) / 97
''')


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("e2e-steps")
    model = build_tiny_model(root / "model", arch="qwen2", seed=0)
    data = root / "prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{a}+1=", "label": str(a + 1)}) + "\n" for a in range(8)))
    (root / "steps_reward.py").write_text(REWARD_MODULE)
    result = train(root, [
        "--hf-checkpoint", str(model), "--prompt-data", str(data), "--train-mode", "sync",
        "--rollout-batch-size", "2", "--n-samples-per-prompt", "4", "--num-rollout", "2",
        "--global-batch-size", "4", "--rollout-max-response-len", "16", "--custom-rm-path", "steps_reward:rm",
        "--engine-type", "cpu", "--micro-batch-size", "4", "--lr", "1e-2",
    ], import_dirs=(root,))
    return {**result, "root": root}


def steps(metrics):
    return [m for m in metrics if "train/pg_loss" in m]


def test_each_rollout_takes_two_optimizer_steps(run):
    rows = steps(run["metrics"])
    assert [m["train/num_optimizer_steps"] for m in rows] == [2.0, 2.0]
    assert [m["train/step"] for m in rows] == [2.0, 4.0]  # the trainer's optimizer-step counter


def test_the_ratio_moves_off_one_and_clipping_acts(run):
    rows = steps(run["metrics"])
    assert all(m["train/ppo_kl"] != 0.0 for m in rows)
    assert any(m["train/pg_clipfrac"] > 0.0 for m in rows)


def test_tensorboard_has_the_live_clip_metrics(run):
    acc = EventAccumulator(str(run["root"] / "run" / "tb"))
    acc.Reload()
    clipfrac = [event.value for event in acc.Scalars("train/pg_clipfrac")]
    ppo_kl = [event.value for event in acc.Scalars("train/ppo_kl")]
    assert len(clipfrac) == len(ppo_kl) == 2
    assert max(clipfrac) > 0.0 and all(value != 0.0 for value in ppo_kl)
