"""Print the multi-agent run's report from its metrics.jsonl: held-out reward (the revised answer)
before and after GRPO, and how often the first answer was right, the critic said no, the revision
changed the answer."""

import json
import sys

KEYS = ("first_correct", "critic_no", "changed", "final_correct")


def main(path: str) -> int:
    evals = [m for m in map(json.loads, open(path)) if m.get("eval/reward_mean") is not None]
    if len(evals) < 2:
        print(f"{path}: fewer than two evaluations logged", file=sys.stderr)
        return 1
    for label, row in (("after the SFT warm start", evals[0]), ("after GRPO", evals[-1])):
        parts = ", ".join(f"{k} {row.get('eval/' + k, float('nan')):.3f}" for k in KEYS)
        print(f"held-out reward at RL step {row['step']} ({label}): {row['eval/reward_mean']:.3f}   ({parts})")
    print(f"change: {evals[-1]['eval/reward_mean'] - evals[0]['eval/reward_mean']:+.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1]))
