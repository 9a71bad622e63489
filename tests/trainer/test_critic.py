"""PPO's critic as its own torchrun group: real Megatron CPU ranks driven over real RPC.

One scenario (a policy group of 1 rank and a critic group of 2 DP ranks in the same trainer
actor) recorded once and asserted on by several tests: the zero value head, both groups
answering, the clipped value loss falling on a fixed batch, a save / load round trip of the
critic, and kill -9 of a critic rank reported as the critic's death.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from actors.trainer.actor import TrainerActor, TrainerRankDied
from slime_async.actor import spawn
from worker_fixtures import env_threads, fixed_batch, trainer_config

pytestmark = pytest.mark.slow

CRITIC_STEPS = 6
REWARDS = [1.0, -1.0, 0.5, -0.5, 1.5, -1.5]


@dataclass
class CriticRun:
    values0: list[list[float]] = field(default_factory=list)
    policy_logprobs: list[list[float]] = field(default_factory=list)
    steps: list[dict] = field(default_factory=list)
    values_after: list[list[float]] = field(default_factory=list)
    step_after_save: dict = field(default_factory=dict)
    step_after_load: dict = field(default_factory=dict)
    loaded_step: int = -1
    critic_logs: list[str] = field(default_factory=list)
    death: BaseException | None = None


def _with_targets(values: list[list[float]]):
    batch = fixed_batch()
    returns = [[r] * n for r, n in zip(REWARDS, batch.response_lengths)]
    return dataclasses.replace(batch, values=values, returns=returns)


async def _scenario(hf_dir: Path, work: Path) -> CriticRun:
    run = CriticRun()
    policy = trainer_config(hf_dir, procs=1, tp=1)
    critic = trainer_config(hf_dir, procs=2, tp=1, megatron={"lr": 1e-2, "lr_warmup_iters": 0})
    ref = await spawn(TrainerActor(policy, work / "logs", critic=critic))
    try:
        batch = fixed_batch()
        run.values0 = await ref.ask("compute_values", batch, timeout=None)
        run.policy_logprobs = [r.logprobs for r in await ref.ask("compute_logprobs", batch, timeout=None)]
        targets = _with_targets(run.values0)
        for _ in range(CRITIC_STEPS):
            run.steps.append(await ref.ask("train_critic", targets, 10.0, "token_mean", timeout=None))
        run.values_after = await ref.ask("compute_values", batch, timeout=None)
        await ref.ask("save_critic", str(work / "critic"), timeout=None)
        run.step_after_save = await ref.ask("train_critic", targets, 0.05, "token_mean", timeout=None)
        run.loaded_step = await ref.ask("load_critic", str(work / "critic"), timeout=None)
        run.step_after_load = await ref.ask("train_critic", targets, 0.05, "token_mean", timeout=None)
        run.critic_logs = sorted(p.name for p in (work / "logs").iterdir())
        victim = (await ref.ask("critic_rank_info"))[1]
        pending = asyncio.ensure_future(ref.ask("compute_values", batch, timeout=None))
        os.kill(victim.pid, signal.SIGKILL)
        try:
            await pending
        except BaseException as error:  # noqa: BLE001 - recorded for the test
            run.death = error
    finally:
        await ref.stop()
    return run


@pytest.fixture(scope="module")
def critic_run(tiny_hf_dirs, tmp_path_factory) -> CriticRun:
    env_threads()
    return asyncio.run(_scenario(tiny_hf_dirs["qwen2"], tmp_path_factory.mktemp("critic")))


def test_the_fresh_value_head_predicts_zero_for_every_response_token(critic_run):
    assert [len(row) for row in critic_run.values0] == fixed_batch().response_lengths
    assert all(v == 0.0 for row in critic_run.values0 for v in row)


def test_the_policy_group_serves_alongside_the_critic(critic_run):
    assert [len(row) for row in critic_run.policy_logprobs] == fixed_batch().response_lengths
    assert all(v < 0 for row in critic_run.policy_logprobs for v in row)


def test_the_value_loss_falls_on_a_fixed_batch(critic_run):
    losses = [step["value_loss"] for step in critic_run.steps]
    assert losses[-1] < 0.5 * losses[0], losses
    assert all(step["grad_norm"] > 0 and step["lr"] == pytest.approx(1e-2) for step in critic_run.steps)


def test_the_first_loss_is_the_mean_squared_return_of_trainable_tokens(critic_run):
    # V = 0 everywhere: the loss is the mean of G² over trainable tokens (sample 4 has 2 masked).
    batch = fixed_batch()
    squares = [r * r for r, mask in zip(REWARDS, batch.loss_masks) for m in mask if m]
    assert critic_run.steps[0]["value_loss"] == pytest.approx(sum(squares) / len(squares), rel=1e-5)


def test_trained_values_move_towards_the_returns(critic_run):
    before = sum((0.0 - r) ** 2 for r, row in zip(REWARDS, critic_run.values0) for _ in row)
    after = sum((v - r) ** 2 for r, row in zip(REWARDS, critic_run.values_after) for v in row)
    assert after < 0.5 * before


def test_a_tight_value_clip_reports_clipped_tokens(critic_run):
    # The values have moved by more than 0.05 from the old (zero) values since training.
    assert critic_run.step_after_save["value_clipfrac"] > 0.5


def test_a_loaded_critic_repeats_the_step_taken_after_its_save(critic_run):
    assert critic_run.loaded_step == CRITIC_STEPS
    assert critic_run.step_after_load["value_loss"] == pytest.approx(critic_run.step_after_save["value_loss"],
                                                                      rel=1e-5)
    assert critic_run.step_after_load["step"] == CRITIC_STEPS + 1


def test_the_critic_group_logs_to_its_own_file(critic_run):
    assert "trainer-critic-torchrun.log" in critic_run.critic_logs
    assert "trainer-torchrun.log" in critic_run.critic_logs


def test_a_killed_critic_rank_is_reported_as_the_critics_death(critic_run):
    assert isinstance(critic_run.death, TrainerRankDied), repr(critic_run.death)
    assert critic_run.death.group == "critic"
    assert "critic rank 1" in str(critic_run.death)
