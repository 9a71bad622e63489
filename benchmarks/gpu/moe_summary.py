"""benchmarks/gpu/moe.sh's two halves: the GPU memory sampler and the side-by-side table.

    python benchmarks/gpu/moe_summary.py sample OUT.csv             # every second until killed
    python benchmarks/gpu/moe_summary.py table --runs r3=A/metrics.jsonl nor3=B/metrics.jsonl --memory OUT.csv

The sampler writes ``seconds,role@gpuN,pid,MiB`` rows: each compute process nvidia-smi lists, its role
read from its command line while it runs (``sglang``: an SGLang server's processes; ``trainer``: a
trainer rank; else the executable's name), and a ``total@gpuN`` row per GPU (its used memory). The table has one
column per run: its steps, median step time, rollout tokens/s, train-inference |Δlogprob|, the routing
mismatch (replayed runs only), the trainer's peak memory (its own metric) and each role's peak as
nvidia-smi saw it while that run's metrics were being written.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROWS = [  # (label, metric key, how to reduce the per-step values, format)
    ("steps trained", None, "count", "{:.0f}"),
    ("step time, median s", "perf/step_time", "median", "{:.2f}"),
    ("train time, median s", "perf/train_time", "median", "{:.2f}"),
    ("weight sync, median s", "perf/weight_sync_time", "median", "{:.2f}"),
    ("rollout tokens/s, median", "perf/rollout_tokens_per_s", "median", "{:.0f}"),
    ("|Δlogprob| train vs SGLang, mean", "train/logprob_abs_diff", "mean", "{:.4f}"),
    ("routing mismatch (token, layer), mean", "train/moe/routing_mismatch", "mean", "{:.4f}"),
    ("expert load imbalance (max/mean), mean", "train/moe/load_imbalance", "mean", "{:.2f}"),
    ("trainer peak allocated GB", "train/memory_peak_allocated_gb", "max", "{:.1f}"),
    ("trainer peak reserved GB", "train/memory_peak_reserved_gb", "max", "{:.1f}"),
]


def role_of(pid: str) -> str:
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return "gone"
    if "sglang" in cmd:
        return "sglang"
    if "actors." in cmd or "torchrun" in cmd:
        return "trainer"
    return Path(cmd.split(" ", 1)[0]).name or "other"


def query(fields: str, what: str) -> list[list[str]]:
    out = subprocess.run(["nvidia-smi", f"--query-{what}={fields}", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, timeout=30).stdout
    return [[cell.strip() for cell in line.split(",")] for line in out.splitlines() if line.strip()]


def sample(path: Path, interval: float) -> None:
    with path.open("a", newline="") as handle:
        writer = csv.writer(handle)
        while True:
            now = round(time.time(), 1)
            gpus = {bus: index for index, bus in query("index,pci.bus_id", "gpu")}
            for bus, pid, mib in query("gpu_bus_id,pid,used_memory", "compute-apps"):
                writer.writerow([now, f"{role_of(pid)}@gpu{gpus.get(bus, '?')}", pid, mib])
            for index, mib in query("index,memory.used", "gpu"):
                writer.writerow([now, f"total@gpu{index}", "", mib])
            handle.flush()
            time.sleep(interval)


def reduce(values: list[float], how: str) -> float | None:
    if how == "count":
        return float(len(values))
    if not values:
        return None
    return {"median": statistics.median, "mean": statistics.fmean, "max": max}[how](values)


def run_column(rows: list[dict[str, Any]], memory: list[list[str]]) -> dict[str, str]:
    steps = [row for row in rows if "perf/step_time" in row]
    column = {}
    for label, key, how, fmt in ROWS:
        values = [float(row[key]) for row in steps if key and row.get(key) is not None]
        value = reduce(values if key else [1.0] * len(steps), how)
        column[label] = fmt.format(value) if value is not None else "-"
    if rows and memory:  # nvidia-smi's peaks while this run was logging (its first to last metric row)
        start, end = rows[0]["time"] - 120, rows[-1]["time"] + 5  # the run's start-up before its first row
        window = [row for row in memory if start <= float(row[0]) <= end]
        for role in sorted({who for _, who, _, _ in window if who.split("@")[0] in ("sglang", "trainer", "total")}):
            seen = {}
            for stamp, who, pid, mib in window:
                if who == role:
                    seen[stamp] = seen.get(stamp, 0.0) + float(mib)  # an SGLang server has several processes
            column[f"GPU memory peak, {role} (nvidia-smi) GB"] = f"{max(seen.values()) / 1024:.1f}"
    return column


def table(runs: list[str], memory_path: Path | None) -> str:
    memory = []
    if memory_path is not None and memory_path.exists():
        memory = [row for row in csv.reader(memory_path.open()) if len(row) == 4]
    columns = {}
    for spec in runs:
        name, _, path = spec.partition("=")
        file = Path(path)
        rows = [json.loads(line) for line in file.read_text().splitlines() if line.strip()] if file.exists() else []
        columns[name] = run_column(rows, memory)
    labels = list(dict.fromkeys(label for column in columns.values() for label in column))
    lines = ["| | " + " | ".join(columns) + " |", "|---|" + "---:|" * len(columns)]
    lines += [f"| {label} | " + " | ".join(c.get(label, "-") for c in columns.values()) + " |" for label in labels]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    s = sub.add_parser("sample")
    s.add_argument("out", type=Path)
    s.add_argument("--interval", type=float, default=1.0)
    t = sub.add_parser("table")
    t.add_argument("--runs", nargs="+", required=True, metavar="NAME=METRICS.jsonl")
    t.add_argument("--memory", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.command == "sample":
        sample(args.out, args.interval)
    else:
        print(table(args.runs, args.memory))
    return 0


if __name__ == "__main__":
    sys.exit(main())
