"""On-policy distillation against GRPO alone, on the CPU quick start's task (issue #28).

The teacher is the quick start's trained policy (its GRPO run from the SFT warm start, exported
to HF); the student is that SFT warm start. From the same student, ``--steps`` steps each of
- ``grpo``: the quick start's grpo.toml (fully-async GRPO + TIS, reward exact);
- ``grpo+opd``: the same plus the teacher's reverse KL (--use-opd --opd-type sglang, an owned
  CPU teacher engine, --opd-kl-coef 1);
- ``opd``: pure distillation: training reward 0 (the teacher is the only signal), held-out
  samples still scored with exact (``heldout_only_exact`` below: evaluation samples carry a
  negative group index).
Held-out reward (greedy, the quick start's held-out set) every ``--eval-interval`` steps, with the
wall time since the run started. Usage (repository root):

    python benchmarks/opd_vs_grpo.py --out runs/opd_vs_grpo [--steps 60] [--eval-interval 10]

Writes ``OUT/summary.json`` and prints a table; runs already finished in OUT are not repeated.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from policies.rewards import exact_match_reward

REPO = Path(__file__).resolve().parent.parent
QUICKSTART = REPO / "examples/quickstart"
VARIANTS = {
    "grpo": [],
    "grpo+opd": ["--use-opd", "--opd-type", "sglang", "--opd-kl-coef", "1.0"],
    "opd": ["--use-opd", "--opd-type", "sglang", "--opd-kl-coef", "1.0",
            "--custom-rm-path", "benchmarks.opd_vs_grpo:heldout_only_exact"],
}


def heldout_only_exact(ctx: Any, sample: Any) -> float:
    """0 for every training sample (pure distillation); exact match on evaluation samples."""
    if sample.group_index is not None and sample.group_index < 0:
        return exact_match_reward(sample.response, sample.label)
    return 0.0


def train(argv: list[str], log: Path) -> float:
    """One `slime-async train` from the repository root; its wall time."""
    started = time.monotonic()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    with log.open("w") as out:
        result = subprocess.run([sys.executable, "-m", "actors.loop.cli", "train", "--no-progress-bar", *argv],
                                cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
    if result.returncode != 0:
        raise SystemExit(f"train failed ({result.returncode}): see {log}")
    return time.monotonic() - started


def prepare(out: Path) -> tuple[Path, Path]:
    """The quick start's base model, data and SFT warm start (runs/quickstart), then its GRPO run
    exported to HF as the teacher: (student, teacher)."""
    quick = REPO / "runs/quickstart"
    if not (quick / "sft-hf" / "config.json").is_file():
        subprocess.run([sys.executable, "-m", "examples.models.tiny", "--out", str(quick / "base"), "--arch", "qwen2",
                        "--seed", "0"], cwd=REPO, check=True)
        subprocess.run([sys.executable, str(QUICKSTART / "make_task.py"), "--out", str(quick / "data")], cwd=REPO,
                       check=True)
        train(["--config", str(QUICKSTART / "sft.toml")], out / "sft.log")
    teacher = out / "teacher-hf"
    if not (teacher / "config.json").is_file():
        seconds = train(["--config", str(QUICKSTART / "grpo.toml"), "--run-dir", str(out / "teacher"),
                         "--save", str(out / "teacher" / "checkpoints"), "--save-hf", str(teacher)],
                        out / "teacher.log")
        print(f"teacher: the quick start's GRPO run in {seconds:.0f} s", flush=True)
    return quick / "sft-hf", teacher


def student_run(name: str, student: Path, teacher: Path, out: Path, steps: int, eval_interval: int) -> float:
    argv = ["--config", str(QUICKSTART / "grpo.toml"), "--hf-checkpoint", str(student), "--run-dir",
            str(out / name), "--num-rollout", str(steps), "--eval-interval", str(eval_interval), *VARIANTS[name]]
    if "--use-opd" in argv:
        argv += ["--opd-teacher-hf-checkpoint", str(teacher)]
    return train(argv, out / f"{name}.log")


def curve(run_dir: Path) -> list[dict[str, float]]:
    """(step, seconds since the run's first row, held-out reward) of every evaluation."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    start = min(row["time"] for row in rows)
    return [{"step": row["step"], "seconds": round(row["time"] - start, 1), "heldout": row["eval/reward_mean"]}
            for row in rows if row.get("eval/reward_mean") is not None]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/opd_vs_grpo")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--eval-interval", type=int, default=10)
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    args = parser.parse_args()
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    student, teacher = prepare(out)
    summary_path = out / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.is_file() else {}
    teacher_curve = curve(out / "teacher") if (out / "teacher" / "metrics.jsonl").is_file() else []
    summary["teacher_heldout"] = teacher_curve[-1]["heldout"] if teacher_curve else None
    for name in args.variants:
        if name not in summary:
            seconds = student_run(name, student, teacher, out, args.steps, args.eval_interval)
            summary[name] = {"wall_seconds": round(seconds, 1), "curve": curve(out / name)}
            summary_path.write_text(json.dumps(summary, indent=1))
        points = summary[name]["curve"]
        print(f"{name:9s} {summary[name]['wall_seconds']:7.0f} s  held-out: "
              + "  ".join(f"{p['step']}:{p['heldout']:.3f}@{p['seconds']:.0f}s" for p in points), flush=True)
    print(f"teacher held-out: {summary['teacher_heldout']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
