"""torchrun script: a bf16 run checkpoint (Megatron's Float16 optimizer) saves and resumes.

One rank trains a step on a tied-embedding model in bf16, saves the run checkpoint, trains one
more step (the reference), then a second TrainerOps loads the checkpoint and trains the same step.
Rank 0 writes {"dtypes": [param dtypes], "resumed_step": int, "same_loss": bool, "max_diff": float}.
"""

import argparse
import json
import multiprocessing
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from actors.megatron.config import TrainerConfig
from actors.trainer.ops import TrainerOps
from policies.algorithm import AlgorithmConfig
from slime_async.batch import Batch


def batch() -> Batch:
    tokens = [[3, 17, 25, 9, 40, 41], [5, 6, 7, 100, 101]]
    response_lengths = [3, 2]
    return Batch(tokens=tokens, response_lengths=response_lengths, loss_masks=[[1] * n for n in response_lengths],
                 advantages=[[1.0] * n for n in response_lengths], temperature=1.0)


def step(ops: TrainerOps) -> dict:
    shard = batch()
    return ops.train_step(shard, AlgorithmConfig(), normalizer=float(sum(shard.response_lengths)))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--hf-dir", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    config = TrainerConfig(hf_checkpoint=args.hf_dir, micro_batch_size=2,
                           megatron={"bf16": True, "lr": 1e-2, "lr_warmup_iters": 0}).validate()
    ckpt = str(Path(args.out).parent / "ckpt")
    ops = TrainerOps(config)
    dtypes = sorted({str(p.dtype) for p in ops._params().values()})
    step(ops)
    ops.save(ckpt)
    reference = step(ops)
    after = {n: p.detach().float().clone() for n, p in ops._params().items()}
    resumed = TrainerOps(config)
    resumed_step = resumed.load(ckpt)
    again = step(resumed)
    diff = max((after[n] - p.detach().float()).abs().max().item() for n, p in resumed._params().items())
    if dist.get_rank() == 0:
        Path(args.out).write_text(json.dumps({"dtypes": dtypes, "resumed_step": resumed_step, "max_diff": diff,
                                              "loss": [reference["loss"], again["loss"]]}))
    dist.barrier()


if __name__ == "__main__":
    main()
    sys.stdout.flush()
    # dist_checkpointing.save started a multiprocessing Manager (its write-results queue); os._exit
    # skips its finalizer, and an orphaned Manager would keep the launcher's output pipes open.
    for child in multiprocessing.active_children():
        child.terminate()
    os._exit(0)
