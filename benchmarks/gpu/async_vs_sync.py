"""sync vs one-step-off vs fully-async on a long-tail workload, against the engine's own saturation.

One engine serves every run (an SGLang server started by benchmarks/gpu/async_vs_sync.sh, or
with --tiny a CPU engine this script starts); before each run it gets the base weights back
(version "default"), and each run trains the same number of steps from the same checkpoint, so
every mode trains the same samples. Phases (each writes JSON under --out, so the GPU driver can
split them across calls):

  standalone  the engine's saturated tokens/s on the workload's length mix: a closed loop keeps
              as many requests in flight as the engine holds (policies.concurrency, from its
              /server_info) for --standalone-s seconds, then aborts the rest and counts every
              token generated, the aborted requests' too
  runs        `slime-async train` once per --runs entry: sync, one-step-off, fully-async with
              k = 1, 2, 4 (abort syncs) and k = 2 with pause and in_place syncs; NCCL (gloo on
              CPU) weight updates
  table       the markdown table of every run measured, with the workload's overlap bound:
              sync s/step / max(generation time at standalone saturation, train + sync time)

Steady state: the first --warmup steps of a run are left out of every number.
Usage (CPU smoke of the script, not a result):
  python benchmarks/gpu/async_vs_sync.py --tiny --out /tmp/avs
GPU: see benchmarks/gpu/async_vs_sync.sh.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from actors.router.engine_state import reported_capacity  # noqa: E402
from benchmarks.gpu.longtail import HOOKS, WORKLOADS  # noqa: E402
from policies.concurrency import rollout_concurrency  # noqa: E402
from slime_async.engine_client import EngineClient  # noqa: E402

# name -> (train mode, max staleness, weight-update mode)
RUNS: dict[str, tuple[str, int | None, str]] = {
    "colocated-sync": ("sync", None, "abort"),  # --layout one-gpu only: --colocate, SGLang started by the run
    "sync": ("sync", None, "abort"),
    "one-step-off": ("one-step-off", None, "abort"),
    "one-step-off-in_place": ("one-step-off", None, "in_place"),
    "async-k1": ("fully-async", 1, "abort"),
    "async-k1-in_place": ("fully-async", 1, "in_place"),
    "async-k2": ("fully-async", 2, "abort"),
    "async-k2-drain": ("fully-async", 2, "drain"),
    "async-k2-in_place": ("fully-async", 2, "in_place"),
    "async-k2-retract": ("fully-async", 2, "retract"),
    "async-k4": ("fully-async", 4, "abort"),
    "async-k4-in_place": ("fully-async", 4, "in_place"),
}
PROMPT_TOKENS = 8  # the standalone loop's prompts: random ids, about the task's prompt length


# ----- standalone saturation ------------------------------------------------------------------
async def standalone(url: str, workload_name: str, seconds: float, vocab: int) -> dict[str, float]:
    workload = WORKLOADS[workload_name]
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None)) as http:
        client = EngineClient(url, session=http)
        capacity = reported_capacity(await client.get_server_info())
        concurrency = rollout_concurrency([capacity], PROMPT_TOKENS + workload.long_tokens)
        rng = random.Random(0)
        tokens = 0
        count = 0
        stop = asyncio.Event()

        async def worker(w: int) -> None:
            nonlocal tokens, count
            n = 0
            while not stop.is_set():
                max_new, forced = workload.budget(w, n)
                n += 1
                params = {"temperature": 1.0, "max_new_tokens": max_new, "ignore_eos": True}
                ids = [rng.randrange(10, vocab) for _ in range(PROMPT_TOKENS)]
                out = await client.generate(ids, params, return_logprob=False)
                tokens += len(out.get("output_ids") or [])
                count += 1

        started = time.monotonic()
        tasks = [asyncio.ensure_future(worker(w)) for w in range(concurrency)]
        await asyncio.sleep(seconds)
        stop.set()
        await client.abort_request(abort_all=True)  # the aborted answers bring their partial tokens
        await asyncio.gather(*tasks, return_exceptions=True)
        elapsed = time.monotonic() - started
    return {"tokens_per_s": tokens / elapsed, "concurrency": float(concurrency), "seconds": elapsed,
            "requests": float(count), "tokens": float(tokens)}


# ----- one training run -------------------------------------------------------------------------
async def reset_engine(url: str, base: str) -> None:
    """The base weights back into the shared engine. A run or the standalone phase just aborted its
    requests, which may still sit in SGLang's batch for a step or two: the load itself does not
    flush (SGLang dies on a flush with requests in its batch), the deferred flush after it waits
    for the scheduler to go idle."""
    async with aiohttp.ClientSession() as http:
        client = EngineClient(url, session=http)
        await client.abort_request(abort_all=True)
        await client.update_weights_from_disk(base, weight_version="default", flush_cache=False, timeout=600)
        await client.flush_cache(wait_idle_s=60, timeout=90)


def engine_argv(args: argparse.Namespace, run: str) -> list[str]:
    """How a run reaches its engine: the shared SGLang server (resident beside the trainer with
    --layout one-gpu: weights by IPC handles on the one GPU; else NCCL from the trainer's GPU), or,
    for colocated-sync, an SGLang server of its own that releases the GPU while the trainer trains."""
    if run == "colocated-sync":
        return ["--colocate", "--engine-type", "sglang", "--sglang-enable-memory-saver",
                "--sglang-mem-fraction-static", str(args.mem_fraction), *SGLANG_FLAGS]
    transport = "tensor" if args.layout == "one-gpu" else ("disk" if args.tiny else "distributed")
    return ["--engine-type", "external", "--rollout-external-engine-addrs", args.url,
            "--update-weight-transport", transport]


# The backends this host's SGLang build needs, and CUDA graphs captured up to the largest batch the
# workload runs (the default captures far more, ~76 s of a start).
SGLANG_FLAGS = ["--sglang-attention-backend", "triton", "--sglang-sampling-backend", "pytorch",
                "--sglang-cuda-graph-max-bs-decode", "256", "--sglang-log-level", "warning"]


def train_argv(args: argparse.Namespace, run: str, run_dir: Path) -> list[str]:
    mode, k, update = RUNS[run]
    workload = WORKLOADS[args.workload]
    argv = [sys.executable, "-m", "actors.loop.cli", "train", "--hf-checkpoint", args.base,
            "--prompt-data", str(Path(args.data) / "train.jsonl"), "--run-dir", str(run_dir),
            "--train-mode", mode, "--weight-update-mode", update, "--num-rollout", str(args.steps),
            "--rollout-batch-size", str(args.prompts), "--n-samples-per-prompt", str(args.samples),
            "--rollout-max-response-len", str(workload.long_tokens),
            "--custom-generate-function-path", f"benchmarks.gpu.longtail:{HOOKS[args.workload]}",
            "--rm-type", "exact", *engine_argv(args, run), "--use-tis", "--lr", "1e-6",
            "--rollout-seed", "7", "--seed", "7", "--no-progress-bar", "--trace-dir", str(run_dir / "trace"),
            *args.extra]
    if k is not None:
        argv += ["--max-staleness", str(k)]
    if args.tiny:
        argv += ["--micro-batch-size", "8", "--trainer-num-threads", "1"]
    else:
        argv += ["--max-tokens-per-gpu", str(args.max_tokens_per_gpu)]
    return argv


def run_one(args: argparse.Namespace, run: str) -> dict[str, Any]:
    run_dir = Path(args.out) / "runs" / args.workload / run
    if run_dir.exists():
        subprocess.run(["rm", "-rf", str(run_dir)], check=True)
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    if run == "colocated-sync":
        stop_shared_engine(args)  # its own server takes the GPU memory the shared one holds
    else:
        asyncio.run(reset_engine(args.url, args.base))
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    if args.trainer_gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = args.trainer_gpu
    started = time.monotonic()
    log = Path(args.out) / f"{args.workload}-{run}.log"
    with log.open("w") as out:
        code = subprocess.run(train_argv(args, run, run_dir), cwd=REPO, env=env, stdout=out,
                              stderr=subprocess.STDOUT).returncode
    if code != 0:
        raise SystemExit(f"{run} failed (exit {code}); log {log}:\n" + "".join(log.read_text().splitlines(True)[-30:]))
    # The timeline (issue #17 item 5): people should see the overlap, or its absence. The trace
    # comes back with the results; where matplotlib is missing it is rendered after.
    if importlib.util.find_spec("matplotlib") is not None:
        subprocess.run([sys.executable, str(REPO / "benchmarks" / "render_trace.py"), str(run_dir / "trace" / "trace.json"),
                        "-o", str(Path(args.out) / f"trace_{args.workload}_{run}.png"),
                        "--title", f"{args.workload}: {run}"], cwd=REPO, check=False)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    result = summarize([r for r in rows if "perf/step_time" in r], args.warmup)
    result |= trace_busy(run_dir / "trace" / "trace.json", args.warmup)
    result["wall_s"] = time.monotonic() - started
    return result


def stop_shared_engine(args: argparse.Namespace) -> None:
    """Kill the shared SGLang server (it runs in its own session) and wait for its GPU memory."""
    port = args.url.rsplit(":", 1)[-1]
    subprocess.run(["pkill", "-9", "-f", f"sglang.launch_server.*--port {port}"], check=False)
    subprocess.run(["pkill", "-9", "-f", "sglang::"], check=False)  # its scheduler / detokenizer
    time.sleep(5)


def trace_busy(trace: Path, warmup: int) -> dict[str, float]:
    """From the run's timeline, over the steady steps: the share of wall time the engine ran at least
    one request, weight syncs left out (a request held in place is not generating), and the share
    the rollout spent waiting for admission."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    from render_trace import busy_fraction, load

    processes, _ = load(trace)
    spans = [(p.name, span) for p in processes for lane in p.spans.values() for span in lane]
    steps = sorted((s for _, s in spans if s.name.startswith("step ")), key=lambda s: s.end)
    if len(steps) <= warmup:
        return {}
    lo, hi = steps[warmup - 1].end if warmup else steps[0].start, steps[-1].end
    generate = [s for name, s in spans if name.startswith("engine") and s.name == "generate"]
    syncs = [s for _, s in spans if s.name.startswith("weight sync v")]
    admission = [s for name, s in spans if s.name.startswith("wait for admission")]
    window = hi - lo
    syncing = busy_fraction(syncs, lo, hi)
    return {"engine_busy": max(0.0, busy_fraction(generate, lo, hi) - syncing),
            "sync_share": syncing, "admission_wait": busy_fraction(admission, lo, hi), "window_s": window}


def summarize(steps: list[dict[str, Any]], warmup: int) -> dict[str, float]:
    """Steady-state numbers of one run from its per-step metrics (the first ``warmup`` steps out)."""
    if len(steps) <= warmup:
        raise SystemExit(f"{len(steps)} steps logged: not more than --warmup {warmup}")
    steady, before = steps[warmup:], steps[warmup - 1] if warmup else None
    start = before["time"] if before else steady[0]["time"] - steady[0]["perf/step_time"]
    wall = steady[-1]["time"] - start
    n = len(steady)

    def total(key: str) -> float:
        return sum(float(r.get(key, 0.0)) for r in steady)

    dropped_before = float(before.get("buffer/dropped_stale", 0.0)) if before else 0.0
    consumed_before = float(before.get("buffer/consumed_groups", 0.0)) if before else 0.0
    dropped = float(steady[-1].get("buffer/dropped_stale", 0.0)) - dropped_before
    consumed = float(steady[-1].get("buffer/consumed_groups", 0.0)) - consumed_before
    return {
        "steps": float(n),
        "s_per_step": wall / n,
        "tokens_per_step": total("rollout/tokens") / n,
        "engine_tokens_per_s": total("rollout/tokens") / wall,
        "trainer_busy": total("perf/train_time") / wall,
        "train_s": total("perf/train_time") / n,
        "sync_s": total("perf/weight_sync_time") / n,
        "staleness_max": max(float(r.get("buffer/staleness_max", 0.0)) for r in steady),
        "resumed": total("rollout/samples_resumed"),
        "dropped_stale": dropped,
        "dropped_stale_frac": dropped / max(1.0, dropped + consumed),
        "concurrency": float(steady[-1].get("rollout/concurrency", float("nan"))),
    }


# ----- table ----------------------------------------------------------------------------------
def table(out: Path, workload: str, label: str) -> str:
    saturation = out / f"standalone-{workload}.json"
    # Not measured (the phase did not finish): every ratio to it is left out.
    sat = json.loads(saturation.read_text()) if saturation.exists() else {"tokens_per_s": float("nan"),
                                                                          "concurrency": float("nan"), "seconds": 0}
    runs = {p.stem.removeprefix(f"run-{workload}-"): json.loads(p.read_text())
            for p in sorted(out.glob(f"run-{workload}-*.json"))}
    order = [r for r in RUNS if r in runs]
    lines = [f"### {label}", "",
             f"Standalone saturation: {sat['tokens_per_s']:.0f} tokens/s at {sat['concurrency']:.0f} requests "
             f"in flight ({sat['seconds']:.0f} s).", ""]
    if "sync" in runs:
        sync = runs["sync"]
        generation = sync["tokens_per_step"] / sat["tokens_per_s"]
        floor = max(generation, sync["train_s"] + sync["sync_s"])
        lines += [f"Overlap bound: sync {sync['s_per_step']:.2f} s/step ÷ max(generation at saturation "
                  f"{generation:.2f} s, train + sync {sync['train_s'] + sync['sync_s']:.2f} s) = "
                  f"**{sync['s_per_step'] / floor:.2f}×**.", ""]
    lines += ["| run | mode | k | sync mode | steps | s/step | speed-up vs sync | vs colocated sync | engine tok/s | "
              "of saturation | engine busy | admission wait | trainer busy | sync s | staleness max | resumed | "
              "stale dropped | concurrency |",
              "|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    base = runs.get("sync", {}).get("s_per_step")
    colocated = runs.get("colocated-sync", {}).get("s_per_step")

    def share(r: dict[str, Any], key: str) -> str:
        return f"{r[key]:.0%}" if key in r else "—"

    for name in order:
        r = runs[name]
        mode, k, update = RUNS[name]
        speed = f"{base / r['s_per_step']:.2f}×" if base else "—"
        versus = f"{colocated / r['s_per_step']:.2f}×" if colocated else "—"
        lines.append(
            f"| {name} | {mode} | {k if k is not None else '—'} | {update} | {r['steps']:.0f} | {r['s_per_step']:.2f} | "
            f"{speed} | {versus} | "
            f"{r['engine_tokens_per_s']:.0f} | {r['engine_tokens_per_s'] / sat['tokens_per_s']:.0%} | "
            f"{share(r, 'engine_busy')} | {share(r, 'admission_wait')} | "
            f"{r['trainer_busy']:.0%} | {r['sync_s']:.2f} | {r['staleness_max']:.0f} | {r['resumed']:.0f} | "
            f"{r['dropped_stale']:.0f} ({r['dropped_stale_frac']:.0%}) | {r['concurrency']:.0f} |")
    return "\n".join(lines) + "\n"


# ----- tiny (CPU) set-up ---------------------------------------------------------------------------
def tiny_setup(work: Path) -> tuple[str, str, Any]:
    """A tiny model, the quick start's task data and a CPU engine serving the model."""
    from actors.engine.cpu.local import start_local_engine

    base, data = work / "base", work / "data"
    subprocess.run([sys.executable, str(REPO / "examples/quickstart/make_task.py"), "--out", str(data),
                    "--heldout", "8"], check=True, capture_output=True)
    subprocess.run([sys.executable, "-m", "examples.models.tiny", "--out", str(base), "--seed", "0"],
                   check=True, capture_output=True, cwd=REPO)
    process, url = start_local_engine(base, work / "engine.log", "--max-running-requests", "32",
                                      "--num-threads", "1")
    return str(base), str(data), (process, url)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--phase", choices=("standalone", "runs", "table", "all"), default="all")
    parser.add_argument("--tiny", action="store_true", help="CPU smoke of the script: a CPU engine and a tiny model")
    parser.add_argument("--workload", choices=sorted(WORKLOADS), default=None)
    parser.add_argument("--runs", default=",".join(RUNS), help=f"comma-separated, of {', '.join(RUNS)}")
    parser.add_argument("--url", help="the engine (SGLang) every run uses; --tiny starts its own")
    parser.add_argument("--base", help="HF dir every run starts from (and the engine is reset to)")
    parser.add_argument("--data", help="directory with train.jsonl")
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--standalone-s", type=float, default=30.0)
    parser.add_argument("--vocab", type=int, default=512)
    parser.add_argument("--trainer-gpu", default=None, help="CUDA_VISIBLE_DEVICES of the trainer")
    parser.add_argument("--layout", choices=("two-gpu", "one-gpu"), default="two-gpu",
                        help="one-gpu: the trainer beside the shared SGLang on its GPU, tensor (IPC) weight updates, "
                             "and the colocated-sync row")
    parser.add_argument("--mem-fraction", type=float, default=0.45, help="colocated-sync: SGLang's static memory share")
    parser.add_argument("--max-tokens-per-gpu", type=int, default=16384)
    parser.add_argument("--extra", nargs=argparse.REMAINDER, default=[], help="more `slime-async train` flags")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    engine = None
    if args.tiny:
        args.workload = args.workload or "tiny"
        work = Path(tempfile.mkdtemp(prefix="avs-tiny-"))
        args.base, args.data, engine = tiny_setup(work)
        args.url = engine[1]
    args.workload = args.workload or "longtail"
    try:
        if args.phase in ("standalone", "all"):
            result = asyncio.run(standalone(args.url, args.workload, args.standalone_s, args.vocab))
            (out / f"standalone-{args.workload}.json").write_text(json.dumps(result, indent=1))
            print(f"standalone {args.workload}: {result['tokens_per_s']:.0f} tokens/s at {result['concurrency']:.0f}",
                  flush=True)
        if args.phase in ("runs", "all"):
            for run in filter(None, args.runs.split(",")):
                if run not in RUNS:
                    raise SystemExit(f"--runs: unknown run {run!r}; choose from {', '.join(RUNS)}")
                result = run_one(args, run)
                (out / f"run-{args.workload}-{run}.json").write_text(json.dumps(result, indent=1))
                print(f"{run}: {result['s_per_step']:.2f} s/step ({result['wall_s']:.0f} s wall)", flush=True)
        if args.phase in ("table", "all"):
            w = WORKLOADS[args.workload]
            label = (f"{args.workload}: {w.long_fraction:.0%} of samples forced to {w.long_tokens} tokens, the rest "
                     f"<= {w.short_tokens}; steps counted after {args.warmup} warm-up steps"
                     + (" — CPU smoke of the script, not a result" if args.tiny else ""))
            text = table(out, args.workload, label)
            (out / f"table-{args.workload}.md").write_text(text)
            print(text)
    finally:
        if engine is not None:
            from actors.engine.cpu.local import stop_local_engine

            stop_local_engine(engine[0])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
