"""An MoE model (tiny Qwen3-MoE, aux loss on) through the real trainer group: 2 data-parallel
torchrun ranks driven over torch RPC. Logprobs equal transformers' recompute, PPO steps train, the
HF export after training equals the trainer's own logprobs, and the Megatron checkpoint resumes
in a one-rank trainer with the same logprobs. (Every expert on every rank here; experts spread
over ranks: test_trainer_moe_ep.py.)"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from worker_fixtures import PPO_KL, env_threads, fixed_batch, running_trainer, trainer_config, transformers_logprobs

ARCH = "qwen3_moe"


@dataclass
class MoERun:
    logprobs0: list[list[float]] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    logprobs_after: list[list[float]] = field(default_factory=list)
    resumed_logprobs: list[list[float]] = field(default_factory=list)
    export_dir: Path | None = None


async def _logprobs(trainer) -> list[list[float]]:
    return [row.logprobs for row in await trainer.ask("compute_logprobs", fixed_batch(), model="actor", timeout=None)]


async def _scenario(hf_dir: Path, work: Path) -> MoERun:
    run = MoERun(export_dir=work / "export")
    dp2 = trainer_config(hf_dir, procs=2, tp=1)
    async with running_trainer(dp2.validate(), work / "logs") as trainer:
        run.logprobs0 = await _logprobs(trainer)
        batch = fixed_batch(old_logprobs=run.logprobs0, ref_logprobs=run.logprobs0)
        for _ in range(2):
            run.losses.append((await trainer.ask("train_step", batch, PPO_KL, timeout=None))["loss"])
        await trainer.ask("export_hf", str(run.export_dir), timeout=None)
        run.logprobs_after = await _logprobs(trainer)
        await trainer.ask("save", str(work / "ckpt"), timeout=None)
    alone = trainer_config(hf_dir, procs=1, tp=1)
    async with running_trainer(alone.validate(), work / "logs-alone") as trainer:
        await trainer.ask("load", str(work / "ckpt"), timeout=None)
        run.resumed_logprobs = await _logprobs(trainer)
    return run


@pytest.fixture(scope="session")
def moe_run(tiny_moe_dirs, tmp_path_factory) -> MoERun:
    env_threads()
    return asyncio.run(_scenario(tiny_moe_dirs[ARCH], tmp_path_factory.mktemp("moe_trainer")))


def _max_abs_diff(a: list[list[float]], b: list[list[float]]) -> float:
    assert [len(r) for r in a] == [len(r) for r in b]
    return max(abs(x - y) for ra, rb in zip(a, b) for x, y in zip(ra, rb))


@pytest.mark.timeout(600)
def test_dp2_logprobs_equal_transformers_recompute(moe_run, tiny_moe_dirs):
    assert _max_abs_diff(moe_run.logprobs0, transformers_logprobs(tiny_moe_dirs[ARCH], fixed_batch())) < 1e-4


@pytest.mark.timeout(600)
def test_dp2_train_steps_are_finite_and_move_the_logprobs(moe_run):
    assert all(math.isfinite(loss) for loss in moe_run.losses)
    assert _max_abs_diff(moe_run.logprobs_after, moe_run.logprobs0) > 1e-3


@pytest.mark.timeout(600)
def test_the_hf_export_after_training_gives_the_trainers_logprobs_in_transformers(moe_run):
    assert _max_abs_diff(moe_run.logprobs_after, transformers_logprobs(moe_run.export_dir, fixed_batch())) < 1e-4


@pytest.mark.timeout(600)
def test_a_dp2_checkpoint_resumes_in_one_rank_with_the_same_logprobs(moe_run):
    assert _max_abs_diff(moe_run.resumed_logprobs, moe_run.logprobs_after) < 1e-5
