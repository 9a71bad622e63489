"""torchrun script (2 ranks): TrainerOps at TP1·PP2 against TP1·PP1 (DP2) on one batch and model.

Three layouts one after another in the same process group (Megatron's groups are rebuilt):
1. PP1 (DP2): logprobs, reference logprobs, step 1, logprobs after it, HF export, checkpoint
   C1, weight-sync metadata, step 2 and the logprobs after it;
2. PP2: an HF export of the loaded weights, then the same as 1 (checkpoint C2); then C1 loaded
   (saved at PP1), step 2 taken from it and the logprobs after it;
3. PP1 (DP2): C2 loaded (saved at PP2), step 2 taken from it and the logprobs after it;
4. the critic (CriticOps) at PP1 (DP2) and at PP2: values, one value-loss step, values after it.
Rank 0 writes everything as JSON to --out; the exports go next to it.
"""

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path

import torch.distributed as dist
from megatron.core import parallel_state

from actors.critic.ops import CriticOps
from actors.megatron.config import TrainerConfig
from actors.megatron.dp_split import split_across_dp
from actors.trainer.ops import TrainerOps
from policies.algorithm import AlgorithmConfig
from slime_async.batch import Batch

PPO_KL = AlgorithmConfig(use_kl_loss=True, kl_loss_coef=0.1, entropy_coef=0.01)
RETURNS = [1.0, -1.0, 0.5, -0.5, 1.5, -1.5]


def fixed_batch(old: list[list[float]] | None = None, ref: list[list[float]] | None = None) -> Batch:
    """Six samples of different lengths (ids < 127): micro-batches of different shapes."""
    tokens = [[3, 17, 25, 9, 40, 41, 42, 43], [5, 6, 7, 100, 101], [11, 12, 13, 14, 15, 16, 60, 61, 62, 63, 64],
              [20, 21, 22, 23, 24, 25], [8, 30, 31, 32, 33, 34, 35, 36, 37], [2, 70, 71]]
    response_lengths = [4, 2, 5, 3, 6, 2]
    loss_masks = [[1] * n for n in response_lengths]
    loss_masks[4][2:4] = [0, 0]  # a tool output inside the response
    advantages = [[a] * n for a, n in zip([1.0, -1.0, 0.5, -0.5, 1.5, -1.5], response_lengths)]
    return Batch(tokens=tokens, response_lengths=response_lengths, loss_masks=loss_masks, advantages=advantages,
                 rollout_logprobs=old, old_logprobs=old, ref_logprobs=ref, temperature=0.7)


def first(values: list) -> object:
    return next(v for v in values if v is not None)


class Layout:
    """TrainerOps (or CriticOps) at one pipeline size, and the batch sharded as the actor would."""

    def __init__(self, hf_dir: str, pp: int, ops_class: type = TrainerOps):
        if parallel_state.model_parallel_is_initialized():
            parallel_state.destroy_model_parallel()
        policy = ops_class is TrainerOps
        # The policy's LR warms up over 2 steps (a checkpoint must bring the schedule back); the
        # critic takes one step, at the full LR.
        config = TrainerConfig(hf_checkpoint=hf_dir, max_tokens_per_gpu=24, use_reference=policy,
                               megatron={"pipeline_model_parallel_size": pp, "lr": 1e-3, "clip_grad": 1.0,
                                         "lr_warmup_iters": 2 if policy else 0}).validate()
        self.ops = ops_class(config)
        self.info = self.ops.info()

    def gathered(self, batch: Batch, rows_of_shard) -> list:
        """``rows_of_shard(shard)`` (rows or None) of every rank, merged back into batch order."""
        indices, shard = self.shard(batch)
        answers: list = [None] * dist.get_world_size()
        dist.all_gather_object(answers, (indices, rows_of_shard(shard)))
        merged: list = [None] * len(batch)
        for got_indices, got_rows in answers:
            for i, row in zip(got_indices, got_rows or []):
                merged[i] = row
        return merged

    def metrics(self, metrics: dict | None) -> dict[str, float]:
        answers: list = [None] * dist.get_world_size()
        dist.all_gather_object(answers, metrics)
        return {k: v for k, v in first(answers).items() if k != "step_time_s"}

    def shard(self, batch: Batch) -> tuple[list[int], Batch]:
        bins = split_across_dp(batch.lengths, self.info.dp_size)
        return bins[self.info.dp_rank], batch.select(bins[self.info.dp_rank])

    def logprobs(self, batch: Batch, model: str = "actor") -> list[list[float]]:
        def rows(shard: Batch):
            got = self.ops.compute_logprobs(shard, model=model)
            return [r.logprobs for r in got] if got is not None else None

        return self.gathered(batch, rows)

    def step(self, batch: Batch) -> dict[str, float]:
        _, shard = self.shard(batch)
        return self.metrics(self.ops.train_step(shard, PPO_KL, normalizer=batch.normalizer(PPO_KL.loss_agg, None)))

    def metadata(self) -> list:
        answers: list = [None] * dist.get_world_size()
        dist.all_gather_object(answers, self.ops.weight_metadata())
        return [[(m.name, m.dtype, list(m.shape)) for m in bucket] for bucket in first(answers)]

    def load(self, path: Path) -> int:
        return self.ops.load(str(path))


def train_and_save(layout: Layout, work: Path, name: str, batch: Batch | None = None) -> dict:
    """``batch``: the training batch (default: this layout's own logprobs as π_old and reference)."""
    out: dict = {"logprobs0": layout.logprobs(fixed_batch()), "ref": layout.logprobs(fixed_batch(), "ref")}
    batch = batch or fixed_batch(out["logprobs0"], out["ref"])
    out["step1"] = layout.step(batch)
    out["logprobs1"] = layout.logprobs(fixed_batch())
    layout.ops.export_hf(str(work / f"export-{name}"))
    layout.ops.save(str(work / f"ckpt-{name}"))
    out["metadata"] = layout.metadata()
    return out


def critic_step(layout: Layout) -> dict:
    """The critic's values, one clipped-value-loss step on fixed returns, the values after it."""
    out: dict = {"values0": layout.gathered(fixed_batch(), layout.ops.compute_values)}
    batch = fixed_batch()
    batch = dataclasses.replace(batch, values=out["values0"],
                                returns=[[r] * n for r, n in zip(RETURNS, batch.response_lengths)])
    _, shard = layout.shard(batch)
    out["step"] = layout.metrics(layout.ops.train_step(shard, 10.0, "token_mean",
                                                       normalizer=batch.normalizer("token_mean", None)))
    out["values1"] = layout.gathered(fixed_batch(), layout.ops.compute_values)
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--hf-dir", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    work = Path(args.out).parent

    pp1 = Layout(args.hf_dir, pp=1)
    r1 = train_and_save(pp1, work, "pp1")
    # Every layout trains on this batch (π_old and reference from PP1), so only the layout differs.
    batch = fixed_batch(r1["logprobs0"], r1["ref"])
    r1["step2"] = pp1.step(batch)
    r1["logprobs2"] = pp1.logprobs(fixed_batch())  # after step 2: Adam's moments show here

    pp2 = Layout(args.hf_dir, pp=2)
    r2: dict = {"info": [None] * dist.get_world_size()}
    dist.all_gather_object(r2["info"], (pp2.info.pp_rank, pp2.info.pp_size, pp2.info.dp_size))
    pp2.ops.export_hf(str(work / "export-pp2-initial"))
    r2.update(train_and_save(pp2, work, "pp2", batch))
    r2["loaded_step_from_pp1"] = pp2.load(work / "ckpt-pp1")
    r2["step2_from_pp1"] = pp2.step(batch)
    r2["logprobs2_from_pp1"] = pp2.logprobs(fixed_batch())

    back = Layout(args.hf_dir, pp=1)
    r1["loaded_step_from_pp2"] = back.load(work / "ckpt-pp2")
    r1["step2_from_pp2"] = back.step(batch)
    r1["logprobs2_from_pp2"] = back.logprobs(fixed_batch())

    critic = {"pp1": critic_step(Layout(args.hf_dir, pp=1, ops_class=CriticOps)),
              "pp2": critic_step(Layout(args.hf_dir, pp=2, ops_class=CriticOps))}
    if dist.get_rank() == 0:
        Path(args.out).write_text(json.dumps({"pp1": r1, "pp2": r2, "critic": critic}))
    dist.barrier()


# megatron-core's checkpoint writer starts a multiprocessing child that imports this script as
# __mp_main__: it must die with its rank, or it keeps torchrun's output pipes (and the test) open.
if __name__ == "__mp_main__":
    from actors.megatron.worker import die_with_parent

    die_with_parent()

if __name__ == "__main__":
    main()
    sys.stdout.flush()
    os._exit(0)  # as non_finite_step.py: skip teardown, a gloo helper thread may abort it
