"""Held-out greedy accuracy of a model on the task, per level, with the run's own pieces.

Starts the embedded CPU engine on ``--model`` (or uses ``--url``), renders each held-out prompt
with the model's chat template as the run does, generates greedily and scores the response
with the built-in ``math`` reward. Prints accuracy per level (the mean reward over
responses), pass@k (prompts with at least one correct response, with ``--n-samples k``), how many
responses have a ``\\boxed{}`` at all and how many hit the token limit.

    python examples/smollm2_math/baseline.py --model runs/smollm2_math/model \\
        --data runs/smollm2_math/data/heldout.jsonl --limit 64
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT))

from actors.engine.cpu.local import start_local_engine, stop_local_engine  # noqa: E402
from policies.rewards import last_boxed, math_reward  # noqa: E402
from slime_async.engine_client import EngineClient  # noqa: E402
from slime_async.generate_output import parse_generate_output  # noqa: E402


def spread_subset(rows: list[dict], limit: int | None) -> list[dict]:
    """The first rows of each level in turn, so a subset covers every level evenly."""
    if limit is None or limit >= len(rows):
        return rows
    by_level: dict[int, list[dict]] = defaultdict(list)
    for row in rows:
        by_level[row["metadata"]["level"]].append(row)
    picked: list[dict] = []
    while len(picked) < limit:
        for level in sorted(by_level):
            if by_level[level] and len(picked) < limit:
                picked.append(by_level[level].pop(0))
    return picked


async def evaluate(url: str, tokenizer, rows: list[dict], max_new_tokens: int, concurrency: int,
                   temperature: float = 0.0, n_samples: int = 1) -> list[dict]:
    params = {"temperature": temperature, "max_new_tokens": max_new_tokens}
    results: list[dict] = []
    semaphore = asyncio.Semaphore(concurrency)

    async def one(client: EngineClient, index: int, row: dict) -> None:
        text = tokenizer.apply_chat_template(row["prompt"], tokenize=False, add_generation_prompt=True)
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        async with semaphore:
            out = parse_generate_output(await client.generate(ids, params, return_logprob=False))
        response = tokenizer.decode(out.output_ids, skip_special_tokens=True)
        reward = await asyncio.to_thread(math_reward, response, row["label"])
        results.append({"level": row["metadata"]["level"], "label": row["label"], "reward": reward,
                        "prompt_index": index,
                        "boxed": last_boxed(response), "finish": out.finish_type, "tokens": len(out.output_ids),
                        "question": row["prompt"][-1]["content"], "response": response})

    async with EngineClient(url, timeout=1800) as client:
        await asyncio.gather(*(one(client, index, row) for index, row in enumerate(rows) for _ in range(n_samples)))
    return results


def report(results: list[dict]) -> None:
    by_level: dict[int, list[dict]] = defaultdict(list)
    for result in results:
        by_level[result["level"]].append(result)
    print(f"{'level':>5} {'n':>4} {'accuracy':>9} {'pass@k':>7} {'boxed':>6} {'cut off':>8} {'mean tokens':>12}")
    for level in sorted(by_level) + ["all"]:
        group = results if level == "all" else by_level[level]
        n = len(group)
        accuracy = sum(r["reward"] for r in group) / n
        solved: dict[int, float] = defaultdict(float)  # per prompt: did any sample score?
        for r in group:
            solved[r["prompt_index"]] = max(solved[r["prompt_index"]], r["reward"])
        pass_k = sum(solved.values()) / len(solved)
        boxed = sum(r["boxed"] is not None for r in group) / n
        cut = sum(r["finish"] == "length" for r in group) / n
        tokens = sum(r["tokens"] for r in group) / n
        print(f"{level:>5} {n:>4} {accuracy:>9.3f} {pass_k:>7.3f} {boxed:>6.2f} {cut:>8.2f} {tokens:>12.1f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, type=Path, help="HF model dir (tokenizer + chat template)")
    parser.add_argument("--data", required=True, type=Path, help="held-out .jsonl written by prepare.py")
    parser.add_argument("--url", help="an already-running engine serving --model; default: start a CPU engine")
    parser.add_argument("--limit", type=int, help="evaluate this many prompts, spread over the levels")
    parser.add_argument("--max-new-tokens", type=int, default=200)
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    parser.add_argument("--n-samples", type=int, default=1, help="samples per prompt (pass@k counts any correct)")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2, help="torch threads of the CPU engine")
    parser.add_argument("--dump", type=Path, help="write every response as JSON lines here")
    args = parser.parse_args(argv)

    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(args.model))
    rows = spread_subset([json.loads(line) for line in args.data.open() if line.strip()], args.limit)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="smollm2_baseline_") as tmp:
        engine, url = None, args.url
        if url is None:
            engine, url = start_local_engine(args.model, Path(tmp) / "engine.log", "--num-threads", str(args.threads),
                                             "--max-running-requests", str(args.concurrency))
        try:
            results = asyncio.run(evaluate(url, tokenizer, rows, args.max_new_tokens, args.concurrency,
                                           args.temperature, args.n_samples))
        finally:
            if engine is not None:
                stop_local_engine(engine)
    how = "greedy" if args.temperature == 0 else f"{args.n_samples} samples each at T={args.temperature:g}"
    print(f"{len(rows)} prompts of {args.data}, {how}, at most {args.max_new_tokens} new tokens, "
          f"{time.perf_counter() - started:.0f} s")
    report(results)
    if args.dump:
        with args.dump.open("w") as handle:
            for result in sorted(results, key=lambda r: r["level"]):
                handle.write(json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
