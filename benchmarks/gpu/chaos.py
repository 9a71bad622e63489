"""Chaos against a real run's engine and trainer, one fault per run (issue #29 item 1).

Each fault is one `slime-async train` run (sync mode, prompts in file order: the trained prompts
are exactly the first steps x rollout-batch-size rows unless one was lost), into which the fault is
injected once step ``--fault-after`` has trained:

| fault | when | what |
|---|---|---|
| none | - | the baseline: step time without a fault |
| kill9-engine-generating | the engine reports running requests | SIGKILL of the engine's process group |
| kill9-engine-disk-update | a disk weight sync begins (engines paused) | SIGKILL of the engine |
| kill9-engine-tensor-update | a CUDA IPC sync begins (GPU only: trainer and engine on one GPU) | SIGKILL of the engine |
| kill9-engine-paused-in-place | an in_place sync begins (requests paused with their KV) | SIGKILL of the engine |
| sigstop-engine | the engine reports running requests | SIGSTOP for --stop-seconds, then SIGCONT |
| kill9-trainer-rank-update | a weight sync begins | SIGKILL of trainer rank 0 (the run saves every step) |

A weight-update fault hits the sync of step fault-after + 1, which the run holds, its engines paused,
until the fault is in (--debug-hold-weight-sync; see inject()).

A row per fault (markdown, and JSON lines beside it): the outcome (completes / resumes from its
checkpoint / fails, with the run's last line), prompts lost (among the first steps x batch rows,
never trained) and repeated (trained in more than one group), and the seconds from the fault to the
first step that could only be trained with the target back (see run_fault), beside the baseline's
median step time. The same logic runs against
the CPU engine (tests/benchmarks/test_chaos_driver.py) and against SGLang (benchmarks/gpu/chaos.sh).

    python -m benchmarks.gpu.chaos --out OUT --faults none,kill9-engine-disk-update -- TRAIN FLAGS...
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

import psutil

# The weight sync's line once --debug-hold-weight-sync holds it, its engines paused (actors/weight_sync/actor.py).
SYNC_HELD = "weight sync v{version}: held until"
ENGINES = re.compile(r"engines \(\w+\): (\S+)")
ENGINE_PROCESS = ("actors.engine.cpu", "sglang.launch_server")


@dataclass(frozen=True)
class Fault:
    trigger: str  # "" (none) | "generating" | "sync"
    target: str = ""  # "engine" | "rank"
    action: str = "kill9"  # "kill9" | "stop"
    flags: tuple[str, ...] = ()
    gpu_only: bool = False


FAULTS = {
    "none": Fault(""),
    "kill9-engine-generating": Fault("generating", "engine"),
    "kill9-engine-disk-update": Fault("sync", "engine", flags=("--update-weight-transport", "disk")),
    "kill9-engine-tensor-update": Fault("sync", "engine", flags=("--update-weight-transport", "tensor"), gpu_only=True),
    "kill9-engine-paused-in-place": Fault("sync", "engine", flags=("--weight-update-mode", "in_place")),
    "sigstop-engine": Fault("generating", "engine", action="stop"),
    "kill9-trainer-rank-update": Fault("sync", "rank", flags=("--save", "{run}/save", "--save-interval", "1")),
}


@dataclass
class Row:
    fault: str
    outcome: str = ""
    exit_code: int | None = None
    steps_trained: int = 0
    prompts_lost: int | None = None
    prompts_repeated: int | None = None
    recover_s: float | None = None
    median_step_s: float | None = None
    injected_at_step: int | None = None
    last_line: str = ""
    notes: list[str] = field(default_factory=list)


class Run:
    """One `slime-async train` process in its own session, its log and its metrics rows' arrival times."""

    def __init__(self, run_dir: Path, argv: list[str], env: dict[str, str]):
        self.run_dir, self.log_path = run_dir, run_dir.with_suffix(".log")
        run_dir.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen([sys.executable, "-m", "actors.loop.cli", "train", "--run-dir",
                                             str(run_dir), "--no-progress-bar", *argv], stdout=log,
                                            stderr=subprocess.STDOUT, env=env, start_new_session=True)
        self.step_times: dict[int, float] = {}  # step -> when its metrics row was first seen

    def poll(self) -> None:
        path = self.run_dir / "metrics.jsonl"
        if not path.is_file():
            return
        for line in path.read_text().splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue  # a row being written
            if "train/version" in row:
                self.step_times.setdefault(int(row["step"]), time.monotonic())

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def alive(self) -> bool:
        return self.process.poll() is None

    def pids(self, predicate) -> list[int]:
        try:
            children = psutil.Process(self.process.pid).children(recursive=True)
        except psutil.Error:
            return []
        out = []
        for child in children:
            try:
                if predicate(" ".join(child.cmdline())):
                    out.append(child.pid)
            except psutil.Error:
                pass
        return out

    def stop(self) -> None:
        if self.alive():
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()


def engine_pid(run: Run) -> int | None:
    # The engine's own process: the one whose parent is not an engine process too (SGLang's schedulers).
    pids = run.pids(lambda cmd: any(name in cmd for name in ENGINE_PROCESS))
    tops = [pid for pid in pids if psutil.Process(pid).ppid() not in pids]
    return tops[0] if tops else None


def rank_pid(run: Run) -> int | None:
    pids = run.pids(lambda cmd: "actors.trainer.worker" in cmd and "torch.distributed.run" not in cmd)
    return min(pids) if pids else None


def engine_url(run: Run) -> str:
    urls = ENGINES.findall(run.log())
    return urls[-1].split(",")[0] if urls else ""


def running_requests(url: str) -> int:
    try:
        with urllib.request.urlopen(url + "/v1/loads", timeout=5) as response:
            loads = json.loads(response.read())
    except (OSError, ValueError):
        return 0
    return sum(int(entry.get("num_running_reqs", 0)) for entry in loads.get("loads", []))


def wait_for(run: Run, condition, deadline: float, what: str) -> None:
    while not condition():
        run.poll()
        if not run.alive():
            raise RuntimeError(f"the run ended before {what}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"no {what} before the deadline")
        time.sleep(0.05)


def hold_file(hold_dir: Path, after: int) -> Path:
    """The file that holds the weight sync a sync fault hits: v(after + 1), the first to begin once
    step ``after`` has trained (a step's metrics row is written after its own sync)."""
    return hold_dir / f"hold-v{after + 1}"


def wait_gone(pid: int, deadline: float) -> None:
    """Until ``pid`` has exited (a zombie counts: it answers nothing)."""
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return
        except psutil.NoSuchProcess:
            return
        time.sleep(0.05)
    raise RuntimeError(f"process {pid} still alive after SIGKILL")


def last_step(run: Run) -> int:
    """The last step whose metrics row is written now."""
    run.poll()
    return max(run.step_times, default=0)


def inject(run: Run, fault: Fault, after: int, stop_seconds: float, deadline: float,
           hold: Path | None = None) -> tuple[float, int]:
    """Wait for the fault's moment, inject it; (when, the last step trained before it).

    A sync fault's moment does not race the run: the run holds that sync, engines paused, until
    the fault is in (``hold``, --debug-hold-weight-sync); an in-place sync of a small model is
    over in tens of milliseconds, less than a log-watching driver may take to notice it."""
    if fault.trigger == "generating":
        wait_for(run, lambda: max(run.step_times, default=0) >= after, deadline, f"trained step {after}")
        url = engine_url(run)
        wait_for(run, lambda: running_requests(url) > 0, deadline, "a request running on the engine")
    elif fault.trigger == "sync":
        held = SYNC_HELD.format(version=after + 1)
        wait_for(run, lambda: held in run.log(), deadline, f"weight sync v{after + 1} held")
    pid = engine_pid(run) if fault.target == "engine" else rank_pid(run)
    if pid is None:
        raise RuntimeError(f"no {fault.target} process to inject into")
    when = time.monotonic()
    if fault.action == "stop":
        os.killpg(os.getpgid(pid), signal.SIGSTOP)
        step = last_step(run)
        time.sleep(stop_seconds)
        os.killpg(os.getpgid(pid), signal.SIGCONT)
    else:
        if fault.target == "engine":
            os.killpg(os.getpgid(pid), signal.SIGKILL)  # the server and its schedulers, as a crash would
        else:
            os.kill(pid, signal.SIGKILL)
        wait_gone(pid, deadline)  # gone before the sync goes on: the fault is inside its pause
        step = last_step(run)  # a held sync's own step has no row yet: it comes after the release
    if hold is not None:
        hold.unlink(missing_ok=True)
    return when, step


def trained_prompts(dump: Path, steps: int) -> list[str]:
    prompts = []
    for step in range(1, steps + 1):
        path = dump / f"step_{step:06d}.jsonl"
        if path.is_file():
            for line in path.read_text().splitlines():
                prompts += list({sample["prompt"] if isinstance(sample["prompt"], str) else json.dumps(sample["prompt"])
                                 for sample in json.loads(line)})  # one entry per group
    return prompts


def expected_prompts(data: Path, count: int) -> list[str]:
    rows = [json.loads(line) for line in data.read_text().splitlines() if line.strip()]
    return [row["prompt"] if isinstance(row["prompt"], str) else json.dumps(row["prompt"]) for row in rows[:count]]


def run_fault(name: str, args: argparse.Namespace, base: list[str], baseline_step_s: float | None) -> Row:
    fault, row = FAULTS[name], Row(name, median_step_s=baseline_step_s)
    run_dir = args.out / "runs" / name
    dump = run_dir.parent / f"{name}-dump"
    flags = [flag.replace("{run}", str(run_dir.parent / name)) for flag in fault.flags]
    hold = None
    if fault.trigger == "sync":
        hold = hold_file(run_dir.parent / f"{name}-hold", args.fault_after)
        hold.parent.mkdir(parents=True, exist_ok=True)
        hold.touch()
        flags += ["--debug-hold-weight-sync", str(hold.parent)]
    argv = [*base, "--train-mode", "sync", "--no-rollout-shuffle", "--num-rollout", str(args.steps),
            "--save-debug-rollout-data", str(dump), *flags]
    run = Run(run_dir, argv, {**os.environ})
    deadline = time.monotonic() + args.timeout
    fault_at = None
    try:
        if fault.trigger:
            fault_at, row.injected_at_step = inject(run, fault, args.fault_after, args.stop_seconds, deadline, hold)
        while run.alive() and time.monotonic() < deadline:
            run.poll()
            time.sleep(0.2)
    except RuntimeError as error:
        row.notes.append(str(error))
    finally:
        run.stop()
        run.poll()
        if hold is not None:
            hold.unlink(missing_ok=True)
    log = run.log()
    row.exit_code = run.process.returncode
    row.steps_trained = len(run.step_times)
    row.last_line = (log.strip().splitlines() or [""])[-1][:300]
    restarted = "restart 1 of" in log
    row.outcome = ("fails" if row.exit_code != 0 else
                   "resumes from its checkpoint" if restarted else "completes")
    times = sorted(run.step_times.items())
    if fault_at is not None:
        # The first step that could only be trained with the target back. One engine, sync mode
        # (staleness 0): the next step's generation starts after the sync of the last, so a killed
        # or stopped engine's step (the one being generated, or the one after a held sync: that
        # sync's own step trained before the fault, its row only says the sync ended) waits for the
        # engine; a killed rank's step is trained again by the restarted run.
        first = row.injected_at_step + (2 if fault.trigger == "sync" and fault.target == "engine" else 1)
        after = [t for step, t in times if step >= first and t > fault_at]
        row.recover_s = round(after[0] - fault_at, 2) if after else None
    elif len(times) > 2:
        row.median_step_s = round(statistics.median(b - a for (_, a), (_, b) in zip(times[1:], times[2:])), 2)
    batch = int(base[base.index("--rollout-batch-size") + 1]) if "--rollout-batch-size" in base else args.batch_size
    trained = trained_prompts(dump, args.steps)
    expected = expected_prompts(args.data, args.steps * batch)
    row.prompts_repeated = sum(n - 1 for n in Counter(trained).values() if n > 1)
    row.prompts_lost = len(set(expected) - set(trained)) if row.exit_code == 0 else None
    if row.exit_code is not None and row.exit_code < 0:
        row.notes.append(f"killed by signal {-row.exit_code} (deadline)")
    (args.out / f"{name}.log").write_text(log[-200_000:])
    return row


def table(rows: list[Row]) -> str:
    head = "| fault | outcome | steps | prompts lost | prompts repeated | recover (s) | baseline step (s) | last line |"
    lines = [head, "|" + "---|" * 8]
    for r in rows:
        last = r.last_line.replace("|", "\\|") if r.outcome == "fails" else ""
        lines.append(f"| {r.fault} | {r.outcome}{' (' + '; '.join(r.notes) + ')' if r.notes else ''} | "
                     f"{r.steps_trained} | {r.prompts_lost} | {r.prompts_repeated} | {r.recover_s} | "
                     f"{r.median_step_s} | {last} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    own, base = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--faults", default=",".join(name for name, f in FAULTS.items() if not f.gpu_only))
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--fault-after", type=int, default=2, help="inject once this step has trained")
    parser.add_argument("--stop-seconds", type=float, default=60.0, help="sigstop-engine: how long it stays stopped")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds a run may take, fault included")
    parser.add_argument("--batch-size", type=int, default=32, help="the run's --rollout-batch-size when not in the flags")
    args = parser.parse_args(own)
    unknown = [name for name in args.faults.split(",") if name not in FAULTS]
    if unknown:
        parser.error(f"--faults: unknown {unknown}; choose from {', '.join(FAULTS)}")
    # The step a fault hits must be followed by one trained once the target is back (recover_s).
    short = [name for name in args.faults.split(",") if FAULTS[name].trigger
             and args.steps < args.fault_after + (2 if FAULTS[name].trigger == "sync" else 1)]
    if short:
        parser.error(f"--steps {args.steps} leaves no step to train after {', '.join(short)} with --fault-after "
                     f"{args.fault_after}: a sync fault needs --steps of at least --fault-after + 2, others + 1")
    if "--prompt-data" not in base:
        parser.error("the train flags after -- must give --prompt-data (the expected prompts are read from it)")
    args.data = Path(base[base.index("--prompt-data") + 1])
    args.out.mkdir(parents=True, exist_ok=True)
    rows: list[Row] = []
    baseline = None
    for name in args.faults.split(","):
        row = run_fault(name, args, base, baseline)
        if name == "none":
            baseline = row.median_step_s
        rows.append(row)
        with open(args.out / "chaos.jsonl", "a") as handle:
            handle.write(json.dumps(asdict(row)) + "\n")
        print(table(rows[-1:]).splitlines()[-1], flush=True)
    (args.out / "chaos.md").write_text(table(rows) + "\n")
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
