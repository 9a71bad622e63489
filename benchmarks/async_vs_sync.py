"""sync vs one-step-off vs fully-async on the same task, seed and number of trained samples.

Runs `slime-async train` three times (CPU engine + Megatron CPU trainer) with a long-tailed
response length (benchmarks/longtail_generate.py) and prints, per mode: wall-clock of the
training loop, engine busy fraction (time with a generation in flight / loop time), trainer
busy fraction (time in train_step / loop time), final held-out reward, and the speed-up over
sync. Usage: python benchmarks/async_vs_sync.py [--steps 12] [--model DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MODES = ("sync", "one-step-off", "fully-async")


def prepare(work: Path, model: str | None) -> tuple[str, Path]:
    data = work / "data"
    subprocess.run([sys.executable, str(REPO / "examples/quickstart/make_task.py"), "--out", str(data), "--heldout", "64"],
                   check=True, capture_output=True)
    if model is None:
        model = str(work / "model")
        subprocess.run([sys.executable, "-m", "examples.models.tiny", "--out", model, "--seed", "0"],
                       check=True, capture_output=True, cwd=REPO)
    return model, data


def run_mode(mode: str, model: str, data: Path, work: Path, steps: int) -> dict[str, float]:
    run_dir = work / mode
    argv = [sys.executable, "-m", "actors.loop.cli", "train", "--hf-checkpoint", model,
            "--prompt-data", str(data / "train.jsonl"), "--eval-prompt-data", str(data / "heldout.jsonl"),
            "--run-dir", str(run_dir), "--train-mode", mode, "--num-rollout", str(steps),
            "--rollout-batch-size", "8", "--n-samples-per-prompt", "4", "--rollout-max-response-len", "6",
            "--custom-generate-function-path", "benchmarks.longtail_generate:generate", "--rm-type", "exact",
            "--engine-type", "cpu", "--micro-batch-size", "32", "--lr", "3e-4", "--use-tis",
            "--rollout-seed", "7", "--seed", "7", "--no-progress-bar",
            # One core each, so generation and training can overlap on a 2-core machine.
            "--trainer-num-threads", "1", "--cpu-engine-threads", "1"]
    if mode == "fully-async":
        argv += ["--max-staleness", "2"]
    subprocess.run(argv, check=True, capture_output=True, cwd=REPO,
                   env={**os.environ, "PYTHONPATH": str(REPO)})
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps_logged = [m for m in metrics if "perf/step_time" in m]
    evals = [m for m in metrics if m.get("eval/reward_mean") is not None]
    wall = steps_logged[-1]["time"] - steps_logged[0]["time"] + steps_logged[0]["perf/step_time"]
    return {
        "wall_s": wall,
        "engine_busy": sum(m.get("perf/engine_busy_time", 0.0) for m in steps_logged) / wall,
        "trainer_busy": sum(m.get("perf/train_time", 0.0) for m in steps_logged) / wall,
        "samples": float(len(steps_logged) * 8 * 4),
        "reward": evals[-1]["eval/reward_mean"] if evals else float("nan"),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--model", default=None, help="HF dir to start from (default: a fresh tiny model)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        model, data = prepare(work, args.model)
        results = {mode: run_mode(mode, model, data, work, args.steps) for mode in MODES}
    base = results["sync"]["wall_s"]
    print(f"{'mode':<14}{'wall s':>9}{'engine busy':>13}{'trainer busy':>14}{'samples':>9}{'eval reward':>13}{'speed-up':>10}")
    for mode, r in results.items():
        print(f"{mode:<14}{r['wall_s']:>9.1f}{r['engine_busy']:>13.2f}{r['trainer_busy']:>14.2f}"
              f"{r['samples']:>9.0f}{r['reward']:>13.3f}{base / r['wall_s']:>9.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
