"""Several optimizer steps per rollout on real torchrun ranks: --global-batch-size half the batch.

One rank, the tiny qwen2 model, the six-sample fixed batch with --global-batch-size 3, and μ (the
rollout logprobs) set to the trainer's logprobs before the step minus 0.1 on every token. Then:
- the trainer takes 2 optimizer steps (its step counter moves by 2, num_optimizer_steps = 2);
- π_old is the recompute before the first step, used by both: |π_old − μ| (logprob_abs_diff)
  is 0.1 in both steps (had each step taken π_old = π_θ.detach(), the second step's would not be);
- the second step sees π_θ ≠ π_old: ppo_kl ≠ 0, the ratio moves.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

import pytest

from policies.algorithm import AlgorithmConfig
from worker_fixtures import env_threads, fixed_batch, running_trainer, trainer_config

pytestmark = pytest.mark.slow

SHIFT = 0.1
PPO = AlgorithmConfig(eps_clip=0.2)


async def _scenario(hf_dir: Path, work: Path) -> dict:
    config = trainer_config(hf_dir, procs=1, tp=1, global_batch_size=3, megatron={"lr": 1e-2, "lr_warmup_iters": 0})
    async with running_trainer(config, work / "logs") as trainer:
        before = [row.logprobs for row in await trainer.ask("compute_logprobs", fixed_batch(), timeout=None)]
        behaviour = [[x - SHIFT for x in row] for row in before]
        batch = replace(fixed_batch(), rollout_logprobs=behaviour, old_logprobs=None)
        metrics = await trainer.ask("train_step", batch, PPO, timeout=None)
        after = [row.logprobs for row in await trainer.ask("compute_logprobs", fixed_batch(), timeout=None)]
    return {"before": before, "after": after, "metrics": metrics}


@pytest.fixture(scope="module")
def two_step_run(tiny_hf_dirs, tmp_path_factory) -> dict:
    env_threads()
    return asyncio.run(_scenario(tiny_hf_dirs["qwen2"], tmp_path_factory.mktemp("steps")))


def test_half_the_batch_per_global_batch_takes_two_optimizer_steps(two_step_run):
    metrics = two_step_run["metrics"]
    assert metrics["num_optimizer_steps"] == 2.0
    assert metrics["step"] == 2.0  # the trainer's optimizer-step counter (the LR schedule's iteration)


def test_both_steps_use_the_pi_old_recomputed_before_the_first(two_step_run):
    assert two_step_run["metrics"]["logprob_abs_diff"] == pytest.approx(SHIFT, abs=1e-5)


def test_the_second_step_sees_the_policy_moved_away_from_pi_old(two_step_run):
    # The mean over the steps: the first step's ppo_kl is 0 (π_θ = π_old), the second's is not.
    assert abs(two_step_run["metrics"]["ppo_kl"]) > 1e-6
    moved = max(abs(a - b) for ra, rb in zip(two_step_run["before"], two_step_run["after"]) for a, b in zip(ra, rb))
    assert moved > 1e-3
