"""Print an agent run's learning report from its metrics.jsonl: held-out reward before and after
RL, tool calls and turns per sample, and the router's prefix-cache hit rate.

    python report.py RUN_DIR/metrics.jsonl [--tool-metric tool_calls]
"""

from __future__ import annotations

import argparse
import json
import sys


def last(rows: list[dict], key: str) -> float | None:
    values = [row[key] for row in rows if row.get(key) is not None]
    return values[-1] if values else None


def mean(rows: list[dict], key: str) -> float | None:
    values = [row[key] for row in rows if row.get(key) is not None]
    return sum(values) / len(values) if values else None


def fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("metrics", help="a run's metrics.jsonl")
    parser.add_argument("--tool-metric", default="tool_calls", help="the hook's per-sample tool-call metric")
    args = parser.parse_args(argv)
    rows = [json.loads(line) for line in open(args.metrics)]
    evals = [row for row in rows if row.get("eval/reward_mean") is not None]
    if len(evals) < 2:
        print(f"{args.metrics}: fewer than two evaluations logged", file=sys.stderr)
        return 1
    first, final = evals[0], evals[-1]
    tool = args.tool_metric
    print(f"held-out reward at RL step {first['step']} (after the SFT warm start): {first['eval/reward_mean']:.3f}")
    print(f"held-out reward at RL step {final['step']} (after GRPO):                  {final['eval/reward_mean']:.3f}")
    print(f"change: {final['eval/reward_mean'] - first['eval/reward_mean']:+.3f}")
    print(f"held-out {tool} per sample: {fmt(first.get('eval/' + tool))} -> {fmt(final.get('eval/' + tool))}; "
          f"turns per sample: {fmt(first.get('eval/turns'))} -> {fmt(final.get('eval/turns'))}")
    print(f"training rollouts: {fmt(mean(rows, 'rollout/' + tool))} {tool} and {fmt(mean(rows, 'rollout/turns'))} "
          f"turns per sample (mean over steps); reward {fmt(mean(rows, 'rollout/reward_mean'))}")
    print(f"router prefix-cache hit rate (cached / prompt tokens, whole run): "
          f"{fmt(last(rows, 'router/prefix_cache_hit_rate'))}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
