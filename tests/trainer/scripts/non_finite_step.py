"""torchrun script: TrainerOps (the worker's per-rank operations) facing NaN.

1. A train step whose loss is NaN on one DP rank only: every rank must skip the optimizer step.
2. A NaN written into one parameter of the last rank: every rank must refuse to export.
Rank 0 writes {"skipped": metrics, "unchanged": bool, "export_errors": [str per rank], "exported": bool}.
"""

import argparse
import json
import math
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from actors.megatron.config import TrainerConfig
from actors.trainer.ops import NonFiniteWeights, TrainerOps
from policies.algorithm import AlgorithmConfig
from slime_async.batch import Batch


def batch(advantage: float) -> Batch:
    tokens = [[3, 17, 25, 9, 40, 41], [5, 6, 7, 100, 101]]
    response_lengths = [3, 2]
    return Batch(tokens=tokens, response_lengths=response_lengths, loss_masks=[[1] * n for n in response_lengths],
                 advantages=[[advantage] * n for n in response_lengths], temperature=1.0)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--hf-dir", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    config = TrainerConfig(hf_checkpoint=args.hf_dir, micro_batch_size=2,
                           megatron={"lr": 1e-2, "lr_warmup_iters": 0}).validate()
    ops = TrainerOps(config)
    rank, world = dist.get_rank(), dist.get_world_size()
    before = {n: p.detach().clone() for n, p in ops._params().items()}
    # Each rank trains its own shard (DP): only the last one's loss is NaN.
    shard = batch(math.nan if rank == world - 1 else 1.0)
    metrics = ops.train_step(shard, AlgorithmConfig(), normalizer=float(sum(shard.response_lengths) * world))
    unchanged = all(torch.equal(before[n], p) for n, p in ops._params().items())
    with torch.no_grad():
        if rank == world - 1:
            next(iter(ops._params().values())).view(-1)[0] = math.nan
    error = ""
    try:
        ops.export_hf(str(Path(args.out).parent / "export"))
    except NonFiniteWeights as refused:
        error = str(refused)
    errors = [None] * world
    dist.all_gather_object(errors, error)
    flags = [None] * world
    dist.all_gather_object(flags, unchanged)
    if rank == 0:
        exported = (Path(args.out).parent / "export" / "model.safetensors").exists()
        Path(args.out).write_text(json.dumps({"skipped": metrics, "unchanged": all(flags), "export_errors": errors,
                                              "exported": exported}))
    dist.barrier()


if __name__ == "__main__":
    main()
    # Skip interpreter teardown: a gloo/Megatron helper thread still alive there occasionally
    # aborts the process ("terminate called without an active exception", seen in a CI run)
    # after the report is written; what the test checks is that report.
    sys.stdout.flush()
    os._exit(0)
