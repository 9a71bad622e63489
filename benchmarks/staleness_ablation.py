"""Staleness ablation: does off-policy correction matter when fully-async training runs stale?

The quick start's task (tiny Qwen2-style model, digit reversal) from one shared SFT warm start,
trained with fully-async GRPO at ``--max-staleness`` k for every k in --staleness, once per
correction in --corrections and per seed, all on the same number of trained samples (--steps ×
16 prompts × 8 samples; two optimizer steps per rollout, so π_old is the trainer's recompute):

    none       no off-policy correction (π_old = the trainer's policy, no behaviour weight)
    tis        --use-tis: token-level truncated IS weight clamp(π_old/μ, 0, 2)
    decoupled  --use-decoupled-ppo (AReaL): clip against the proximal policy π_old, weight by π_old/μ
    naive      (not in the default grid) --use-rollout-logprobs: PPO's ratio against the stale μ

Staleness only appears when generation runs ahead of training. On a CPU the tiny model trains
about as fast as it generates, so every train step is lengthened by --train-delay seconds
(the trainer's --train-step-delay, an idle wait): the rollout then fills the buffer up to the
bound and samples are trained k versions after they were generated. The table shows the
measured ``rollout/staleness_mean`` / ``max`` of each configuration next to its reward.

Every run uses the CPU engine and the CPU trainer with CUDA hidden (CUDA_VISIBLE_DEVICES=""), so
it runs the same on a GPU host's CPUs; ``--parallel N`` runs N configurations at once, each
pinned to its own share of the cores with ``taskset`` when it is available. Output in --out:
``results.json`` (every run's raw numbers and eval curve), ``table.md`` (printed too), one run
directory per configuration under ``runs/``, and the warm start under ``warmstart/`` (reused
when it is already there).

    python benchmarks/staleness_ablation.py --out runs/staleness --parallel 8   # README's grid, 16 cores
    python benchmarks/staleness_ablation.py --out /tmp/s --staleness 0 8 --seeds 1 --steps 20
    python benchmarks/staleness_ablation.py --summarize runs/staleness/results.json other/results.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import queue
import shutil
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
QUICKSTART = REPO / "examples" / "quickstart"

CORRECTIONS: dict[str, list[str]] = {
    "none": ["--no-use-tis"],
    "tis": ["--use-tis", "--tis-clip", "2.0"],
    "decoupled": ["--no-use-tis", "--use-decoupled-ppo"],
    # AReaL's "naive PPO": the trust region is around the stale behaviour policy (π_old := μ).
    "naive": ["--no-use-tis", "--use-rollout-logprobs"],
}
DEFAULT_CORRECTIONS = ["none", "tis", "decoupled"]
# grpo.toml's shape: prompts per step x samples per prompt.
ROLLOUT_BATCH_SIZE = 16
N_SAMPLES_PER_PROMPT = 8


@dataclass(frozen=True)
class RunSpec:
    max_staleness: int
    correction: str
    seed: int

    @property
    def name(self) -> str:
        return f"k{self.max_staleness}-{self.correction}-s{self.seed}"


@dataclass
class RunResult:
    """One run's numbers, read from its metrics.jsonl."""

    max_staleness: int
    correction: str
    seed: int
    ok: bool
    wall_s: float
    error: str = ""
    evals: list[tuple[int, float]] = field(default_factory=list)  # (step, held-out reward)
    final_reward: float = math.nan
    best_reward: float = math.nan
    auc: float = math.nan  # mean held-out reward over training: trapezoid area / steps
    staleness_mean: float = math.nan  # mean over steps of rollout/staleness_mean
    staleness_max: float = math.nan
    trained_samples: int = 0
    dropped_stale_groups: float = 0.0
    steps: int = 0
    extra: dict[str, float] = field(default_factory=dict)  # means of train/* metrics worth a look


# ----- reading a run's metrics (pure) -----------------------------------------------------------
def curve_area(evals: list[tuple[int, float]]) -> float:
    """Trapezoid area under (step, reward) divided by the step span: the curve's mean height."""
    if len(evals) < 2:
        return evals[0][1] if evals else math.nan
    area = sum((s1 - s0) * (r0 + r1) / 2 for (s0, r0), (s1, r1) in zip(evals, evals[1:]))
    return area / (evals[-1][0] - evals[0][0])


_EXTRA_METRICS = ("train/pg_clipfrac", "train/ppo_kl", "train/tis_clipfrac", "train/logprob_abs_diff",
                  "train/decoupled_behave_weight_mean", "rollout/offpolicy_token_frac")


def summarize_metrics(rows: list[dict]) -> dict:
    """Eval curve, staleness and trained-sample count of one run from its metrics.jsonl rows."""
    evals = sorted((int(m["step"]), float(m["eval/reward_mean"])) for m in rows
                   if m.get("eval/reward_mean") is not None)
    steps = [m for m in rows if "perf/step_time" in m]
    stale = [m["rollout/staleness_mean"] for m in steps if "rollout/staleness_mean" in m]
    stale_max = [m["rollout/staleness_max"] for m in steps if "rollout/staleness_max" in m]
    last = steps[-1] if steps else {}
    extra = {}
    for key in _EXTRA_METRICS:
        values = [m[key] for m in steps if key in m]
        if values:
            extra[key] = sum(values) / len(values)
    return {
        "evals": evals,
        "final_reward": evals[-1][1] if evals else math.nan,
        "best_reward": max(r for _, r in evals) if evals else math.nan,
        "auc": curve_area(evals),
        "staleness_mean": sum(stale) / len(stale) if stale else math.nan,
        "staleness_max": max(stale_max) if stale_max else math.nan,
        "trained_samples": int(last.get("buffer/consumed_groups", 0)) * N_SAMPLES_PER_PROMPT,
        "dropped_stale_groups": float(last.get("buffer/dropped_stale", 0.0)),
        "steps": len(steps),
        "extra": extra,
    }


def _mean_spread(values: list[float]) -> str:
    values = [v for v in values if not math.isnan(v)]
    if not values:
        return "—"
    if len(values) == 1:
        return f"{values[0]:.3f}"
    return f"{statistics.mean(values):.3f} ± {statistics.stdev(values):.3f}"


def _mean(values: list[float], digits: int = 2) -> str:
    values = [v for v in values if not math.isnan(v)]
    return f"{statistics.mean(values):.{digits}f}" if values else "—"


def markdown_table(results: list[RunResult], warm_start_reward: float | None = None) -> str:
    """One row per (max staleness, correction): measured staleness, rewards over seeds (mean ± sample
    standard deviation), trained samples and wall time per run."""
    lines = ["| max staleness | correction | staleness mean / max | final reward | best reward "
             "| eval AUC | trained samples | seeds | wall s / run |",
             "|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    keys = sorted({(r.max_staleness, r.correction) for r in results},
                  key=lambda k: (k[0], list(CORRECTIONS).index(k[1]) if k[1] in CORRECTIONS else 99))
    for k, correction in keys:
        runs = [r for r in results if (r.max_staleness, r.correction) == (k, correction)]
        done = [r for r in runs if r.ok]
        failed = len(runs) - len(done)
        seeds = f"{len(done)}" + (f" ({failed} failed)" if failed else "")
        samples = sorted({r.trained_samples for r in done})
        stale = (f"{_mean([r.staleness_mean for r in done])} / {max(r.staleness_max for r in done):.0f}"
                 if done else "—")
        lines.append(
            f"| {k} | {correction} | {stale} | {_mean_spread([r.final_reward for r in done])} "
            f"| {_mean_spread([r.best_reward for r in done])} | {_mean_spread([r.auc for r in done])} "
            f"| {'/'.join(map(str, samples)) or '—'} | {seeds} | {_mean([r.wall_s for r in done], 0)} |")
    table = "\n".join(lines)
    if warm_start_reward is not None and not math.isnan(warm_start_reward):
        table += f"\n\nHeld-out reward of the SFT warm start (step 0): {warm_start_reward:.3f}."
    return table


# ----- running ---------------------------------------------------------------------------------
def child_env(cores: list[int] | None) -> dict[str, str]:
    """CPU only, the repository importable without an install, thread pools sized to the cores."""
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "",
           "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)}
    if cores:
        env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(len(cores))
    return env


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "actors.loop.cli", *args]


def _check(argv: list[str], log: Path, env: dict[str, str]) -> None:
    with open(log, "w") as out:
        done = subprocess.run(argv, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
    if done.returncode:
        tail = "\n".join(log.read_text().splitlines()[-15:])
        raise SystemExit(f"{' '.join(argv[:4])} ... failed (exit {done.returncode}); last lines of {log}:\n{tail}")


def make_warm_start(work: Path, sft_steps: int) -> tuple[Path, Path]:
    """The quick start's tiny model, data and SFT warm start in ``work``, reused when it was made
    with the same number of SFT steps (0: no SFT, RL starts from the random-init model)."""
    model, data, done = (work / "sft-hf" if sft_steps else work / "base"), work / "data", work / "DONE"
    stamp = f"sft_steps={sft_steps}\n"
    if done.exists() and done.read_text() == stamp:
        return model, data
    ours = work / "STARTED"
    if work.exists() and any(work.iterdir()) and not ours.exists():
        raise SystemExit(f"warm start: {work} is not empty and was not made by this benchmark; "
                         "pass another --warm-start or --out")
    shutil.rmtree(work, ignore_errors=True)  # ours: an older or interrupted warm start
    work.mkdir(parents=True)
    ours.write_text("")
    env = child_env(None)
    print(f"warm start: tiny model, task data and {sft_steps} SFT steps in {work}", flush=True)
    _check([sys.executable, "-m", "examples.models.tiny", "--out", str(work / "base"), "--arch", "qwen2", "--seed", "0"],
           work / "init.log", env)
    _check([sys.executable, str(QUICKSTART / "make_task.py"), "--out", str(data)], work / "data.log", env)
    if sft_steps:
        _check(_cli("train", "--config", str(QUICKSTART / "sft.toml"), "--hf-checkpoint", str(work / "base"),
                    "--prompt-data", str(data / "train.jsonl"), "--run-dir", str(work / "sft"),
                    "--save-hf", str(model), "--num-rollout", str(sft_steps), "--no-progress-bar"),
               work / "sft.log", env)
    done.write_text(stamp)
    return model, data


def run_argv(spec: RunSpec, args: argparse.Namespace, model: Path, data: Path, run_dir: Path,
             threads: int) -> list[str]:
    # Room for every group the staleness bound admits (the default capacity of 64 groups would cap
    # staleness at 3 with 16 groups a step).
    capacity = max(64, (spec.max_staleness + 2) * args.rollout_batch_size)
    argv = _cli("train", "--config", str(QUICKSTART / "grpo.toml"),
                "--hf-checkpoint", str(model), "--prompt-data", str(data / "train.jsonl"),
                "--eval-prompt-data", str(data / "heldout.jsonl"), "--run-dir", str(run_dir),
                "--num-rollout", str(args.steps), "--eval-interval", str(args.eval_interval),
                "--rollout-batch-size", str(args.rollout_batch_size),
                "--max-staleness", str(spec.max_staleness), "--buffer-capacity", str(capacity),
                "--train-step-delay", str(args.train_delay), "--lr", str(args.lr),
                "--seed", str(spec.seed), "--rollout-seed", str(spec.seed),
                "--trainer-num-threads", str(threads), "--cpu-engine-threads", str(threads),
                "--no-progress-bar", *CORRECTIONS[spec.correction])
    if args.num_steps_per_rollout > 1:
        # Each optimizer step's global batch must split into whole micro-batches (grpo.toml's are 128).
        per_step = args.rollout_batch_size * N_SAMPLES_PER_PROMPT // args.num_steps_per_rollout
        argv += ["--num-steps-per-rollout", str(args.num_steps_per_rollout), "--micro-batch-size", str(per_step)]
    return argv + list(args.extra)


# The settings a finished run's numbers depend on: --resume reuses a run only when they match.
_RESULT_SETTINGS = ("steps", "rollout_batch_size", "eval_interval", "lr", "num_steps_per_rollout", "train_delay",
                    "sft_steps", "extra")


def _settings_key(args: argparse.Namespace) -> dict:
    return {name: getattr(args, name) for name in _RESULT_SETTINGS}


def result_from_dict(data: dict) -> RunResult:
    return RunResult(**{**data, "evals": [tuple(e) for e in data.get("evals", [])]})


def run_one(spec: RunSpec, args: argparse.Namespace, model: Path, data: Path, cores: list[int] | None) -> RunResult:
    run_dir = args.out / "runs" / spec.name
    saved = run_dir / "result.json"
    if args.resume and saved.exists():
        previous = json.loads(saved.read_text())
        if previous.get("settings") == json.loads(json.dumps(_settings_key(args))):
            return result_from_dict(previous["result"])
    argv = run_argv(spec, args, model, data, run_dir, len(cores) if cores else 0)
    if cores and shutil.which("taskset"):
        argv = ["taskset", "-c", ",".join(map(str, cores)), *argv]
    error = ""
    for attempt in (1, 2):  # one retry: a free port taken by a parallel run between pick and bind
        shutil.rmtree(run_dir, ignore_errors=True)
        run_dir.mkdir(parents=True)
        log = run_dir / "stdout.log"
        started = time.monotonic()
        with open(log, "w") as out:
            rc = subprocess.run(argv, cwd=REPO, env=child_env(cores), stdout=out, stderr=subprocess.STDOUT).returncode
        wall = time.monotonic() - started
        metrics = run_dir / "metrics.jsonl"
        if rc == 0 and metrics.exists():
            rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
            result = RunResult(spec.max_staleness, spec.correction, spec.seed, True, wall, **summarize_metrics(rows))
            saved.write_text(json.dumps({"settings": _settings_key(args), "result": asdict(result)}))
            return result
        error = f"attempt {attempt}: exit {rc}; see {log}"
        print(f"  {spec.name}: {error}", flush=True)
    return RunResult(spec.max_staleness, spec.correction, spec.seed, False, 0.0, error=error)


def core_slots(parallel: int) -> list[list[int] | None]:
    """``parallel`` disjoint core lists covering the cores this process may use (None: no pinning)."""
    try:
        cores = sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return [None] * parallel
    if parallel > len(cores):
        return [None] * parallel
    share = len(cores) // parallel
    return [cores[i * share:(i + 1) * share] for i in range(parallel)]


def run_grid(specs: list[RunSpec], args: argparse.Namespace, model: Path, data: Path) -> list[RunResult]:
    slots: queue.Queue = queue.Queue()
    for slot in core_slots(args.parallel):
        slots.put(slot)

    def work(spec: RunSpec) -> RunResult:
        cores = slots.get()
        try:
            result = run_one(spec, args, model, data, cores)
        finally:
            slots.put(cores)
        state = (f"final {result.final_reward:.3f}, staleness {result.staleness_mean:.2f}/{result.staleness_max:.0f}"
                 if result.ok else "FAILED")
        print(f"  {spec.name}: {state}, {result.wall_s:.0f} s (cores {cores})", flush=True)
        return result

    with ThreadPoolExecutor(args.parallel) as pool:
        return list(pool.map(work, specs))


def _warm_start_reward(results: list[RunResult]) -> float | None:
    starts = [r.evals[0][1] for r in results if r.ok and r.evals and r.evals[0][0] == 0]
    return statistics.mean(starts) if starts else None


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, help="results, run directories and the warm start (required)")
    parser.add_argument("--staleness", type=int, nargs="+", default=[0, 2, 8], help="values of --max-staleness")
    parser.add_argument("--corrections", nargs="+", default=DEFAULT_CORRECTIONS, choices=list(CORRECTIONS))
    parser.add_argument("--seeds", type=int, default=3, help="seeds per configuration (1, 2, ...)")
    parser.add_argument("--steps", type=int, default=60, help=f"RL steps per run, each of --rollout-batch-size x "
                        f"{N_SAMPLES_PER_PROMPT} samples (the same in every run)")
    parser.add_argument("--rollout-batch-size", type=int, default=ROLLOUT_BATCH_SIZE,
                        help=f"prompts per step (grpo.toml's {ROLLOUT_BATCH_SIZE})")
    parser.add_argument("--eval-interval", type=int, default=None, help="steps between evaluations (default steps / 6)")
    parser.add_argument("--lr", type=float, default=5e-4, help="learning rate (grpo.toml's 5e-4)")
    parser.add_argument("--num-steps-per-rollout", type=int, default=2, help="optimizer steps per rollout (the "
                        "quick start takes 1; with 2 the PPO ratio against the recomputed π_old and its clip act)")
    parser.add_argument("--train-delay", type=float, default=1.0,
                        help="seconds each train step waits (--train-step-delay) so generation runs ahead")
    parser.add_argument("--parallel", type=int, default=1, help="configurations run at once")
    parser.add_argument("--warm-start", type=Path, default=None, help="warm-start directory (default OUT/warmstart)")
    parser.add_argument("--sft-steps", type=int, default=80,
                        help="SFT steps of the warm start (sft.toml's 80; 0: RL from the random-init model)")
    parser.add_argument("--resume", action="store_true",
                        help="keep the runs in OUT/runs that finished with the same settings; run the rest")
    parser.add_argument("--summarize", type=Path, nargs="+", metavar="RESULTS_JSON",
                        help="run nothing: print the table of the runs in these results.json files together")
    parser.add_argument("extra", nargs="*", help="after --: more flags for every `slime-async train` run")
    args = parser.parse_args(argv)
    if args.summarize:
        return args
    if args.out is None:
        parser.error("--out is required (or --summarize RESULTS_JSON ...)")
    for name in ("seeds", "steps", "rollout_batch_size", "parallel", "num_steps_per_rollout"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.sft_steps < 0:
        parser.error(f"--sft-steps must be >= 0, got {args.sft_steps}")
    if (args.rollout_batch_size * N_SAMPLES_PER_PROMPT) % args.num_steps_per_rollout:
        parser.error(f"--num-steps-per-rollout must divide the {args.rollout_batch_size * N_SAMPLES_PER_PROMPT} "
                     f"samples of a rollout, got {args.num_steps_per_rollout}")
    if any(k < 0 for k in args.staleness):
        parser.error(f"--staleness values must be >= 0, got {args.staleness}")
    if args.train_delay < 0:
        parser.error(f"--train-delay must be >= 0, got {args.train_delay}")
    args.eval_interval = args.eval_interval or max(1, args.steps // 6)
    args.out = args.out.resolve()
    return args


def summarize(paths: list[Path]) -> int:
    results = []
    for path in paths:
        try:
            results += [result_from_dict(r) for r in json.loads(path.read_text())["runs"]]
        except (OSError, ValueError, KeyError, TypeError) as error:
            print(f"--summarize {path}: not a results.json of this benchmark ({error})", file=sys.stderr)
            return 2
    print(markdown_table(results, _warm_start_reward(results)))
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.summarize:
        return summarize(args.summarize)
    args.out.mkdir(parents=True, exist_ok=True)
    model, data = make_warm_start((args.warm_start or args.out / "warmstart").resolve(), args.sft_steps)
    # Stale runs first: they take longest (generation and training overlap on the same cores).
    specs = [RunSpec(k, c, s) for k, c, s in
             itertools.product(sorted(args.staleness, reverse=True), args.corrections, range(1, args.seeds + 1))]
    print(f"{len(specs)} runs of {args.steps} steps, {args.parallel} at a time", flush=True)
    started = time.monotonic()
    results = run_grid(specs, args, model, data)
    table = markdown_table(results, _warm_start_reward(results))
    settings = {key: (str(value) if isinstance(value, Path) else value) for key, value in vars(args).items()}
    (args.out / "results.json").write_text(json.dumps(
        {"settings": settings, "wall_s": time.monotonic() - started, "runs": [asdict(r) for r in results]}, indent=1))
    (args.out / "table.md").write_text(table + "\n")
    print(table)
    print(f"\nraw results: {args.out / 'results.json'}")
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
