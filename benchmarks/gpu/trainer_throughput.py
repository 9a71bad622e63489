"""Megatron trainer speed on one GPU: train-step and logprob tokens/s and MFU, with SDPA attention.

    python benchmarks/gpu/trainer_throughput.py --shape qwen2.5-0.5b --seq-lens 1024 2048 4096
    torchrun --nproc-per-node 2 benchmarks/gpu/trainer_throughput.py --shape qwen2.5-1.5b --tp 2

Runs one trainer rank in this process (`TrainerOps`, the object the torchrun worker serves over
RPC, so no RPC time is counted: benchmarks/trainer_overhead.py measures that separately) on a
random-init model with the real architecture's shape (benchmarks/gpu/qwen_shapes.py), in bf16
with Megatron's mixed-precision Adam. Every step trains ``--tokens-per-step`` tokens in
micro-batches of ``--max-tokens-per-gpu``; half of each sequence is response (scored) tokens.

MFU = achieved FLOP/s per GPU / peak, with FLOPs per token = 6 N (N = matmul parameters incl. the LM
head) + 6 L s d (causal attention, forward + backward); logprob passes are forward only (a third).
Peaks: 989 TFLOP/s (H200/H100 SXM dense bf16, datasheet) and the 8192^3 bf16 matmul rate
measured in the same run.
"""

from __future__ import annotations

import argparse
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
from benchmarks.trainer_overhead import make_batch  # noqa: E402

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="qwen2.5-0.5b")
    parser.add_argument("--model-dir", help="an HF dir of that shape (default: write a random one)")
    parser.add_argument("--seq-lens", type=int, nargs="+", default=[1024, 2048, 4096])
    parser.add_argument("--tokens-per-step", type=int, default=32768)
    parser.add_argument("--max-tokens-per-gpu", type=int, default=8192)
    parser.add_argument("--tp", type=int, default=1, help="tensor parallel size (run under torchrun with as many ranks)")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()
    init_single_rank_env()

    from actors.trainer.config import TrainerConfig
    from actors.trainer.ops import TrainerOps
    from policies.loss_spec import LossSpec

    config_hf = qwen25_config(args.shape)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = Path(args.model_dir) if args.model_dir else write_random_model(Path(tmp) / "model", args.shape)
        config = TrainerConfig(hf_checkpoint=str(model_dir), max_tokens_per_gpu=args.max_tokens_per_gpu,
                               megatron={"lr": 1e-6, "clip_grad": 1.0, "tensor_model_parallel_size": args.tp}).validate()
        ops = TrainerOps(config)
        if int(os.environ["RANK"]) != 0:  # other ranks only take part in the collectives
            sys.stdout = open(os.devnull, "w")
        peak = measured_matmul_peak()
        params = sum(p.numel() for p in ops.ddp.parameters())
        precision = "bf16" if ops.model_config.bf16 else str(ops.model_config.params_dtype).removeprefix("torch.")
        attention = "SDPA" if config.use_sdpa or (config.use_sdpa is None and torch.cuda.is_available()) else "unfused"
        print(f"{args.shape}: {params / 1e9:.3f} B parameters on this rank, {precision}, {attention} attention, "
              f"{args.tokens_per_step} tokens per step in micro-batches of <= {args.max_tokens_per_gpu}")
        print(f"bf16 matmul peak measured here: {peak / 1e12:.0f} TFLOP/s; datasheet {DATASHEET_PEAK / 1e12:.0f}")
        header = (f"| {'seq len':>7} | {'train tok/s':>11} | {'MFU':>6} | {'MFU meas.':>9} | {'logprob tok/s':>13} "
                  f"| {'MFU':>6} | {'peak mem GiB':>12} |")
        print(header)
        print("|" + "|".join("-" * (len(c)) for c in header.split("|")[1:-1]) + "|")
        spec = LossSpec()
        for seq in args.seq_lens:
            samples = max(1, args.tokens_per_step // seq)
            batch = make_batch(samples, seq, config_hf.vocab_size)
            tokens = samples * seq
            normalizer = batch.normalizer(spec.loss_agg)
            if torch.cuda.is_available():
                torch.cuda.reset_peak_memory_stats()
            train_s = timed(lambda: ops.train_step(batch, spec, normalizer), args.warmup, args.steps)
            logprob_s = timed(lambda: ops.compute_logprobs(batch), 1, args.steps)
            # FLOPs per GPU: a TP group shares one batch.
            flops = train_flops_per_token(config_hf, seq) * tokens / int(os.environ["WORLD_SIZE"])
            train_tps, logprob_tps = tokens / train_s, tokens / logprob_s
            mem = torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else float("nan")
            print(f"| {seq:>7} | {train_tps:>11.0f} | {flops / train_s / DATASHEET_PEAK:>6.1%} "
                  f"| {flops / train_s / peak:>9.1%} | {logprob_tps:>13.0f} "
                  f"| {flops / 3 / logprob_s / DATASHEET_PEAK:>6.1%} | {mem:>12.1f} |", flush=True)


if __name__ == "__main__":
    main()
