"""Print a run's held-out accuracy at its first and last evaluation, and its training rewards."""

import json
import sys


def main(path: str) -> int:
    metrics = [json.loads(line) for line in open(path) if line.strip()]
    evals = [m for m in metrics if m.get("eval/reward_mean") is not None]
    rollouts = [m for m in metrics if m.get("rollout/reward_mean") is not None]
    if len(evals) < 2:
        print(f"{path}: fewer than two evaluations logged", file=sys.stderr)
        return 1
    first, last = evals[0], evals[-1]
    print(f"held-out accuracy at step {first['step']}: {first['eval/reward_mean']:.3f}")
    print(f"held-out accuracy at step {last['step']}: {last['eval/reward_mean']:.3f}")
    print(f"change: {last['eval/reward_mean'] - first['eval/reward_mean']:+.3f}")
    if rollouts:
        rewards = " ".join(f"{m['rollout/reward_mean']:.2f}" for m in rollouts)
        print(f"rollout reward per step: {rewards}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1]))
