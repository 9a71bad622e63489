"""Print the search run's report from its metrics.jsonl: held-out reward before and after GRPO (and
at every evaluation), searches and turns per sample, how often the searches retrieved the passage
holding the answer, the router's prefix-cache hit rate."""

import json
import sys


def main(path: str) -> int:
    rows = [json.loads(line) for line in open(path)]
    evals = [m for m in rows if m.get("eval/reward_mean") is not None]
    if len(evals) < 2:
        print(f"{path}: fewer than two evaluations logged", file=sys.stderr)
        return 1
    first, last = evals[0], evals[-1]
    for row, when in ((first, "(after the SFT warm start)"), (last, "(after GRPO)")):
        print(f"held-out reward at RL step {row['step']} {when}: {row['eval/reward_mean']:.3f}"
              f"   searches/sample {row.get('eval/searches', float('nan')):.2f}, turns/sample {row.get('eval/turns', float('nan')):.2f},"
              f" answer's passage retrieved {row.get('eval/evidence', float('nan')):.3f}")
    print("held-out reward by step: " + ", ".join(f"{m['step']}: {m['eval/reward_mean']:.3f}" for m in evals))
    print(f"change: {last['eval/reward_mean'] - first['eval/reward_mean']:+.3f}")
    train = [m for m in rows if m.get("rollout/searches") is not None]
    if train:
        print(f"training rollouts, last step: searches/sample {train[-1]['rollout/searches']:.2f}, "
              f"turns/sample {train[-1]['rollout/turns']:.2f}, reward {train[-1].get('rollout/reward_mean', float('nan')):.3f}"
              f" (with the evidence credit), answer's passage retrieved {train[-1].get('rollout/evidence', float('nan')):.3f}")
    hits = [m["router/prefix_cache_hit_rate"] for m in rows if m.get("router/prefix_cache_hit_rate") is not None]
    if hits:
        print(f"router prefix-cache hit rate (cumulative, prompt tokens served from cache): {hits[-1]:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1]))
