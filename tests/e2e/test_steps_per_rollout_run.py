"""End-to-end: --global-batch-size half the rollout makes PPO's clipping act (issue 12's acceptance).

A short sync run (2 rollouts of 2 prompts × 4 samples, --global-batch-size 4, a high LR): each
rollout takes 2 optimizer steps on one recomputed π_old, so the second step's ratio π_θ/π_old is
off 1 — train/ppo_kl and train/pg_clipfrac are non-zero in metrics.jsonl and TensorBoard (with
one step per rollout both were 0 at every step).

The same run is colocated (--colocate, issue 16): engines and trainer take turns, weights go by
IPC handles (shared memory on CPU) through /update_weights_from_tensor; the phases' order is read
from the supervisor's, the engine's and the trainer's own logs.
"""

import re

import json
import textwrap

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from examples.models.tiny import build_tiny_model
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
        "--engine-type", "cpu", "--micro-batch-size", "4", "--lr", "1e-2", "--colocate",
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


# One colocated step, as each side logs it (actors/weight_sync/colocate.py, actors/engine/cpu/memory.py,
# actors/trainer/residency.py).
SUPERVISOR_STEP = ["release_memory", "onload", "offload", "resume_weights", "update_weights_from_tensor", "offload",
                   "resume_kv_cache"]
ENGINE_STEP = ["released weights, kv_cache", "resumed weights", "loaded", "resumed kv_cache"]
TRAINER_STEP = ["onloaded grads, optimizer, params", "offloaded grads, optimizer", "offloaded params"]


def test_colocated_phases_run_in_order_on_every_side(run):
    logs = run["root"] / "run" / "logs"
    supervisor = re.findall(r"actors\.weight_sync\.colocate: colocate: (\w+)", run["stderr"])
    assert supervisor == ["offload", *SUPERVISOR_STEP * 2]  # the trainer leaves the devices before the first rollout
    engine = re.findall(r"(?:memory|weights): (released weights, kv_cache|resumed \w+|loaded)",
                        (logs / "engine-0.log").read_text())
    assert engine == ENGINE_STEP * 2
    trainer = re.findall(r"colocate: ((?:on|off)loaded [\w, ]+)", (logs / "trainer-torchrun.log").read_text())
    assert trainer == ["offloaded grads, optimizer, params", *TRAINER_STEP * 2]


def test_the_engine_serves_exactly_the_weights_sent_by_tensor_handles(run):
    rows = steps(run["metrics"])
    # Step 2 generates on the weights of step 1 (lr 1e-2: far from the checkpoint's), sent as IPC
    # handles; the engine's logprobs are the trainer's recompute of them.
    assert rows[1]["train/logprob_abs_diff"] < 1e-4
    assert [m["train/version"] for m in rows] == [1.0, 2.0]
    for m in rows:
        assert m["perf/weight_update_time"] > 0 and m["perf/offload_time"] >= 0 and m["perf/onload_time"] >= 0
        assert m["memory/engine_released_weights_gb"] == 0.0 < m["memory/engine_serving_weights_gb"]
        assert m["memory/trainer_peak_gb"] > 0
