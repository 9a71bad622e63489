"""torchrun script: Megatron DDP + get_megatron_optimizer (Adam) + get_forward_backward_func on CPU.

For each TP size in --tp (re-initialising Megatron's groups on the same gloo world), loads an
HF checkpoint, then runs --steps training steps on one fixed batch. Rank 0 writes
{"tp1": {"losses": [...], "grad_norms": [...], "updated": bool, "params_changed": bool}, ...}.
This is the minimal shape of the worker's train_step, kept here as an executable example.
With --kernel-checks-hf-dir it then runs fused_kernels_tp2.py's TP=2 checks in the same
launch (results under "kernels"): one torchrun start fewer for the suite.
"""

import argparse
import json
from functools import partial

import torch
import torch.distributed as dist
from megatron.core import parallel_state
from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig, finalize_model_grads
from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
from megatron.core.pipeline_parallel import get_forward_backward_func

from actors.megatron.model import build_gpt_model
from actors.megatron.parallel import init_model_parallel


def loss_func(loss_mask: torch.Tensor, per_token_loss: torch.Tensor):
    # 3-tuple form: (sum of loss, token count, reporting dict); the schedule divides by tokens.
    total = (per_token_loss.float() * loss_mask).sum()
    tokens = loss_mask.sum().to(torch.int)
    return total, tokens, {"lm loss": torch.stack([total.detach(), tokens.float()])}


def forward_step(data_iterator, model):
    batch = next(data_iterator)
    output = model(batch["tokens"], batch["positions"], attention_mask=None, labels=batch["labels"])
    return output, partial(loss_func, batch["loss_mask"])


def train(hf_dir: str, tp: int, steps: int) -> dict:
    init_model_parallel(tensor_parallel_size=tp)
    model = build_gpt_model(hf_dir, {}, load_weights=True)
    ddp_config = DistributedDataParallelConfig(
        grad_reduce_in_fp32=True, overlap_grad_reduce=False, use_distributed_optimizer=False
    )
    model = DistributedDataParallel(config=model.config, ddp_config=ddp_config, module=model)
    model.config.finalize_model_grads_func = finalize_model_grads
    optimizer = get_megatron_optimizer(
        OptimizerConfig(optimizer="adam", lr=1e-2, clip_grad=1.0, weight_decay=0.0), [model]
    )
    before = [p.detach().clone() for p in model.parameters()]

    # Each data-parallel rank gets its own sequences.
    dp_rank = parallel_state.get_data_parallel_rank()
    gen = torch.Generator().manual_seed(100 + dp_rank)
    tokens = torch.randint(0, 120, (2, 16), generator=gen)
    batch = {
        "tokens": tokens[:, :-1],
        "labels": tokens[:, 1:],
        "positions": torch.arange(15).unsqueeze(0).expand(2, 15),
        "loss_mask": torch.ones(2, 15),
    }
    losses, grad_norms, updated = [], [], True
    for _ in range(steps):
        model.zero_grad_buffer()
        optimizer.zero_grad()
        reported = get_forward_backward_func()(
            forward_step_func=forward_step,
            data_iterator=iter([batch]),
            model=[model],
            num_microbatches=1,
            seq_length=15,
            micro_batch_size=2,
            forward_only=False,
        )
        ok, grad_norm, _ = optimizer.step()
        updated = updated and bool(ok)
        total, count = reported[0]["lm loss"]
        losses.append((total / count).item())
        grad_norms.append(float(grad_norm))
    changed = any(not torch.equal(a, b.detach()) for a, b in zip(before, model.parameters()))
    parallel_state.destroy_model_parallel()
    return {"losses": losses, "grad_norms": grad_norms, "updated": updated, "params_changed": changed}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--hf-dir", required=True)
    parser.add_argument("--tp", type=int, action="append", required=True)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--out", required=True)
    parser.add_argument("--kernel-checks-hf-dir", help="also run fused_kernels_tp2.run_checks on this model")
    args = parser.parse_args()
    results = {f"tp{tp}": train(args.hf_dir, tp, args.steps) for tp in args.tp}
    if args.kernel_checks_hf_dir:
        from fused_kernels_tp2 import run_checks  # this script's directory is on sys.path

        results["kernels"] = run_checks(args.kernel_checks_hf_dir)
    if dist.get_rank() == 0:
        with open(args.out, "w") as f:
            json.dump(results, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
