"""End-to-end: `slime-async train --advantage-estimator ppo` — the policy and a critic, each in its
own torchrun group (CPU engine, Megatron CPU ranks, tiny model).

Run A trains 2 steps, the first a critic-only warm-up, and saves; run B resumes it with --load for
a third step, with the critic's state restored from the checkpoint's critic/ directory.
"""

import json
import math

import pytest

from examples.models.tiny import build_tiny_model
from train_process import train

pytestmark = pytest.mark.slow

REWARD_MODULE = '''
async def rm(ctx, sample):
    # Half of each group is right: the returns vary, so the critic has something to explain.
    return float(sample.index % 2)
'''

CRITIC_METRICS = ("critic/value_loss", "critic/explained_variance", "critic/value_clipfrac", "critic/values_mean",
                  "critic/grad_norm", "critic/lr")


def ppo_argv(model, data, steps, *extra):
    return ["--hf-checkpoint", str(model), "--prompt-data", str(data), "--advantage-estimator", "ppo",
            "--num-critic-only-steps", "1", "--critic-lr", "1e-3", "--lr", "1e-4",
            "--rollout-batch-size", "2", "--n-samples-per-prompt", "2", "--num-rollout", str(steps),
            "--rollout-max-response-len", "16", "--custom-rm-path", "ppo_reward:rm",
            "--engine-type", "cpu", "--micro-batch-size", "4", *extra]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("ppo")
    model = build_tiny_model(root / "model", arch="qwen2", seed=0)
    data = root / "prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{a}+{a + 1}=", "label": str(2 * a + 1)}) + "\n"
                            for a in range(12)))
    (root / "ppo_reward.py").write_text(REWARD_MODULE)
    save = root / "save"
    (root / "a").mkdir()
    (root / "b").mkdir()
    first = train(root / "a", ppo_argv(model, data, 2, "--save", str(save)), import_dirs=(root,))
    resumed = train(root / "b", ppo_argv(model, data, 3, "--load", str(save)), import_dirs=(root,))
    return {"first": first["metrics"], "resumed": resumed["metrics"], "save": save}


def steps_of(metrics):
    return [m for m in metrics if "critic/value_loss" in m]


def test_every_step_logs_finite_critic_metrics(runs):
    steps = steps_of(runs["first"])
    assert len(steps) == 2
    for m in steps:
        for key in CRITIC_METRICS:
            assert key in m and math.isfinite(m[key]), (key, m)
        assert m["critic/lr"] == pytest.approx(1e-3)


def test_the_fresh_critic_predicts_zero_and_the_warm_up_leaves_the_policy_alone(runs):
    warm_up, second = steps_of(runs["first"])
    assert warm_up["critic/values_mean"] == 0.0  # the zero value head
    assert "train/pg_loss" not in warm_up  # --num-critic-only-steps 1
    assert "train/pg_loss" in second and second["train/lr"] == pytest.approx(1e-4)
    assert second["critic/values_mean"] != 0.0  # the critic trained at step 1


def test_the_checkpoint_holds_the_critic(runs):
    step_dir = runs["save"] / (runs["save"] / "latest").read_text().strip()
    assert (step_dir / "critic" / "metadata.json").is_file() and (step_dir / "trainer").is_dir()


def test_a_resumed_run_continues_the_critic(runs):
    [step] = steps_of(runs["resumed"])
    assert step["step"] == 3
    assert step["critic/step"] == 3.0  # two optimizer steps restored, one taken
    assert step["critic/values_mean"] != 0.0 and "train/pg_loss" in step
