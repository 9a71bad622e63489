"""Engine throughput through EngineClient: does batching of concurrent requests pay off?

CPU mode (default): builds a tiny model, starts the embedded CPU engine as a subprocess and
measures generated tokens/s with 1, 8 and 32 requests in flight. The goal is that 32
concurrent requests reach at least 4x the tokens/s of one at a time.

    .venv/bin/python benchmarks/engine_throughput.py
    .venv/bin/python benchmarks/engine_throughput.py --concurrency 1 4 16 --max-new-tokens 32
    .venv/bin/python benchmarks/engine_throughput.py --model runs/smollm2_math/model --threads 2   # a real model

GPU host: `--url URL --compare-native` sends the same prompts once as concurrent single
requests through our client and once as SGLang's own batch `/generate` (one request with a
list of input_ids), and prints the client's overhead in %. Without --url it compares against
a CPU engine started here.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from actors.engine.cpu.local import LocalEngineError, start_local_engine, stop_local_engine  # noqa: E402
from slime_async.engine_client import EngineClient  # noqa: E402
from slime_async.generate_output import parse_generate_output  # noqa: E402


@dataclass
class Row:
    label: str
    requests: int
    tokens: int
    seconds: float
    latencies: list[float]

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds


def model_vocab_size(model_dir: Path) -> int:
    """The vocabulary of an HF model dir, from its config.json."""
    return int(json.loads((model_dir / "config.json").read_text())["vocab_size"])


def make_prompts(count: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    # Skip the low ids where tokenizers keep their special tokens (the tiny one's and SmolLM2's).
    return [[rng.randrange(16, vocab) for _ in range(length)] for _ in range(count)]


async def run_concurrent(client: EngineClient, prompts: list[list[int]], params: dict, concurrency: int, label: str) -> Row:
    """Send every prompt as its own request, with at most `concurrency` in flight."""
    queue = list(reversed(prompts))
    latencies: list[float] = []
    tokens = 0

    async def worker() -> None:
        nonlocal tokens
        while queue:
            prompt = queue.pop()
            started = time.perf_counter()
            out = parse_generate_output(await client.generate(prompt, params))
            latencies.append(time.perf_counter() - started)
            tokens += len(out.output_ids)

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return Row(label, len(prompts), tokens, time.perf_counter() - started, latencies)


async def run_native_batch(client: EngineClient, prompts: list[list[int]], params: dict) -> Row:
    started = time.perf_counter()
    outs = [parse_generate_output(d) for d in await client.generate_batch(prompts, params)]
    seconds = time.perf_counter() - started
    return Row("native batch /generate", len(prompts), sum(len(o.output_ids) for o in outs), seconds, [seconds])


def print_table(rows: list[Row]) -> None:
    header = f"{'mode':<28} {'requests':>8} {'tokens':>8} {'seconds':>8} {'tokens/s':>10} {'p50 lat s':>10}"
    print(header)
    print("-" * len(header))
    for row in rows:
        p50 = statistics.median(row.latencies)
        print(f"{row.label:<28} {row.requests:>8} {row.tokens:>8} {row.seconds:>8.2f} {row.tokens_per_s:>10.1f} {p50:>10.3f}")


async def wait_healthy(client: EngineClient) -> None:
    for _ in range(600):
        if await client.health_generate():
            return
        await asyncio.sleep(0.2)
    raise SystemExit(f"engine {client.url} never answered /health_generate")


# ---- modes


async def scaling(client: EngineClient, args: argparse.Namespace, vocab: int) -> None:
    params = {"temperature": 1.0, "max_new_tokens": args.max_new_tokens, "ignore_eos": True}
    await client.generate(make_prompts(1, args.prompt_len, vocab, 0)[0], params)  # warm-up
    rows = []
    for concurrency in args.concurrency:
        count = max(args.min_requests, args.requests_per_slot * concurrency)
        prompts = make_prompts(count, args.prompt_len, vocab, seed=concurrency)
        rows.append(await run_concurrent(client, prompts, params, concurrency, f"{concurrency} concurrent"))
    print_table(rows)
    low, high = rows[0], rows[-1]
    ratio = high.tokens_per_s / low.tokens_per_s
    print(f"\n{high.label} / {low.label}: {ratio:.2f}x tokens/s (goal: >= 4x for 32 vs 1)")


async def compare_native(client: EngineClient, args: argparse.Namespace, vocab: int) -> None:
    params = {"temperature": 1.0, "max_new_tokens": args.max_new_tokens, "ignore_eos": True}
    prompts = make_prompts(args.compare_requests, args.prompt_len, vocab, seed=7)
    await client.generate(prompts[0], params)  # warm-up
    rows = []
    for _ in range(args.repeats):
        rows.append(await run_native_batch(client, prompts, params))
        rows.append(await run_concurrent(client, prompts, params, len(prompts), "client, concurrent singles"))
    print_table(rows)
    native = statistics.median(r.seconds for r in rows if r.label.startswith("native"))
    ours = statistics.median(r.seconds for r in rows if r.label.startswith("client"))
    print(f"\nclient overhead vs native batch (median of {args.repeats}): {100 * (ours - native) / native:+.1f}%")


async def main_async(args: argparse.Namespace) -> None:
    engine = None
    vocab = args.vocab_size
    with tempfile.TemporaryDirectory(prefix="engine_throughput_") as tmp:
        url = args.url
        if url is None:
            from examples.models.tiny import build_tiny_model

            model_dir = Path(args.model_path) if args.model_path else build_tiny_model(Path(tmp) / "model")
            if vocab is None and args.model_path:
                vocab = model_vocab_size(model_dir)
            try:
                engine, url = start_local_engine(model_dir, Path(tmp) / "engine.log", "--max-running-requests",
                                                 str(args.max_running_requests), "--num-threads", str(args.threads))
            except LocalEngineError as exc:
                raise SystemExit(str(exc)) from exc
        try:
            async with EngineClient(url, api_key=args.api_key, timeout=600) as client:
                await wait_healthy(client)
                if vocab is None:
                    vocab = 32000 if args.url else 512
                model = f"model {args.model_path}" if args.model_path else ("" if args.url else "tiny model")
                print(f"engine {url} {model} ({args.threads} torch threads); prompt {args.prompt_len} tokens "
                      f"(ids < {vocab}), {args.max_new_tokens} new tokens per request\n")
                if args.compare_native:
                    await compare_native(client, args, vocab)
                else:
                    await scaling(client, args, vocab)
        finally:
            if engine is not None:
                stop_local_engine(engine)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", help="an already-running engine (SGLang or CPU); default: start a CPU engine")
    parser.add_argument("--api-key")
    parser.add_argument("--model-path", "--model", dest="model_path",
                        help="HF dir for the CPU engine (prompt ids are then drawn below its vocab_size); "
                        "default: a tiny model built here")
    parser.add_argument("--compare-native", action="store_true",
                        help="client concurrent singles vs one native batch /generate")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--requests-per-slot", type=int, default=2, help="requests per concurrency slot")
    parser.add_argument("--min-requests", type=int, default=8)
    parser.add_argument("--compare-requests", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--prompt-len", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--vocab-size", type=int,
                        help="prompt ids are drawn below this; "
                        "default: --model's vocab_size, 512 (tiny) or 32000 (--url)")
    parser.add_argument("--max-running-requests", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1, help="torch threads of the CPU engine")
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
