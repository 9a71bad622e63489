"""A run's learning curve from its metrics.jsonl: a table per step, and optionally a PNG.

    python benchmarks/gpu/learning_curve.py RUN/metrics.jsonl [MORE.jsonl ...] [--last N] [--png curve.png]
    python benchmarks/gpu/learning_curve.py --resumed PART1/metrics.jsonl PART2/metrics.jsonl ...

The table has one row per evaluation and per training step (wall time since the run's first
logged metric); the plot shows held-out accuracy (eval reward) and the rollout reward against
wall time, one colour per run. The first evaluation is the untrained model's (step 0).
``--resumed``: the files are the parts of ONE run, each resumed (``--load``) from the previous
one's last checkpoint, in order; ``stitch`` puts them on one clock (see there).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

COLUMNS = [("rollout/reward_mean", "reward"), ("rollout/response_len_mean", "resp len"),
           ("train/logprob_abs_diff", "|Δlogp|"), ("perf/step_time", "step s"),
           ("perf/weight_sync_time", "sync s"), ("rollout/staleness_mean", "staleness")]


def read_rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def is_train_row(row: dict[str, Any]) -> bool:
    return "perf/step_time" in row


def stitch(parts: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """One run's rows from the metrics of its parts, each resumed from the previous part's last
    checkpoint, on the first part's clock with the time between the parts left out.

    A part that resumes at step s (its first training row is step s + 1) replaces every row of
    the parts before it past step s (steps trained after the last checkpoint were lost with the
    call that ran them) and its clock continues from the earlier part's training row of step s
    (the checkpoint was written right after it): the time a part spent starting up before its
    first row is not counted, as for the first part. Its evaluation of step s is dropped when an
    earlier part evaluated that step (the same weights).
    """
    out: list[dict[str, Any]] = []
    for rows in parts:
        if not rows:
            continue
        trained = [row["step"] for row in rows if is_train_row(row)]
        resumed_at = min(trained) - 1 if trained else min(row["step"] for row in rows)
        begin = min(row["time"] for row in rows)
        if not out:
            out = sorted(rows, key=lambda row: row["time"])
            continue
        out = [row for row in out if row["step"] <= resumed_at]
        cuts = [row["time"] for row in out if row["step"] == resumed_at and is_train_row(row)]
        cut = max(cuts) if cuts else max(row["time"] for row in out)
        evaluated = {row["step"] for row in out if eval_key(row) is not None}
        out += [{**row, "time": cut + row["time"] - begin} for row in sorted(rows, key=lambda row: row["time"])
                if not (row["step"] == resumed_at and row["step"] in evaluated and eval_key(row) is not None)]
    return sorted(out, key=lambda row: row["time"])


def eval_key(row: dict[str, Any]) -> str | None:
    """The held-out accuracy's key: eval/reward_mean, or eval/<set>/reward_mean with several sets."""
    keys = sorted(k for k in row if k.startswith("eval/") and k.endswith("reward_mean") and row[k] is not None)
    return keys[0] if keys else None


def evaluations(rows: list[dict[str, Any]], start: float) -> list[tuple[int, float, float]]:
    """(step, seconds since start, accuracy) of every evaluation."""
    out = []
    for row in rows:
        key = eval_key(row)
        if key is not None:
            out.append((row["step"], row["time"] - start, row[key]))
    return out


def table(rows: list[dict[str, Any]], last: int | None, extra: tuple[str, ...] = ()) -> str:
    start = rows[0]["time"]
    columns = COLUMNS + [(key, key.rpartition("/")[2]) for key in extra]
    lines = ["| step | wall s | held-out acc | " + " | ".join(name for _, name in columns) + " |",
             "|---:|---:|---:|" + "---:|" * len(columns)]
    merged: dict[int, dict[str, Any]] = {}
    for row in rows:  # a step's metrics may arrive in several log calls
        merged.setdefault(row["step"], {"time": row["time"]}).update(
            {k: v for k, v in row.items() if k not in ("step", "time")})
    body = []
    for step, row in sorted(merged.items()):
        key = eval_key(row)
        acc = f"{row[key]:.3f}" if key else ""
        cells = [_fmt(row.get(k)) for k, _ in columns]
        body.append(f"| {step} | {row['time'] - start:.0f} | {acc} | " + " | ".join(cells) + " |")
    lines += body[-last:] if last else body
    evals = evaluations(rows, start)
    if len(evals) >= 2:
        (s0, t0, a0), (s1, t1, a1) = evals[0], evals[-1]
        lines.append(f"\nheld-out accuracy: {a0:.3f} at step {s0} -> {a1:.3f} at step {s1} "
                     f"({(a1 - a0) * 100:+.1f} points, {t1 - t0:.0f} s between the two evaluations; "
                     f"best {max(a for _, _, a in evals):.3f})")
    return "\n".join(lines)


def plot(runs: list[tuple[str, list[dict[str, Any]]]], png: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=120)
    for (label, rows), colour in zip(runs, ("tab:blue", "tab:orange", "tab:green", "tab:red")):
        start = rows[0]["time"]
        evals = evaluations(rows, start)
        rollout = [(r["time"] - start, r["rollout/reward_mean"]) for r in rows
                   if r.get("rollout/reward_mean") is not None]
        if rollout:
            ax.plot([t / 60 for t, _ in rollout], [v for _, v in rollout], color=colour, alpha=0.35,
                    linewidth=1, label=f"{label}: rollout reward (per step)")
        if evals:
            ax.plot([t / 60 for _, t, _ in evals], [a for _, _, a in evals], marker="o", color=colour,
                    linewidth=2, label=f"{label}: held-out accuracy (greedy)")
    ax.set_xlabel("wall time since the run started (min)")
    ax.set_ylabel("accuracy / reward")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", fontsize=8)
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(png)


def _fmt(value: Any) -> str:
    return "" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.4g}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("metrics", type=Path, nargs="+", help="one metrics.jsonl per run")
    parser.add_argument("--last", type=int, default=None, help="only the last N rows of each table")
    parser.add_argument("--png", type=Path, default=None, help="also plot every run here (needs matplotlib)")
    parser.add_argument("--title", default="SmolLM2-135M-Instruct, fully-async GRPO + TIS")
    parser.add_argument("--columns", nargs="+", default=(), metavar="KEY",
                        help="more metrics to tabulate, e.g. rollout/tool_calls rollout/turns")
    parser.add_argument("--resumed", action="store_true",
                        help="the files are the parts of one run, each resumed from the one before (one table)")
    args = parser.parse_args(argv)
    runs = []
    parts = []
    for path in args.metrics:
        if not path.is_file():
            print(f"error: {path}: no such file", file=sys.stderr)
            return 2
        rows = read_rows(path)
        if not rows:
            print(f"error: {path}: no metrics logged yet", file=sys.stderr)
            return 1
        parts.append((path, rows))
    if args.resumed:
        parts = [(args.metrics[0], stitch([rows for _, rows in parts]))]
    for path, rows in parts:
        if len(parts) > 1:
            print(f"\n## {path}")
        print(table(rows, args.last, tuple(args.columns)))
        runs.append((f"run {len(runs) + 1}" if len(parts) > 1 else path.stem, rows))
    if args.png:
        plot(runs, args.png, args.title)
        print(f"wrote {args.png}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
