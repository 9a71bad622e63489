"""Expert parallelism against every expert on every rank, on the same batch: logprob and loss parity,
train tokens/s and peak memory per rank (issue #30 item 1; a torchrun script).

    torchrun --nproc-per-node 2 benchmarks/gpu/moe_ep.py --model-dir DIR --layouts 1 2
    torchrun --nproc-per-node 2 benchmarks/gpu/moe_ep.py --model-dir TINY --seq-len 32 \
        --tokens-per-step 512 --max-tokens-per-gpu 128 --steps 1   # the CPU check (gloo)

For each ``--layouts`` EP size: a fresh ``TrainerOps`` (what the torchrun worker serves; no RPC)
from the same HF checkpoint at ``--expert-model-parallel-size`` EP, the other ranks of the layout
data-parallel; each rank takes the same shard of one fixed global batch in every layout. Parity:
the logprobs of the shard, one SGD step (no momentum, the aux loss off: it is a statistic of each
rank's own tokens; SGD, since Adam's first step is about lr × sign(grad)), the logprobs again.
Speed: ``--steps`` more train steps after ``--warmup``, global train tokens/s, then each rank's peak
allocated memory. Rank 0 prints the table and each layout's largest |Δ logprob| and |Δ loss| against
the first layout's. On GPU the ranks run NCCL (megatron-core's all-to-all or all-gather dispatcher,
as ``--moe-token-dispatcher-type`` says); on CPU gloo and the all-gather dispatcher.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.gpu.trainer_throughput import init_single_rank_env, sync, timed  # noqa: E402
from benchmarks.trainer_overhead import make_batch  # noqa: E402

SGD = dict(optimizer="sgd", sgd_momentum=0.0, weight_decay=0.0, clip_grad=1.0, lr_warmup_iters=0,
           moe_aux_loss_coeff=0.0)


def flat(rows) -> torch.Tensor:
    return torch.tensor([x for row in rows for x in row.logprobs], dtype=torch.float64)


def run_layout(args, ep: int, world: int, batch, normalizer: float, spec) -> dict:
    """One layout: parity step, then timing; this rank's logprobs and peak memory, rank 0's loss."""
    from megatron.core import parallel_state

    from actors.megatron.config import TrainerConfig
    from actors.trainer.ops import TrainerOps

    if parallel_state.model_parallel_is_initialized():
        parallel_state.destroy_model_parallel()  # the default process group stays
    megatron = dict(SGD, lr=args.lr, expert_model_parallel_size=ep)
    if args.dispatcher:
        megatron["moe_token_dispatcher_type"] = args.dispatcher
    config = TrainerConfig(hf_checkpoint=args.model_dir, max_tokens_per_gpu=args.max_tokens_per_gpu,
                           actor_num_procs=world, actor_num_gpus_per_node=world, megatron=megatron).validate()
    ops = TrainerOps(config)
    rank = dist.get_rank()
    shard = batch.select(list(range(rank, len(batch.tokens), world)))
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    before = flat(ops.compute_logprobs(shard))
    metrics = ops.train_step(shard, spec, normalizer) or {}
    after = flat(ops.compute_logprobs(shard))
    seconds = timed(lambda: ops.train_step(shard, spec, normalizer), args.warmup, args.steps)
    sync()
    peak = torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else float("nan")
    result = dict(before=before, after=after, loss=metrics.get("loss"),
                  grad_norm=metrics.get("grad_norm"), seconds=seconds, peak=peak)
    del ops
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-dir", required=True, help="an HF Qwen3-MoE (or any MoE the bridge maps) dir")
    parser.add_argument("--layouts", type=int, nargs="+", default=[1, 2], help="EP sizes; the first is the reference")
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--tokens-per-step", type=int, default=32768)
    parser.add_argument("--max-tokens-per-gpu", type=int, default=8192)
    parser.add_argument("--lr", type=float, default=1e-3, help="SGD's; the parity step's size")
    parser.add_argument("--dispatcher", help="--moe-token-dispatcher-type (default: the bridge's)")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    init_single_rank_env()

    from transformers import AutoConfig

    from policies.algorithm import AlgorithmConfig

    vocab = AutoConfig.from_pretrained(args.model_dir).vocab_size
    world = int(os.environ["WORLD_SIZE"])
    samples = max(world, args.tokens_per_step // args.seq_len // world * world)  # the same count on every rank
    # Advantages of both signs that do not cancel, so the loss (compared across layouts) is not 0.
    batch = make_batch(samples, args.seq_len, vocab)
    batch.advantages = [[1.0 if i % 3 == 0 else -0.25] * len(a) for i, a in enumerate(batch.advantages)]
    spec = AlgorithmConfig()
    normalizer = batch.normalizer(spec.loss_agg)
    results = {}
    for ep in args.layouts:
        results[ep] = run_layout(args, ep, world, batch, normalizer, spec)
    rank = dist.get_rank()
    gathered = [None] * world
    dist.all_gather_object(gathered, {ep: {k: r[k] for k in ("before", "after", "peak")} for ep, r in results.items()})
    if rank != 0:
        return
    tokens = sum(batch.lengths)
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "CPU"
    print(f"\n{world} ranks on {device}; {len(batch.tokens)} samples x {args.seq_len} tokens per step "
          f"(micro-batches <= {args.max_tokens_per_gpu} tokens a rank); SGD lr {args.lr}")
    reference = args.layouts[0]
    ref_before = torch.cat([g[reference]["before"] for g in gathered])
    ref_after = torch.cat([g[reference]["after"] for g in gathered])
    print("| layout | train tok/s | s/step | loss | grad norm | peak GiB per rank | max \\|Δ logprob\\| before / after the "
          f"step vs EP{reference} | \\|Δ loss\\| |")
    print("|---|---:|---:|---:|---:|---|---|---:|")
    for ep, r in results.items():
        before = torch.cat([g[ep]["before"] for g in gathered])
        after = torch.cat([g[ep]["after"] for g in gathered])
        peaks = " / ".join(f"{g[ep]['peak']:.1f}" for g in gathered)
        print(f"| EP{ep} x DP{world} | {tokens / r['seconds']:.0f} | {r['seconds']:.3f} | {r['loss']:.6f} "
              f"| {r['grad_norm']:.4f} | {peaks} | {(before - ref_before).abs().max().item():.2e} / "
              f"{(after - ref_after).abs().max().item():.2e} | {abs(r['loss'] - results[reference]['loss']):.2e} |")
    moved = (ref_after - ref_before).abs().max().item()
    print(f"the parity step moves the logprobs by up to {moved:.3f} (EP{reference})", flush=True)


if __name__ == "__main__":
    main()
