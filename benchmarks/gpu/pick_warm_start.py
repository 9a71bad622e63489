"""Pick the warm start RL starts from: the first SFT snapshot whose held-out reward leaves room.

    python benchmarks/gpu/pick_warm_start.py --engine URL --low 0.1 --high 0.5 --run-dir DIR \
        --out DIR/picked.txt CANDIDATE [CANDIDATE ...] -- TRAIN-FLAGS...

The candidates are HF directories in training order (an SFT run's ``--save-hf DIR/step{step}``).
For each, the engine at URL (SGLang or the CPU engine) loads it (``/update_weights_from_disk``) and
a rollout-only run (``train --debug-rollout-only`` with TRAIN-FLAGS: the RL run's config and data)
measures its held-out greedy reward at step 0. Every ``--stride``-th candidate is measured until one
reaches ``--low``, then the one before it (``measure_order``). The reward jumps within a step or two
of SFT (on CPU: 0.10 after 5 steps of 16 traces, 0.91 after 6), so a candidate over ``--high`` gives
way to the measured one before it when that one already earns some reward (``choose``). Writes the
picked directory to ``--out`` and prints one line per candidate measured.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import urllib.request
from collections.abc import Callable
from pathlib import Path


def choose(measured: list[tuple[int, float]], low: float, high: float) -> int:
    """The warm start's candidate index, from ``(index, reward)`` pairs sorted by index (pure).

    The first measured at or above ``low``; when it is over ``high``, the measured one before it
    if that one already earns reward. With none at ``low``: the best, the later on a tie."""
    if not measured:
        raise ValueError("no candidate was measured")
    for k, (index, reward) in enumerate(measured):
        if reward >= low:
            if reward > high and k > 0 and measured[k - 1][1] > 0:
                return measured[k - 1][0]
            return index
    best = max(reward for _, reward in measured)
    return max(index for index, reward in measured if reward == best)


def measure_order(count: int, stride: int, low: float, reward_of: Callable[[int], float]) -> list[tuple[int, float]]:
    """``(index, reward)`` of the candidates measured, sorted: every ``stride``-th until one reaches
    ``low`` (the last one too when none does), then the one just before that one (an earlier
    candidate may be in the band too, or be the one an overshoot gives way to)."""
    measured: dict[int, float] = {}
    hit = None
    for index in [*range(0, count, stride), count - 1]:
        if index not in measured:
            measured[index] = reward_of(index)
            if measured[index] >= low:
                hit = index
                break
    if hit is not None and hit > 0 and hit - 1 not in measured:
        measured[hit - 1] = reward_of(hit - 1)
    return sorted(measured.items())


def load_weights(engine: str, model_dir: Path) -> None:
    body = json.dumps({"model_path": str(model_dir.resolve())}).encode()
    request = urllib.request.Request(f"{engine}/update_weights_from_disk", data=body,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=600) as response:
        answer = json.loads(response.read() or b"{}")
    if answer.get("success") is False:
        raise RuntimeError(f"{engine} did not load {model_dir}: {answer.get('message')}")


def held_out_reward(engine: str, model_dir: Path, run_dir: Path, train_flags: list[str]) -> float:
    """The step-0 held-out reward of a rollout-only run against the engine, now serving model_dir."""
    command = [sys.executable, "-m", "actors.loop.cli", "train", *train_flags, "--hf-checkpoint", str(model_dir),
               "--rollout-external-engine-addrs", engine, "--debug-rollout-only", "--num-rollout", "1",
               "--rollout-batch-size", "1", "--n-samples-per-prompt", "2", "--run-dir", str(run_dir),
               "--no-progress-bar"]
    log = run_dir.with_suffix(".log")
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as out:
        code = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT).returncode
    if code != 0:
        raise RuntimeError(f"the rollout-only run for {model_dir} exited {code}; see {log}")
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        if row.get("step") == 0 and row.get("eval/reward_mean") is not None:
            return float(row["eval/reward_mean"])
    raise RuntimeError(f"no step-0 eval/reward_mean in {run_dir / 'metrics.jsonl'}")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    split = argv.index("--") if "--" in argv else len(argv)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("candidates", type=Path, nargs="+")
    parser.add_argument("--engine", required=True, help="the engine's URL (SGLang or the CPU engine)")
    parser.add_argument("--low", type=float, default=0.10)
    parser.add_argument("--high", type=float, default=0.50)
    parser.add_argument("--stride", type=int, default=2, help="measure every N-th candidate first")
    parser.add_argument("--run-dir", type=Path, required=True, help="one rollout-only run dir per candidate here")
    parser.add_argument("--out", type=Path, required=True, help="the picked directory is written here")
    args = parser.parse_args(argv[:split])
    if not args.low <= args.high:
        parser.error(f"--low {args.low} must be <= --high {args.high}")
    if args.stride < 1:
        parser.error(f"--stride must be >= 1, got {args.stride}")
    def reward_of(index: int) -> float:
        candidate = args.candidates[index]
        load_weights(args.engine, candidate)
        reward = held_out_reward(args.engine, candidate, args.run_dir / candidate.name, argv[split + 1:])
        print(f"warm start candidate {candidate.name}: held-out greedy reward {reward:.3f}", flush=True)
        return reward

    measured = measure_order(len(args.candidates), args.stride, args.low, reward_of)
    picked = args.candidates[choose(measured, args.low, args.high)]
    args.out.write_text(str(picked.resolve()))
    print(f"picked {picked.name} (band {args.low:.2f}-{args.high:.2f})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
