"""Print the multi-agent run's report from its metrics.jsonl: held-out reward (the revised answer)
before and after GRPO, how often the first answer was right, the critic said no, the revision
changed the answer; turns per sample (no tool is called: the critic is the policy itself) and the
router's prefix-cache hit rate, the columns every agent example reports."""

import json
import sys

KEYS = ("first_correct", "critic_no", "changed", "final_correct")


def fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def main(path: str) -> int:
    rows = [json.loads(line) for line in open(path)]
    evals = [m for m in rows if m.get("eval/reward_mean") is not None]
    if len(evals) < 2:
        print(f"{path}: fewer than two evaluations logged", file=sys.stderr)
        return 1
    for label, row in (("after the SFT warm start", evals[0]), ("after GRPO", evals[-1])):
        parts = ", ".join(f"{k} {row.get('eval/' + k, float('nan')):.3f}" for k in KEYS)
        print(f"held-out reward at RL step {row['step']} ({label}): {row['eval/reward_mean']:.3f}   ({parts})")
    print(f"change: {evals[-1]['eval/reward_mean'] - evals[0]['eval/reward_mean']:+.3f}")
    print(f"held-out tool calls per sample: none (no tool); turns per sample: {fmt(evals[0].get('eval/turns'))} -> "
          f"{fmt(evals[-1].get('eval/turns'))}")
    rewards = [m["rollout/reward_mean"] for m in rows if m.get("rollout/reward_mean") is not None]
    if rewards:
        print(f"training rollouts' reward: {rewards[0]:.3f} at the first step, {rewards[-1]:.3f} at the last")
    hits = [m["router/prefix_cache_hit_rate"] for m in rows if m.get("router/prefix_cache_hit_rate") is not None]
    print(f"router prefix-cache hit rate (cached / prompt tokens, whole run): {fmt(hits[-1] if hits else None)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1]))
