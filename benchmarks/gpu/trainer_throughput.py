"""Megatron trainer speed on one GPU: train-step and logprob tokens/s and MFU, with SDPA attention,
for the old path (right-padded micro-batches, full logits) and the new one (packed micro-batches
in one varlen attention call, chunked logprob head): ``--variants``; and packed attention per
sequence vs in one varlen call.

    python benchmarks/gpu/trainer_throughput.py --shape qwen2.5-0.5b --seq-lens 1024 2048 4096
    torchrun --nproc-per-node 2 benchmarks/gpu/trainer_throughput.py --shape qwen2.5-1.5b --tp 2
    python benchmarks/gpu/trainer_throughput.py --shape qwen2.5-0.5b --seq-lens 2048 --long-tail 0.1
    python benchmarks/gpu/trainer_throughput.py --shape tiny --seq-lens 64 --tokens-per-step 256 \
        --long-tail 0.25 --short-len 16 --sdpa --attention-tokens 1024  # CPU check

Runs one trainer rank in this process (`TrainerOps`, the object the torchrun worker serves over
RPC, so no RPC time is counted: benchmarks/trainer_overhead.py measures that separately) on a
random-init model with the real architecture's shape (benchmarks/gpu/qwen_shapes.py), in bf16
with Megatron's mixed-precision Adam. Every step trains ``--tokens-per-step`` tokens in
micro-batches of ``--max-tokens-per-gpu``; half of each sequence is response (scored) tokens.

MFU = achieved FLOP/s per GPU / peak, with FLOPs per token = 6 N (N = matmul parameters incl. the LM
head) + 6 L s d (causal attention, forward + backward); logprob passes are forward only (a third).
Peaks: 989 TFLOP/s (H200/H100 SXM dense bf16, datasheet) and the 8192^3 bf16 matmul rate
measured in the same run. Each variant is a fresh TrainerOps on the same weights; the largest
logprob difference between two variants is printed (a GPU parity check, after the same steps). The attention
table times one layer's core attention (forward + backward) over packed sequences of mixed
lengths, ``--attention-impl loop`` vs ``varlen``, at the shape's heads.
"""

from __future__ import annotations

import argparse
import gc
import os
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

from benchmarks.gpu.qwen_shapes import qwen25_config, train_flops_per_token, write_random_model  # noqa: E402

DATASHEET_PEAK = 989e12


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def measured_matmul_peak() -> float:
    if not torch.cuda.is_available():
        return float("nan")  # a CPU smoke run: the MFU columns are meaningless there
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(10):
        a @ b
    torch.cuda.synchronize()
    return 10 * 2 * 8192**3 / (time.perf_counter() - start)


def init_single_rank_env() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    for key, value in dict(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                           MASTER_PORT=str(port)).items():
        os.environ.setdefault(key, value)


def timed(fn, warmup: int, steps: int) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(steps):
        sync()
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def attention_table(config_hf, tokens: int, steps: int) -> None:
    """Packed core attention, loop vs one varlen call, forward + backward, mixed lengths."""
    from megatron.core.packed_seq_params import PackedSeqParams
    from megatron.core.transformer.enums import AttnMaskType
    from megatron.core.transformer.transformer_config import TransformerConfig

    from actors.megatron.attention import SDPAttention
    from actors.megatron.varlen import describe_attention

    heads, groups = config_hf.num_attention_heads, config_hf.num_key_value_heads
    head_dim = config_hf.hidden_size // heads
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if torch.cuda.is_available() else torch.float32
    # A long-tail pack: one long sequence and many short ones, ``tokens`` in all.
    g = torch.Generator().manual_seed(0)
    lengths, left = [], tokens
    while left > 0:
        n = min(left, int(torch.randint(16, 256, (1,), generator=g)) if lengths else tokens // 4)
        lengths.append(n)
        left -= n
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device=device)
    params = PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=max(lengths),
                             max_seqlen_kv=max(lengths))
    tc = TransformerConfig(num_layers=1, hidden_size=config_hf.hidden_size, num_attention_heads=heads,
                           num_query_groups=groups, kv_channels=head_dim, attention_dropout=0.0)
    q = torch.randn(tokens, heads, head_dim, device=device, dtype=dtype, requires_grad=True)
    k, v = (torch.randn(tokens, groups, head_dim, device=device, dtype=dtype, requires_grad=True) for _ in range(2))
    print(f"packed attention: {len(lengths)} sequences, {tokens} tokens (longest {max(lengths)}), "
          f"{heads} heads / {groups} groups of {head_dim}, {str(dtype).removeprefix('torch.')}")
    outputs = {}
    for impl in ("loop", "varlen"):
        attention = SDPAttention(config=tc, layer_number=1, attn_mask_type=AttnMaskType.causal,
                                 attention_type="self", attention_impl=impl)

        def step():
            out = attention(q, k, v, attention_mask=None, packed_seq_params=params)
            out.float().square().mean().backward()
            return out

        seconds = timed(step, 2, steps)
        outputs[impl] = attention(q, k, v, attention_mask=None, packed_seq_params=params).detach().float()
        print(f"  {impl:>6} ({describe_attention(impl, dtype)}): {seconds * 1e3:.2f} ms fwd+bwd, "
              f"{tokens / seconds:.0f} tokens/s")
    print(f"  max |varlen - loop| = {(outputs['varlen'] - outputs['loop']).abs().max().item():.2e}")


def step_batch(args, seq: int, vocab: int):
    """``--tokens-per-step`` tokens of samples of length ``seq``, or with ``--long-tail`` a mix of
    ``seq`` and ``--short-len`` samples (half of each is response), as in the RL long-tail workload."""
    from benchmarks.trainer_overhead import make_batch
    from slime_async.batch import Batch

    if not args.long_tail:
        return make_batch(max(1, args.tokens_per_step // seq), seq, vocab)
    lengths, total = [], 0
    while total < args.tokens_per_step:
        n = seq if len(lengths) % round(1 / args.long_tail) == 0 else args.short_len
        lengths.append(n)
        total += n
    g = torch.Generator().manual_seed(0)
    return Batch(
        tokens=[torch.randint(0, vocab, (n,), generator=g).tolist() for n in lengths],
        response_lengths=[n // 2 for n in lengths],
        loss_masks=[[1] * (n // 2) for n in lengths],
        advantages=[[1.0 if i % 2 else -1.0] * (n // 2) for i, n in enumerate(lengths)],
        temperature=1.0,
    )


def profile_step(ops, batch, spec) -> None:
    """torch.profiler's top 25 ops of one train step (where the time goes: the MFU gap)."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    normalizer = batch.normalizer(spec.loss_agg)
    with profile(activities=activities) as prof:
        ops.train_step(batch, spec, normalizer)
        sync()
    key = "self_cuda_time_total" if torch.cuda.is_available() else "self_cpu_time_total"
    print(prof.key_averages().table(sort_by=key, row_limit=25), flush=True)


def throughput_table(ops, args, config_hf, spec, peak: float) -> dict[int, list[list[float]]]:
    """Rows of the table for one TrainerOps; returns each seq len's logprobs (the parity check)."""
    logprobs = {}
    header = (f"| {'seq len':>7} | {'train tok/s':>11} | {'MFU':>6} | {'MFU meas.':>9} | {'logprob tok/s':>13} "
              f"| {'MFU':>6} | {'peak mem GiB':>12} |")
    print(header)
    print("|" + "|".join("-" * (len(c)) for c in header.split("|")[1:-1]) + "|")
    for seq in args.seq_lens:
        batch = step_batch(args, seq, config_hf.vocab_size)
        tokens = sum(batch.lengths)
        normalizer = batch.normalizer(spec.loss_agg)
        if torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()
        train_s = timed(lambda: ops.train_step(batch, spec, normalizer), args.warmup, args.steps)
        logprob_s = timed(lambda: ops.compute_logprobs(batch), 1, args.steps)
        rows = ops.compute_logprobs(batch)
        logprobs[seq] = [r.logprobs for r in rows] if rows else []
        # FLOPs per GPU: a TP group shares one batch. Attention FLOPs follow each sample's length.
        flops = sum(train_flops_per_token(config_hf, n) * n for n in batch.lengths) / int(os.environ["WORLD_SIZE"])
        train_tps, logprob_tps = tokens / train_s, tokens / logprob_s
        mem = torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else float("nan")
        print(f"| {seq:>7} | {train_tps:>11.0f} | {flops / train_s / DATASHEET_PEAK:>6.1%} "
              f"| {flops / train_s / peak:>9.1%} | {logprob_tps:>13.0f} "
              f"| {flops / 3 / logprob_s / DATASHEET_PEAK:>6.1%} | {mem:>12.1f} |", flush=True)
    return logprobs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="qwen2.5-0.5b")
    parser.add_argument("--model-dir", help="an HF dir of that shape (default: write a random one)")
    parser.add_argument("--seq-lens", type=int, nargs="+", default=[1024, 2048, 4096])
    parser.add_argument("--tokens-per-step", type=int, default=32768)
    parser.add_argument("--max-tokens-per-gpu", type=int, default=8192)
    parser.add_argument("--tp", type=int, default=1, help="tensor parallel size (run under torchrun with as many ranks)")
    parser.add_argument("--variants", nargs="+", default=["full/loop", "chunked/varlen"],
                        help="HEAD/ATTENTION pairs (--logprob-impl / --attention-impl): full/loop is the old path "
                        "(right-padded micro-batches, full logits), chunked/varlen the new one (packed, chunked head)")
    parser.add_argument("--long-tail", type=float, default=0.0,
                        help="fraction of samples at the full seq len, the rest at --short-len (0: all full length)")
    parser.add_argument("--short-len", type=int, default=128)
    parser.add_argument("--sdpa", action="store_true", help="SDPA attention on CPU too (GPU uses it anyway), so "
                        "a CPU check packs the micro-batches")
    parser.add_argument("--log-probs-chunk-size", type=int, default=-1)
    parser.add_argument("--attention-tokens", type=int, default=8192,
                        help="tokens of the packed-attention table (0: skip it)")
    parser.add_argument("--profile", action="store_true",
                        help="after each variant's table, print torch.profiler's top ops of one train step")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()
    init_single_rank_env()

    from actors.megatron.config import TrainerConfig
    from actors.trainer.ops import TrainerOps
    from policies.algorithm import AlgorithmConfig

    config_hf = qwen25_config(args.shape)
    if int(os.environ["RANK"]) != 0:  # other ranks only take part in the collectives
        sys.stdout = open(os.devnull, "w")
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = Path(args.model_dir) if args.model_dir else write_random_model(Path(tmp) / "model", args.shape)
        peak = measured_matmul_peak()
        print(f"bf16 matmul peak measured here: {peak / 1e12:.0f} TFLOP/s; datasheet {DATASHEET_PEAK / 1e12:.0f}")
        spec = AlgorithmConfig()
        logprobs = {}
        for variant in args.variants:
            head, attention_impl = variant.split("/")
            config = TrainerConfig(hf_checkpoint=str(model_dir), max_tokens_per_gpu=args.max_tokens_per_gpu,
                                   logprob_impl=head, attention_impl=attention_impl,
                                   log_probs_chunk_size=args.log_probs_chunk_size, use_sdpa=True if args.sdpa else None,
                                   megatron={"lr": 1e-6, "clip_grad": 1.0,
                                             "tensor_model_parallel_size": args.tp}).validate()
            ops = TrainerOps(config)
            params = sum(p.numel() for p in ops.ddp.parameters())
            precision = "bf16" if ops.model_config.bf16 else str(ops.model_config.params_dtype).removeprefix("torch.")
            attention = "SDPA" if config.use_sdpa or (config.use_sdpa is None and torch.cuda.is_available()) else "unfused"
            print(f"\n{args.shape}: {params / 1e9:.3f} B parameters on this rank, {precision}, {attention} attention, "
                  f"{args.tokens_per_step} tokens per step in micro-batches of <= {args.max_tokens_per_gpu}; "
                  f"variant {variant}: {ops.kernels.describe(ops.model_config.params_dtype, attention == 'SDPA')}")
            logprobs[variant] = throughput_table(ops, args, config_hf, spec, peak)
            if args.profile:
                profile_step(ops, step_batch(args, args.seq_lens[0], config_hf.vocab_size), spec)
            del ops
            gc.collect()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        if len(logprobs) == 2 and int(os.environ["RANK"]) == 0:
            # Each table trained its own copy from the same weights, so compare the first seq len's
            # logprobs, taken after the same number of identical steps: a path mismatch shows here.
            seq = args.seq_lens[0]
            a, b = (torch.tensor([x for row in logprobs[v][seq] for x in row]) for v in args.variants)
            print(f"\nlogprobs at seq len {seq}, {' vs '.join(args.variants)}: max |diff| = "
                  f"{(a - b).abs().max().item():.3e}, mean |diff| = {(a - b).abs().mean().item():.3e}")
        if args.attention_tokens:
            print()
            attention_table(config_hf, args.attention_tokens, args.steps)


if __name__ == "__main__":
    main()
