"""Rollout routing replay (R3) through the real trainer group (one torchrun rank over RPC, packed
micro-batches): the experts a transformers fp32 forward chose (the CPU engine's model runner) replay to
the trainer's own logprobs, other experts change them, a training step with replay reports finite
routing metrics, and a sample whose experts do not fit fails the op by name (the ranks go on serving)."""

from __future__ import annotations

import asyncio
import math
import re
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import pytest

from benchmarks.r3_mismatch import engine_view
from worker_fixtures import PPO_KL, env_threads, fixed_batch, running_trainer, trainer_config

ARCH = "qwen3_moe"  # 8 experts, top-2, MoE layers 0 and 2 (layer 1 dense)


@dataclass
class R3Run:
    engine_logprobs: list[list[float]] = field(default_factory=list)
    plain: list[list[float]] = field(default_factory=list)
    replay_own: list[list[float]] = field(default_factory=list)
    replay_other: list[list[float]] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)
    bad_shape_error: str = ""
    after_error: list[list[float]] = field(default_factory=list)


def _other_experts(experts: list[np.ndarray], num_experts: int = 8) -> list[np.ndarray]:
    """Every token's experts shifted by one: a different set wherever top-k < experts."""
    return [(e + 1) % num_experts for e in experts]


async def _scenario(hf_dir: Path, work: Path) -> R3Run:
    from actors.engine.cpu.model_runner import ModelRunner

    run = R3Run()
    batch = fixed_batch()
    experts, run.engine_logprobs = engine_view(ModelRunner(hf_dir), batch.tokens, batch.response_lengths,
                                               batch.temperature)
    config = trainer_config(hf_dir, procs=1, tp=1, use_rollout_routing_replay=True, attention_impl="varlen")
    async with running_trainer(config.validate(), work / "logs") as trainer:
        async def logprobs(b) -> list[list[float]]:
            return [row.logprobs for row in await trainer.ask("compute_logprobs", b, model="actor", timeout=None)]

        run.plain = await logprobs(batch)
        run.replay_own = await logprobs(replace(batch, routed_experts=experts))
        run.replay_other = await logprobs(replace(batch, routed_experts=_other_experts(experts)))
        bad = [e[:, :1] for e in experts]  # one MoE layer short
        try:
            await logprobs(replace(batch, routed_experts=bad, sample_ids=[(9, i) for i in range(len(bad))]))
        except Exception as exc:  # noqa: BLE001 - the op's error is what is asserted on
            run.bad_shape_error = str(exc)
        run.after_error = await logprobs(batch)
        trained = replace(batch, old_logprobs=run.plain, ref_logprobs=run.plain,
                          routed_experts=_other_experts(experts))
        run.metrics = await trainer.ask("train_step", trained, PPO_KL, timeout=None)
    return run


@pytest.fixture(scope="module")
def r3_run(tiny_moe_dirs, tmp_path_factory) -> R3Run:
    env_threads()
    return asyncio.run(_scenario(tiny_moe_dirs[ARCH], tmp_path_factory.mktemp("r3_trainer")))


def _max_abs_diff(a: list[list[float]], b: list[list[float]]) -> float:
    return max(abs(x - y) for ra, rb in zip(a, b) for x, y in zip(ra, rb))


@pytest.mark.timeout(600)
def test_replaying_the_fp32_engines_experts_gives_the_trainers_own_logprobs(r3_run):
    assert _max_abs_diff(r3_run.plain, r3_run.engine_logprobs) < 1e-4  # same routing, same model
    assert _max_abs_diff(r3_run.replay_own, r3_run.plain) < 1e-5


@pytest.mark.timeout(600)
def test_replaying_other_experts_changes_the_logprobs(r3_run):
    assert _max_abs_diff(r3_run.replay_other, r3_run.plain) > 1e-2


@pytest.mark.timeout(600)
def test_a_training_step_with_replay_reports_finite_routing_metrics(r3_run):
    m = r3_run.metrics
    assert math.isfinite(m["loss"]) and m["update_successful"] == 1.0
    assert m["moe/routing_mismatch"] == 1.0  # every replayed token's set differs from the trainer's own
    for layer in (0, 2):  # the MoE layers; layer 1 is dense
        assert 1.0 <= m[f"moe/load_imbalance_layer{layer}"] <= 8.0
    assert "moe/load_imbalance_layer1" not in m
    assert math.isfinite(m["moe/load_balancing_loss"]) and m["moe/load_balancing_loss"] > 0


@pytest.mark.timeout(600)
def test_experts_of_the_wrong_shape_fail_the_op_naming_the_sample_and_the_ranks_go_on(r3_run):
    assert re.search(r"sample \(9, (\d)\): rollout_routed_experts has shape \((\d+), 1, 2\), the trainer expects "
                     r"\(\2, 2, 2\)", r3_run.bad_shape_error), r3_run.bad_shape_error[-2000:]
    assert r3_run.after_error == r3_run.plain
