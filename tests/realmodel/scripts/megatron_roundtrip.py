"""torchrun script: the real model in Megatron at TP = world size and at TP = 1, in one launch.

Starting megatron-core ranks costs ~10 s of CPU each time, so one launch does everything:

1. TP = world size: load the HF checkpoint, run the prompt, write the gathered logits to
   ``--out-dir/logits_tp{W}.pt``, then export the model back to ``--out-dir/export_tp{W}``;
2. TP = 1 (the same ranks regrouped; only rank 0 runs the model): ``logits_tp1.pt``.

Logits are [1, seq, hf_vocab] fp32 and are compared with transformers by the test.
"""

import argparse
import json
import os
from pathlib import Path

import torch
import torch.distributed as dist
from megatron.core import parallel_state

from actors.megatron.bridge import save_hf_checkpoint
from actors.megatron.model import build_gpt_model
from actors.megatron.parallel import destroy_model_parallel, init_model_parallel


def gather_vocab_parallel(logits: torch.Tensor) -> torch.Tensor:
    tp = parallel_state.get_tensor_model_parallel_world_size()
    if tp == 1:
        return logits
    parts = [torch.empty_like(logits) for _ in range(tp)]
    dist.all_gather(parts, logits.contiguous(), group=parallel_state.get_tensor_model_parallel_group())
    return torch.cat(parts, dim=-1)


def logits_of(model: torch.nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    positions = torch.arange(tokens.size(1)).unsqueeze(0)
    with torch.no_grad():
        logits = model.eval()(tokens, positions, attention_mask=None)
    return gather_vocab_parallel(logits)[..., : model.hf_vocab_size]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--hf-dir", required=True)
    parser.add_argument("--tokens", required=True, help="JSON file holding one list of token ids")
    parser.add_argument("--out-dir", required=True)
    args = parser.parse_args()
    out = Path(args.out_dir)
    tokens = torch.tensor([json.loads(Path(args.tokens).read_text())])
    world = int(os.environ["WORLD_SIZE"])

    init_model_parallel(tensor_parallel_size=world)
    rank = dist.get_rank()
    model = build_gpt_model(args.hf_dir, {}, load_weights=True)
    logits = logits_of(model, tokens)
    if rank == 0:
        torch.save(logits, out / f"logits_tp{world}.pt")
    save_hf_checkpoint(model, args.hf_dir, out / f"export_tp{world}")
    del model

    if world > 1:
        # Regroup the same ranks as TP = 1 (data parallel W): only rank 0 needs to run it.
        parallel_state.destroy_model_parallel()
        init_model_parallel(tensor_parallel_size=1)
    if rank == 0:
        torch.save(logits_of(build_gpt_model(args.hf_dir, {}, load_weights=True), tokens), out / "logits_tp1.pt")
    dist.barrier()
    destroy_model_parallel()


if __name__ == "__main__":
    main()
