"""Steps and minutes to 90% of the teacher's held-out accuracy: on-policy distillation against GRPO alone.

    python benchmarks/gpu/opd_table.py --teacher T1/metrics.jsonl [T2/metrics.jsonl ...] \\
        --run "GRPO + OPD" O1/metrics.jsonl [O2/metrics.jsonl ...] [--run LABEL FILE ...] \\
        [--fraction 0.9] [--png curve.png]

``--teacher``: the teacher's own training run (GRPO from the student), whose parts are given in
order when it was resumed across calls; it is also the "GRPO alone" row, since it starts from the
same student. The teacher's held-out accuracy is that run's last evaluation (the weights it
exported). Each ``--run``: another run from the same student, its parts in order. A run's clock is
``learning_curve.stitch``'s: seconds since its first logged metric, the time between resumed parts
left out; an evaluation counts at the time it was logged (it finishes after the step it evaluates).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.gpu.learning_curve import evaluations, plot, read_rows, stitch  # noqa: E402

TEACHER_LABEL = "GRPO alone (the teacher's run)"

Curve = list[tuple[int, float, float]]  # (step, seconds since the run started, held-out accuracy)


def curve(rows: list[dict[str, Any]]) -> Curve:
    return evaluations(rows, rows[0]["time"]) if rows else []


def teacher_accuracy(teacher: Curve) -> tuple[int, float]:
    """(step, accuracy) of the teacher run's last evaluation: the weights it ended with."""
    step, _, accuracy = max(teacher, key=lambda point: (point[0], point[1]))
    return step, accuracy


def first_reaching(points: Curve, threshold: float) -> tuple[int, float] | None:
    """(step, seconds) of the first evaluation at or above ``threshold``, by step."""
    for step, seconds, accuracy in sorted(points):
        if accuracy >= threshold - 1e-9:
            return step, seconds
    return None


def report(runs: list[tuple[str, Curve]], fraction: float) -> str:
    """The evaluations side by side, then each run's steps and minutes to the threshold.
    ``runs[0]`` is the teacher's run."""
    teacher_step, teacher_acc = teacher_accuracy(runs[0][1])
    threshold = fraction * teacher_acc
    lines = [f"teacher: held-out {teacher_acc:.3f} at step {teacher_step} (its run's last evaluation); "
             f"{fraction:.0%} of it: {threshold:.3f}", "",
             "| step | " + " | ".join(label for label, _ in runs) + " |",
             "|---:|" + "---:|" * len(runs)]
    by_step = [{step: (seconds, acc) for step, seconds, acc in points} for _, points in runs]
    for step in sorted(set().union(*by_step)):
        cells = [f"{at[step][1]:.3f} ({at[step][0] / 60:.1f} min)" if step in at else "" for at in by_step]
        lines.append(f"| {step} | " + " | ".join(cells) + " |")
    lines += ["", f"| run | steps to ≥ {threshold:.3f} | minutes to ≥ {threshold:.3f} | last held-out |",
              "|---|---:|---:|---:|"]
    for label, points in runs:
        if not points:
            lines.append(f"| {label} | no evaluation yet | | |")
            continue
        last_step, last_seconds, last_acc = max(points, key=lambda point: (point[0], point[1]))
        reached = first_reaching(points, threshold)
        last = f"{last_acc:.3f} at step {last_step} ({last_seconds / 60:.1f} min)"
        if reached is None:
            lines.append(f"| {label} | not within {last_step} steps | not within {last_seconds / 60:.1f} min | {last} |")
        else:
            lines.append(f"| {label} | {reached[0]} | {reached[1] / 60:.1f} | {last} |")
    return "\n".join(lines)


def load(paths: list[Path]) -> list[dict[str, Any]]:
    """One run's rows from its parts; raises ValueError naming a file that is missing."""
    parts = []
    for path in paths:
        if not path.is_file():
            raise ValueError(f"{path}: no such file")
        parts.append(read_rows(path))
    return stitch(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--teacher", type=Path, nargs="+", required=True, metavar="METRICS",
                        help="the teacher's training run (GRPO alone): its metrics.jsonl, one per resumed part")
    parser.add_argument("--run", nargs="+", action="append", default=[], metavar="LABEL_THEN_METRICS",
                        help="a label, then the run's metrics.jsonl files (one per resumed part); repeatable")
    parser.add_argument("--fraction", type=float, default=0.9, help="of the teacher's held-out accuracy (0.9)")
    parser.add_argument("--png", type=Path, default=None, help="also plot every run here (needs matplotlib)")
    parser.add_argument("--title", default="SmolLM2-135M-Instruct: on-policy distillation vs GRPO alone")
    args = parser.parse_args(argv)
    if not 0 < args.fraction <= 1:
        parser.error(f"--fraction must be in (0, 1], got {args.fraction}")
    if any(len(run) < 2 for run in args.run):
        parser.error("--run needs a label and at least one metrics.jsonl")
    try:
        rows = [(TEACHER_LABEL, load(args.teacher))] + [(run[0], load([Path(p) for p in run[1:]])) for run in args.run]
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    curves = [(label, curve(r)) for label, r in rows]
    if not curves[0][1]:
        print("error: --teacher: the teacher's run has no held-out evaluation yet", file=sys.stderr)
        return 1
    print(report(curves, args.fraction))
    if args.png:
        plot([(label, r) for label, r in rows if r], args.png, args.title)
        print(f"wrote {args.png}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
