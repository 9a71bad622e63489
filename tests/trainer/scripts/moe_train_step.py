"""torchrun script: one optimizer step of an MoE model at a (TP, EP) layout, then its logprobs.

For every ``--model NAME=DIR``: load the HF checkpoint at --tp / --ep / --etp (experts over the
data-parallel ranks, each split over --etp ranks; at TP > 1 megatron-core trains MoE layers under
sequence parallelism, which the bridge turns on), run one forward-backward on a fixed global batch
(each data-parallel rank takes its share; the loss is the trainer's vocab-parallel logprobs, which
leave TP's vocab padding out) and one SGD step, then score a fixed batch. Rank 0 writes
{"NAME": {"loss", "logprobs" and "initial_logprobs" ([[...], ...]), "changed"}} to --out, so layouts can
be compared token by token. SGD, not Adam: Adam's first step is ~lr * sign(grad), which turns
rounding-level gradient differences on near-zero gradients into lr-sized weight differences.
The aux loss is off: it is a statistic of each rank's own tokens, so it differs by layout.
With --parity-out, hf_logit_parity.py's comparison with transformers runs first in the same
launch (one megatron-core start fewer), and with --export-dir each model is exported as loaded.
``--sequence-parallel`` turns it on for a dense model too.
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
from actors.trainer.logprobs import vocab_parallel_logprobs
from hf_logit_parity import gather_vocab_parallel, parity_results

SEQ, BATCH = 17, 4  # 16 input tokens: a multiple of TP, which sequence parallelism splits
LR = 0.2  # SGD: moves the logprobs by ~5 (0.5 moved them by ~6 and amplified fp32 rounding to 1e-5 at TP2)


def loss_func(loss_mask: torch.Tensor, per_token_loss: torch.Tensor):
    total = (per_token_loss.float() * loss_mask).sum()
    tokens = loss_mask.sum().to(torch.int)
    return total, tokens, {"lm loss": torch.stack([total.detach(), tokens.float()])}


def forward_step(data_iterator, model):
    batch = next(data_iterator)
    logits = model(batch["tokens"], batch["positions"], attention_mask=None)
    # The trainer's logprobs, not megatron-core's cross-entropy over the labels: at TP > 1 the vocab
    # is padded to a multiple of TP, and only these leave the pad rows out of the softmax.
    logprobs, _ = vocab_parallel_logprobs(logits, batch["labels"], hf_vocab_size=model.module.hf_vocab_size,
                                          with_entropy=False)
    return -logprobs, partial(loss_func, batch["loss_mask"])


def batch_of(tokens: torch.Tensor) -> dict:
    rows = tokens.size(0)
    return {"tokens": tokens[:, :-1], "labels": tokens[:, 1:], "loss_mask": torch.ones(rows, SEQ - 1),
            "positions": torch.arange(SEQ - 1).unsqueeze(0).expand(rows, SEQ - 1)}


def step_then_score(hf_dir: str, overrides: dict) -> dict:
    model = build_gpt_model(hf_dir, {"moe_aux_loss_coeff": 0.0, **overrides}, load_weights=True)
    model = DistributedDataParallel(config=model.config, module=model, ddp_config=DistributedDataParallelConfig(
        grad_reduce_in_fp32=True, overlap_grad_reduce=False, use_distributed_optimizer=False))
    model.config.finalize_model_grads_func = finalize_model_grads
    optimizer = get_megatron_optimizer(OptimizerConfig(optimizer="sgd", lr=LR, sgd_momentum=0.0, weight_decay=0.0,
                                                       clip_grad=0.0), [model])
    before = [p.detach().clone() for p in model.parameters()]
    tokens = torch.randint(0, 120, (BATCH, SEQ), generator=torch.Generator().manual_seed(7))
    initial = score(model, tokens)
    dp, dp_rank = parallel_state.get_data_parallel_world_size(), parallel_state.get_data_parallel_rank()
    share = batch_of(tokens.chunk(dp)[dp_rank])
    model.train()
    losses = get_forward_backward_func()(
        forward_step_func=forward_step, data_iterator=iter([share]), model=[model], num_microbatches=1,
        seq_length=SEQ - 1, micro_batch_size=share["tokens"].size(0), forward_only=False)
    updated, _, _ = optimizer.step()
    changed = any(not torch.equal(b, p) for b, p in zip(before, model.parameters()))
    after = score(model, tokens)
    loss = losses[0]["lm loss"] if losses else torch.zeros(2)
    return {"loss": (loss[0] / loss[1]).item(), "logprobs": after.tolist(), "initial_logprobs": initial.tolist(),
            "changed": changed and bool(updated)}


def score(model: torch.nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    """[BATCH, SEQ - 1] logprob of each next token (full vocab gathered over TP)."""
    model.eval()
    full = batch_of(tokens)
    with torch.no_grad():
        logits = gather_vocab_parallel(model(full["tokens"], full["positions"], attention_mask=None))
    logprobs = torch.log_softmax(logits[..., : model.module.hf_vocab_size].float(), dim=-1)
    return logprobs.gather(-1, full["labels"].unsqueeze(-1)).squeeze(-1)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", action="append", required=True, help="NAME=HF_DIR")
    parser.add_argument("--tp", type=int, default=1)
    parser.add_argument("--ep", type=int, default=1)
    parser.add_argument("--etp", type=int, help="expert tensor-parallel size (default: --tp)")
    parser.add_argument("--out", required=True)
    parser.add_argument("--parity-out")
    parser.add_argument("--export-dir", help="with --parity-out: export each model as loaded (HF -> Megatron -> HF)")
    parser.add_argument("--sequence-parallel", action="store_true", help="for a dense model (on for MoE at TP > 1)")
    args = parser.parse_args()
    init_model_parallel(tensor_parallel_size=args.tp, expert_parallel_size=args.ep,
                        expert_tensor_parallel_size=args.etp)
    if args.parity_out:
        parity = parity_results(args.model, ("sdpa",), args.export_dir)
        if dist.get_rank() == 0:
            with open(args.parity_out, "w") as f:
                json.dump(parity, f)
    results = {}
    for spec in args.model:
        name, hf_dir = spec.split("=", 1)
        results[name] = step_then_score(hf_dir, {"sequence_parallel": True} if args.sequence_parallel else {})
    if dist.get_rank() == 0:
        with open(args.out, "w") as f:
            json.dump(results, f)
    parallel_state.destroy_model_parallel()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
