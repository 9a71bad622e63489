"""The trainer group trains an MoE model with its experts spread over ranks: EP2 (2 gloo ranks,
packed micro-batches), EP2 x expert-TP2 (4 ranks, right-padded) and TP2 x EP2 (4 ranks, sequence
parallel, packed, the chunked logprob head), on a batch whose data-parallel
shards cut into DIFFERENT numbers of micro-batches (one rank holds a single long sample, another
many short ones). Megatron-core dispatches tokens to experts collectively, so the ranks' micro-batches
are aligned (actors/megatron/mb_align.py); the logprobs before and after one optimizer step
equal a one-rank trainer's within 1e-5, and so does the step's loss; the HF export after the step
(what weight sync sends the engines) gives the same logprobs in transformers.

SGD, not Adam (Adam's first step is ~lr x sign(grad): rounding-level gradient differences would
become lr-sized), and the router aux loss is off (a statistic of each rank's own tokens).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest

from actors.megatron.dp_split import split_across_dp, split_into_micro_batches
from benchmarks.r3_mismatch import engine_view
from slime_async.batch import Batch
from worker_fixtures import PPO_KL, env_threads, running_trainer, trainer_config, transformers_logprobs

ARCH = "qwen3_moe"
MAX_TOKENS = 5  # the micro-batch token budget (samples x longest)
# One 19-token sample and five 4-token ones: at 2 ranks one rank takes the long sample alone (one
# micro-batch), the other the five short ones (five: two 4-token samples cost 8 > 5).
LENGTHS = [19, 4, 4, 4, 4, 4]
RESPONSE = [8, 2, 1, 2, 3, 2]
LAYOUTS = {  # name -> (ranks, TrainerConfig overrides)
    "ep2_packed": (2, dict(use_sdpa=True, attention_impl="varlen", megatron=dict(expert_model_parallel_size=2))),
    "ep2_etp2": (4, dict(megatron=dict(expert_model_parallel_size=2, expert_tensor_parallel_size=2))),
    # Sequence parallel (on for MoE at TP > 1): the 19-token sample's micro-batch is padded to 20, and
    # the chunked head gathers the sequence itself.
    # R3 on: each TP rank replays its slice of the engine's experts (checked beside the step, which
    # routes itself: its batch carries no experts).
    "tp2_ep2_packed_chunked": (4, dict(use_sdpa=True, attention_impl="varlen", logprob_impl="chunked",
                                       use_rollout_routing_replay=True,
                                       megatron=dict(tensor_model_parallel_size=2, expert_model_parallel_size=2))),
}
SGD = dict(optimizer="sgd", sgd_momentum=0.0, lr=0.05, weight_decay=0.0, clip_grad=1.0, lr_warmup_iters=0,
           moe_aux_loss_coeff=0.0)


def _batch(old_logprobs: list[list[float]] | None = None) -> Batch:
    tokens = [[(7 * i + 3 * t) % 120 + 2 for t in range(n)] for i, n in enumerate(LENGTHS)]
    return Batch(tokens=tokens, response_lengths=RESPONSE, loss_masks=[[1] * n for n in RESPONSE],
                 advantages=[[a] * n for a, n in zip([1.0, -1.0, 0.5, -0.5, 1.5, -1.5], RESPONSE)],
                 rollout_logprobs=old_logprobs, old_logprobs=old_logprobs, ref_logprobs=old_logprobs,
                 temperature=0.7)


@dataclass
class Step:
    before: list[list[float]] = field(default_factory=list)
    after: list[list[float]] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)
    export_dir: Path | None = None  # the HF export after the step (each expert gathered from its rank)
    # With R3: logprobs replaying the fp32 engine's experts, and every token's experts shifted by one.
    replay_own: list[list[float]] = field(default_factory=list)
    replay_other: list[list[float]] = field(default_factory=list)


async def _one_step(hf_dir: Path, work: Path, ranks: int, overrides: dict, old: list[list[float]] | None) -> Step:
    overrides = dict(overrides)
    megatron = {**SGD, **overrides.pop("megatron", {})}
    config = trainer_config(hf_dir, procs=ranks, tp=1, max_tokens_per_gpu=MAX_TOKENS, megatron=megatron, **overrides)
    step = Step()
    async with running_trainer(config.validate(), work) as trainer:
        step.before = [r.logprobs for r in await trainer.ask("compute_logprobs", _batch(), timeout=None)]
        if config.use_rollout_routing_replay:
            step.replay_own, step.replay_other = await _replayed(trainer, hf_dir)
        batch = _batch(old or step.before)
        step.metrics = await trainer.ask("train_step", batch, PPO_KL, timeout=None)
        step.after = [r.logprobs for r in await trainer.ask("compute_logprobs", _batch(), timeout=None)]
        if ranks > 1:
            step.export_dir = work / "export"
            await trainer.ask("export_hf", str(step.export_dir), timeout=None)
    return step


async def _replayed(trainer, hf_dir: Path) -> tuple[list[list[float]], list[list[float]]]:
    """Logprobs replaying the experts a transformers fp32 forward chose, then other experts."""
    from actors.engine.cpu.model_runner import ModelRunner

    batch = _batch()
    experts, _ = engine_view(ModelRunner(hf_dir), batch.tokens, batch.response_lengths, batch.temperature)
    out = []
    for routed in (experts, [(e + 1) % 8 for e in experts]):
        rows = await trainer.ask("compute_logprobs", replace(batch, routed_experts=routed), timeout=None)
        out.append([r.logprobs for r in rows])
    return out[0], out[1]


async def _scenario(hf_dir: Path, work: Path) -> dict[str, Step]:
    steps = {"single": await _one_step(hf_dir, work / "single", 1, {}, None)}
    for name, (ranks, overrides) in LAYOUTS.items():
        steps[name] = await _one_step(hf_dir, work / name, ranks, overrides, steps["single"].before)
    return steps


@pytest.fixture(scope="module")
def moe_steps(tiny_moe_dirs, tmp_path_factory) -> dict[str, Step]:
    env_threads()
    return asyncio.run(_scenario(tiny_moe_dirs[ARCH], tmp_path_factory.mktemp("moe_ep")))


def _max_abs_diff(a: list[list[float]], b: list[list[float]]) -> float:
    assert [len(r) for r in a] == [len(r) for r in b]
    return max(abs(x - y) for ra, rb in zip(a, b) for x, y in zip(ra, rb))


@pytest.mark.parametrize("ranks", [2, 4])
def test_the_ranks_shards_cut_into_different_numbers_of_micro_batches(ranks):
    counts = [len(split_into_micro_batches([LENGTHS[i] for i in shard], max_tokens=MAX_TOKENS))
              for shard in split_across_dp(LENGTHS, ranks)]
    assert len(set(counts)) > 1, counts  # else the alignment would not be exercised


@pytest.mark.timeout(900)
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_expert_parallel_logprobs_before_and_after_one_step_equal_one_ranks_within_1e_5(moe_steps, layout):
    single, spread = moe_steps["single"], moe_steps[layout]
    # The step moves the logprobs far more than the tolerance, so equal logprobs mean equal steps.
    assert _max_abs_diff(single.after, single.before) > 1e-2
    assert _max_abs_diff(spread.before, single.before) < 1e-5
    assert _max_abs_diff(spread.after, single.after) < 1e-5


@pytest.mark.timeout(900)
def test_under_sequence_parallelism_each_tp_rank_replays_its_slice_of_the_engines_experts(moe_steps):
    step = moe_steps["tp2_ep2_packed_chunked"]
    assert _max_abs_diff(step.replay_own, step.before) < 1e-5  # the fp32 engine routes as the trainer
    assert _max_abs_diff(step.replay_other, step.before) > 1e-2


@pytest.mark.timeout(900)
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_expert_parallel_step_loss_equals_one_ranks(moe_steps, layout):
    single, spread = moe_steps["single"].metrics, moe_steps[layout].metrics
    assert spread["update_successful"] == 1.0
    assert abs(spread["loss"] - single["loss"]) < 1e-5 and abs(spread["grad_norm"] - single["grad_norm"]) < 1e-4


@pytest.mark.timeout(900)
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_the_hf_export_after_an_expert_parallel_step_gives_the_trainers_logprobs_in_transformers(moe_steps, layout):
    step = moe_steps[layout]
    assert _max_abs_diff(transformers_logprobs(step.export_dir, _batch()), step.after) < 1e-4
