"""Train-inference mismatch: SGLang's sampled-token logprobs vs the Megatron trainer's recompute.

    python benchmarks/gpu/logprob_mismatch.py --url http://127.0.0.1:30000 --model-dir DIR

For the same weights (the HF dir the SGLang server loaded) and the same sampled tokens: sample
``--prompts`` responses at ``--temperature`` through our EngineClient with logprobs, then
recompute every response token's logprob with `TrainerOps.compute_logprobs` (bf16, SDPA; the
object the torchrun worker serves) on this process's GPU, and report mean / max |Δ| and the
fraction of tokens with |Δ| > 0.1, plus the mean entropy of the sampled distribution (a
near-uniform model would make any mismatch look small). Also reports the sequence-level
ratio exp(Σ Δ) spread, which is what TIS / MIS corrections see, and each side's mean distance
from an fp32 transformers recompute on the same GPU (which side carries the error).
"""

from __future__ import annotations

import argparse
import asyncio
import math
import random
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

from benchmarks.gpu.trainer_throughput import init_single_rank_env, sync  # noqa: E402
from slime_async.batch import Batch  # noqa: E402
from slime_async.engine_client import EngineClient  # noqa: E402
from slime_async.generate_output import parse_generate_output  # noqa: E402


def fp32_logprobs(model, batch: Batch) -> list[list[float]]:
    """log softmax(logits / T) at every response token, with an fp32 transformers model (one sample at a time)."""
    rows = []
    device = next(model.parameters()).device
    for tokens, rlen in zip(batch.tokens, batch.response_lengths):
        with torch.no_grad():
            logits = model(torch.tensor([tokens], device=device)).logits[0, -rlen - 1:-1].float()
        logprobs = torch.log_softmax(logits / batch.temperature, dim=-1)
        picked = logprobs.gather(1, torch.tensor(tokens[-rlen:], device=device)[:, None]).squeeze(1)
        rows.append(picked.tolist())
    return rows


async def sample(url: str, prompts: list[list[int]], params: dict) -> list:
    async with EngineClient(url, timeout=600) as client:
        outs = await asyncio.gather(*(client.generate(p, params) for p in prompts))
    return [parse_generate_output(o) for o in outs]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", required=True)
    parser.add_argument("--model-dir", required=True)
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--max-new-tokens", type=int, default=512)
    parser.add_argument("--temperatures", type=float, nargs="+", default=[1.0, 0.7])
    parser.add_argument("--vocab-size", type=int, default=151936)
    args = parser.parse_args()
    init_single_rank_env()

    from actors.megatron.config import TrainerConfig
    from actors.trainer.ops import TrainerOps

    ops = TrainerOps(TrainerConfig(hf_checkpoint=args.model_dir, max_tokens_per_gpu=16384).validate())
    rng = random.Random(0)
    prompts = [[rng.randrange(0, args.vocab_size) for _ in range(args.prompt_len)] for _ in range(args.prompts)]
    from transformers import AutoModelForCausalLM

    reference = AutoModelForCausalLM.from_pretrained(args.model_dir, dtype=torch.float32).to(ops.device).eval()
    print("Δ = trainer (Megatron, bf16) - SGLang (bf16) logprob of each sampled token")
    print(f"| {'T':>4} | {'tokens':>7} | {'entropy':>7} | {'mean |Δ|':>9} | {'max |Δ|':>8} | {'|Δ|>0.1':>8} "
          f"| {'seq ratio p5..p95':>17} | {'SGLang vs fp32':>14} | {'trainer vs fp32':>15} |")
    print(f"|{'-' * 6}|{'-' * 9}|{'-' * 9}|{'-' * 11}|{'-' * 10}|{'-' * 10}|{'-' * 19}|{'-' * 16}|{'-' * 17}|")
    for temperature in args.temperatures:
        params = {"temperature": temperature, "top_p": 1.0, "top_k": -1, "max_new_tokens": args.max_new_tokens,
                  "ignore_eos": True}
        outs = asyncio.run(sample(args.url, prompts, params))
        batch = Batch(
            tokens=[p + o.output_ids for p, o in zip(prompts, outs)],
            response_lengths=[len(o.output_ids) for o in outs],
            loss_masks=[[1] * len(o.output_ids) for o in outs],
            temperature=temperature,
        )
        recomputed = ops.compute_logprobs(batch)
        exact = fp32_logprobs(reference, batch)
        deltas, seq_log_ratio, entropies, engine_err, trainer_err = [], [], [], [], []
        for out, row, ref in zip(outs, recomputed, exact):
            d = [a - b for a, b in zip(row.logprobs, out.logprobs)]
            deltas.extend(abs(x) for x in d)
            seq_log_ratio.append(sum(d))
            entropies.extend(row.entropy)
            engine_err.extend(abs(a - b) for a, b in zip(out.logprobs, ref))
            trainer_err.extend(abs(a - b) for a, b in zip(row.logprobs, ref))
        ratios = sorted(math.exp(min(x, 50.0)) for x in seq_log_ratio)
        p5, p95 = ratios[int(0.05 * len(ratios))], ratios[int(0.95 * (len(ratios) - 1))]
        frac = sum(1 for x in deltas if x > 0.1) / len(deltas)
        print(f"| {temperature:>4} | {len(deltas):>7} | {statistics.mean(entropies):>7.2f} | "
              f"{statistics.mean(deltas):>9.4f} | {max(deltas):>8.3f} | {frac:>8.2%} | {p5:>7.3f}..{p95:<8.3f} "
              f"| {statistics.mean(engine_err):>14.4f} | {statistics.mean(trainer_err):>15.4f} |",
              flush=True)
    sync()


if __name__ == "__main__":
    main()
