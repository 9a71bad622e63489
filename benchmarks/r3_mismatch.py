"""Rollout routing replay (R3) on CPU: how often a bf16 engine and an fp32 trainer route a token to
different experts, and the train-inference |Δlogprob| with and without replay (issue #27 item 4).

    PYTHONPATH=. .venv/bin/python benchmarks/r3_mismatch.py [--samples 16 --new-tokens 24 --out benchmarks/results/r3_mismatch_cpu.md]

The "engine" is the CPU engine's model runner (actors/engine/cpu/model_runner.py: transformers) in
bf16: it samples the responses, then scores each whole sequence in one prefill, recording the experts
every Qwen3-MoE router chose per token (what an engine returns with ``return_routed_experts``) and
the logprob of every response token. The trainer is the real torchrun group (one fp32 rank, driven
over RPC): it recomputes the logprobs routing by itself, then replaying the engine's experts, and
takes one training step with them (its routing metrics).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from actors.megatron.config import TrainerConfig  # noqa: E402
from actors.trainer.actor import TrainerActor  # noqa: E402
from policies.algorithm import AlgorithmConfig  # noqa: E402
from slime_async.actor import spawn  # noqa: E402
from slime_async.batch import Batch  # noqa: E402

TEMPERATURE = 1.0


def write_moe_model(out: Path, *, hidden: int, layers: int, experts: int, topk: int, seed: int = 0) -> Path:
    """A random Qwen3-MoE checkpoint (every layer sparse, renormalised top-k) with a word-level tokenizer."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast, Qwen3MoeConfig

    config = Qwen3MoeConfig(vocab_size=256, hidden_size=hidden, intermediate_size=hidden * 2,
                            moe_intermediate_size=hidden // 2, num_hidden_layers=layers, num_attention_heads=4,
                            num_key_value_heads=2, head_dim=hidden // 4, num_experts=experts,
                            num_experts_per_tok=topk, norm_topk_prob=True, max_position_embeddings=512,
                            tie_word_embeddings=False, bos_token_id=1, eos_token_id=1, pad_token_id=0,
                            initializer_range=0.05)
    torch.manual_seed(seed)
    AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(out)
    vocab = {"<unk>": 0, "<eos>": 1, **{f"w{i}": i for i in range(2, 256)}}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", eos_token="<eos>").save_pretrained(out)
    return out


@torch.inference_mode()
def engine_view(runner, tokens: list[list[int]], response_lengths: list[int],
                temperature: float) -> tuple[list[np.ndarray], list[list[float]]]:
    """Per sample, the experts each Qwen3-MoE router of ``runner.model`` chose per token position
    (``[len - 1, MoE layers, topk]``, the R3 layout) and the logprobs of its response tokens, from one
    prefill of the whole sequence."""
    chosen: list[torch.Tensor] = []
    routers = [m for m in runner.model.modules() if type(m).__name__ == "Qwen3MoeTopKRouter"]
    hooks = [r.register_forward_hook(lambda _m, _i, out: chosen.append(out[2])) for r in routers]
    experts, logprobs = [], []
    try:
        for seq, n in zip(tokens, response_lengths):
            chosen.clear()
            logits, _ = runner.prefill(seq, None, all_positions=True)  # [len, vocab], in layer order
            experts.append(torch.stack(chosen, dim=1)[: len(seq) - 1].numpy().astype(np.int32))
            start = len(seq) - n
            logprobs.append(runner.token_logprobs(logits[start - 1: len(seq) - 1], seq[start:], temperature))
    finally:
        for hook in hooks:
            hook.remove()
    return experts, logprobs


@torch.inference_mode()
def sample_responses(runner, prompts: list[list[int]], new_tokens: int, seed: int) -> list[list[int]]:
    """Prompt + ``new_tokens`` sampled tokens per prompt (full prefill per step: the model is tiny)."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for prompt in prompts:
        seq = list(prompt)
        for _ in range(new_tokens):
            logits, _ = runner.prefill(seq, None)
            seq.append(int(torch.multinomial(torch.softmax(logits / TEMPERATURE, -1), 1, generator=gen)))
        out.append(seq)
    return out


def _abs_diff(a: list[list[float]], b: list[list[float]]) -> tuple[float, float]:
    diffs = np.abs(np.concatenate([np.asarray(x) - np.asarray(y) for x, y in zip(a, b)]))
    return float(diffs.mean()), float(diffs.max())


async def _trainer_side(model_dir: Path, batch: Batch, experts: list[np.ndarray], logs: Path) -> dict:
    config = TrainerConfig(hf_checkpoint=str(model_dir), actor_num_procs=1, max_tokens_per_gpu=512,
                           use_rollout_routing_replay=True, trainer_start_timeout=300.0,
                           megatron={"lr": 1e-4, "clip_grad": 1.0}).validate()
    replayed = Batch(**{**batch.__dict__, "routed_experts": experts})
    ref = await spawn(TrainerActor(config, logs))
    try:
        plain = await ref.ask("compute_logprobs", batch, model="actor", timeout=None)
        r3 = await ref.ask("compute_logprobs", replayed, model="actor", timeout=None)
        # The R3 step first: its routing metrics are of the weights the logprobs above came from.
        step_r3 = await ref.ask("train_step", replayed, AlgorithmConfig(), timeout=None)
        step_plain = await ref.ask("train_step", batch, AlgorithmConfig(), timeout=None)
    finally:
        await ref.stop()
    return {"plain": [r.logprobs for r in plain], "r3": [r.logprobs for r in r3], "step_plain": step_plain,
            "step_r3": step_r3}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=16)
    parser.add_argument("--prompt-tokens", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=24)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--experts", type=int, default=16)
    parser.add_argument("--topk", type=int, default=4)
    parser.add_argument("--out", type=Path, default=None, help="write the table (markdown) here too")
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from actors.engine.cpu.model_runner import ModelRunner

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = write_moe_model(Path(tmp) / "model", hidden=args.hidden, layers=args.layers,
                                    experts=args.experts, topk=args.topk)
        engine = ModelRunner(model_dir, dtype=torch.bfloat16)
        gen = torch.Generator().manual_seed(1)
        prompts = [torch.randint(2, 256, (args.prompt_tokens,), generator=gen).tolist() for _ in range(args.samples)]
        tokens = sample_responses(engine, prompts, args.new_tokens, seed=2)
        lengths = [args.new_tokens] * args.samples
        experts, engine_logprobs = engine_view(engine, tokens, lengths, TEMPERATURE)
        batch = Batch(tokens=tokens, response_lengths=lengths, loss_masks=[[1] * n for n in lengths],
                      advantages=[[1.0 if i % 2 else -1.0] * n for i, n in enumerate(lengths)],
                      rollout_logprobs=engine_logprobs, temperature=TEMPERATURE,
                      sample_ids=[(i, 0) for i in range(args.samples)])
        trainer = asyncio.run(_trainer_side(model_dir, batch, experts, Path(tmp) / "logs"))

    plain_mean, plain_max = _abs_diff(trainer["plain"], engine_logprobs)
    r3_mean, r3_max = _abs_diff(trainer["r3"], engine_logprobs)
    step = trainer["step_r3"]
    lines = [
        f"# R3 on CPU: bf16 engine (CPU engine's model runner) vs fp32 trainer (1 torchrun rank)",
        "",
        f"Random Qwen3-MoE: hidden {args.hidden}, {args.layers} MoE layers, {args.experts} experts, top-{args.topk}; "
        f"{args.samples} samples of {args.prompt_tokens} prompt + {args.new_tokens} sampled tokens (T={TEMPERATURE}).",
        f"Command: `PYTHONPATH=. python benchmarks/r3_mismatch.py --samples {args.samples} --new-tokens "
        f"{args.new_tokens}`",
        "",
        "| trainer routing | routing mismatch (token x layer) | mean abs dlogprob | max abs dlogprob |",
        "|---|---|---|---|",
        f"| own top-k | {step['moe/routing_mismatch']:.4f} | {plain_mean:.2e} | {plain_max:.2e} |",
        f"| R3 (engine's experts) | 0 (replayed) | {r3_mean:.2e} | {r3_max:.2e} |",
        "",
        "Routing mismatch: the fraction of (token, MoE layer) pairs whose fp32 trainer top-k set differs from "
        "the bf16 engine's (`train/moe/routing_mismatch` of the R3 training step, all sequence positions). "
        "dlogprob: trainer recompute minus engine logprob over every response token.",
        "",
        "Training step metrics (R3 step / own-routing step): "
        + ", ".join(f"`{k}` {step[k]:.4g} / {trainer['step_plain'][k]:.4g}"
                    for k in sorted(step) if k.startswith("moe/") and "layer" not in k and k in trainer["step_plain"]),
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)


if __name__ == "__main__":
    main()
