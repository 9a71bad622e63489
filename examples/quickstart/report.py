"""Print the held-out reward before and after RL from a run's metrics.jsonl."""

import json
import os
import sys


def main(path: str) -> int:
    evals = [m for m in map(json.loads, open(path)) if m.get("eval/reward_mean") is not None]
    if len(evals) < 2:
        print(f"{path}: fewer than two evaluations logged", file=sys.stderr)
        return 1
    first, last = evals[0], evals[-1]
    print(f"held-out reward at RL step {first['step']} (after the SFT warm start): {first['eval/reward_mean']:.3f}")
    print(f"held-out reward at RL step {last['step']} (after GRPO):                  {last['eval/reward_mean']:.3f}")
    print(f"change: {last['eval/reward_mean'] - first['eval/reward_mean']:+.3f}  (TensorBoard: {os.path.join(os.path.dirname(path), 'tb')})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1]))
