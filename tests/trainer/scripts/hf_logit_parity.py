"""torchrun script: load HF checkpoints into Megatron at TP = world size (or --tp, with --ep
expert-parallel ranks for MoE models) and compare logits.

For every ``--model NAME=DIR`` and both core attentions (unfused local, SDPA), rank 0 writes
{"NAME/unfused": {"max_abs_diff", "logit_std", "shape", "expected_shape"}, ...} to --out.
One launch covers every model because starting a megatron-core process costs ~10 s of CPU.
With --export-dir, each model (as loaded for the last attention) is also exported as an HF
checkpoint to EXPORT_DIR/NAME (the round trip HF -> Megatron -> HF).
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


def megatron_logits(hf_dir: str, tokens: torch.Tensor, use_sdpa: bool) -> tuple[torch.Tensor, torch.nn.Module]:
    model = build_gpt_model(hf_dir, {}, use_sdpa=use_sdpa, load_weights=True).eval()
    positions = torch.arange(tokens.size(1)).unsqueeze(0).expand_as(tokens)
    with torch.no_grad():
        logits = model(tokens, positions, attention_mask=None)
    return gather_vocab_parallel(logits)[..., : model.hf_vocab_size], model


def hf_logits(hf_dir: str, tokens: torch.Tensor) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32, attn_implementation="eager")
    with torch.no_grad():
        return hf.eval()(tokens).logits


def parity_results(models: list[str], attentions: tuple[str, ...], export_dir: str | None) -> dict:
    """Logit comparisons ("NAME/attention" -> stats, on rank 0) of every NAME=DIR model, each
    exported to EXPORT_DIR/NAME afterwards when ``export_dir`` is given."""
    results = {}
    for spec in models:
        name, hf_dir = spec.split("=", 1)
        tokens = torch.randint(0, 120, (2, 12), generator=torch.Generator().manual_seed(0))
        expected = hf_logits(hf_dir, tokens) if dist.get_rank() == 0 else None
        for attention in attentions:
            logits, model = megatron_logits(hf_dir, tokens, attention == "sdpa")
            if expected is not None:
                results[f"{name}/{attention}"] = {
                    "max_abs_diff": (logits - expected).abs().max().item(),
                    "logit_std": expected.std().item(),
                    "shape": list(logits.shape),
                    "expected_shape": list(expected.shape),
                }
        if export_dir:
            save_hf_checkpoint(model, hf_dir, Path(export_dir) / name)
    return results


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", action="append", required=True, help="NAME=HF_DIR")
    parser.add_argument("--out", required=True)
    parser.add_argument("--tp", type=int, default=int(os.environ["WORLD_SIZE"]))
    parser.add_argument("--ep", type=int, default=1)
    parser.add_argument("--attention", action="append", choices=("unfused", "sdpa"))
    parser.add_argument("--export-dir")
    args = parser.parse_args()

    init_model_parallel(tensor_parallel_size=args.tp, expert_parallel_size=args.ep)
    results = parity_results(args.model, args.attention or ("unfused", "sdpa"), args.export_dir)
    if dist.get_rank() == 0:
        with open(args.out, "w") as f:
            json.dump(results, f)
    destroy_model_parallel()


if __name__ == "__main__":
    main()
