"""Overhead of driving the trainer over torch RPC: supervisor wall time vs the worker's own.

    .venv/bin/python benchmarks/trainer_overhead.py [--procs 1 --tp 1 --steps 5 ...]

Each train step is timed twice: by the worker itself around its ``train_step`` op
(``step_time_s``, no RPC) and by the supervisor around ``await trainer.ask("train_step")``
(DP split, pickling, RPC both ways, the actor mailbox, asyncio wake-up). The difference is
what the supervisor's RPC path adds. Goal: <= 5 % for a step of realistic size.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from actors.megatron.config import TrainerConfig  # noqa: E402
from actors.trainer.actor import TrainerActor  # noqa: E402
from policies.algorithm import AlgorithmConfig  # noqa: E402
from slime_async.actor import spawn  # noqa: E402
from slime_async.batch import Batch  # noqa: E402


def write_model(out: Path, hidden: int, layers: int, vocab: int) -> Path:
    from transformers import AutoModelForCausalLM, Qwen2Config

    config = Qwen2Config(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=hidden * 3, num_hidden_layers=layers,
        num_attention_heads=max(hidden // 64, 2), num_key_value_heads=max(hidden // 128, 1),
        max_position_embeddings=4096, tie_word_embeddings=False, dtype="float32",
    )
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(out)
    return out


def make_batch(samples: int, seq_len: int, vocab: int) -> Batch:
    g = torch.Generator().manual_seed(0)
    tokens = [torch.randint(0, vocab, (seq_len,), generator=g).tolist() for _ in range(samples)]
    response = seq_len // 2
    return Batch(
        tokens=tokens,
        response_lengths=[response] * samples,
        loss_masks=[[1] * response for _ in range(samples)],
        advantages=[[1.0 if i % 2 else -1.0] * response for i in range(samples)],
        temperature=1.0,
    )


async def run(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        hf = write_model(Path(tmp) / "model", args.hidden, args.layers, args.vocab)
        config = TrainerConfig(
            hf_checkpoint=str(hf),
            actor_num_procs=args.procs,
            max_tokens_per_gpu=args.max_tokens,
            megatron={"tensor_model_parallel_size": args.tp, "lr": 1e-5},
        )
        trainer = await spawn(TrainerActor(config, Path(args.log_dir or Path(tmp) / "logs")))
        try:
            batch = make_batch(args.samples, args.seq_len, args.vocab)
            spec = AlgorithmConfig()
            await trainer.ask("train_step", batch, spec, timeout=None)  # warm-up
            worker_s, rpc_s = [], []
            for _ in range(args.steps):
                start = time.perf_counter()
                metrics = await trainer.ask("train_step", batch, spec, timeout=None)
                rpc_s.append(time.perf_counter() - start)
                worker_s.append(metrics["step_time_s"])
        finally:
            await trainer.stop()
    worker, through_rpc = statistics.median(worker_s), statistics.median(rpc_s)
    overhead = 100.0 * (through_rpc - worker) / worker
    print(f"model: hidden {args.hidden}, {args.layers} layers; batch {args.samples} x {args.seq_len} tokens; "
          f"{args.procs} ranks, TP={args.tp}; median of {args.steps} steps")
    print(f"| {'path':<34} | {'step (ms)':>10} |")
    print(f"|{'-' * 36}|{'-' * 12}|")
    print(f"| {'inside the worker (no RPC)':<34} | {worker * 1e3:>10.1f} |")
    print(f"| {'supervisor await over RPC':<34} | {through_rpc * 1e3:>10.1f} |")
    print(f"| {'overhead':<34} | {overhead:>9.2f}% |")
    print(f"overhead per step: {(through_rpc - worker) * 1e3:.2f} ms (goal <= 5 %: {'met' if overhead <= 5 else 'NOT met'})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--procs", type=int, default=1)
    parser.add_argument("--tp", type=int, default=1)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=4096)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--max-tokens", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--log-dir", default=None, help="keep the trainer's log here (default: a temp dir)")
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
