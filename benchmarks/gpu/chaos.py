"""Chaos against a real run's engine and trainer, one fault per run (issue #29 item 1).

Each fault is one `slime-async train` run (sync mode, prompts in file order: the trained prompts
are exactly the first steps x rollout-batch-size rows unless one was lost), into which the fault is
injected once step ``--fault-after`` has trained:

| fault | when | what |
|---|---|---|
| none | - | the baseline: step time without a fault |
| kill9-engine-generating | the engine reports running requests | SIGKILL of the engine's process group |
| kill9-engine-disk-update | a disk weight sync begins (engines paused) | SIGKILL of the engine |
| kill9-engine-tensor-update | an IPC-handle sync begins (GPU: CUDA IPC, trainer and engine on one GPU; CPU: shared memory) | SIGKILL of the engine |
| kill9-engine-paused-in-place | an in_place sync begins (requests paused with their KV) | SIGKILL of the engine |
| sigstop-engine | the engine reports running requests | SIGSTOP for --stop-seconds, then SIGCONT |
| kill9-trainer-rank-update | a weight sync begins | SIGKILL of trainer rank 0 (the run saves every step) |
| restart-external-engine | step fault-after has trained | SIGKILL of the driver's external engine, restarted on its port |

A weight-update fault hits the sync of step fault-after + 1, which the run holds, its engines paused,
until the fault is in (--debug-hold-weight-sync; see inject()).

A row per fault (markdown, and JSON lines beside it): the outcome (completes / resumes from its
checkpoint / fails, with the run's last line), prompts lost (among the first steps x batch rows,
never trained) and repeated (trained in more than one group), and the seconds from the fault to the
first step that could only be trained with the target back (see run_fault), beside the baseline's
median step time. The same logic runs against
the CPU engine (tests/benchmarks/test_chaos_driver.py) and against SGLang (benchmarks/gpu/chaos.sh).

Rows accumulate in OUT/chaos.jsonl over invocations (faults split over several device calls): the
table OUT/chaos.md holds every row so far. ``--deadline-s`` is the time this invocation may take:
a run still going then is stopped whole and its row says it was cut; a fault is not started with
less than ``--min-fault-s`` left. Trees an earlier, killed invocation left running are ended first.

    python -m benchmarks.gpu.chaos --out OUT --faults none,kill9-engine-disk-update -- TRAIN FLAGS...
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
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

from benchmarks.gpu.chaos_external import ExternalEngine, split_engine_flags
from benchmarks.gpu.chaos_procs import Tree, reap

# The weight sync's line once --debug-hold-weight-sync holds it, its engines paused (actors/weight_sync/actor.py).
SYNC_HELD = "weight sync v{version}: held until"
ENGINES = re.compile(r"engines \(\w+\): (\S+)")
ENGINE_PROCESS = ("actors.engine.cpu", "sglang.launch_server")


@dataclass(frozen=True)
class Fault:
    trigger: str  # "" (none) | "trained" (step fault-after's row is in) | "generating" | "sync"
    target: str = ""  # "engine" | "rank" | "external" (an engine the driver starts)
    action: str = "kill9"  # "kill9" | "stop" | "restart" (kill9, then start it again on its port)
    flags: tuple[str, ...] = ()


FAULTS = {
    "none": Fault(""),
    "kill9-engine-generating": Fault("generating", "engine"),
    "kill9-engine-disk-update": Fault("sync", "engine", flags=("--update-weight-transport", "disk")),
    "kill9-engine-tensor-update": Fault("sync", "engine", flags=("--update-weight-transport", "tensor")),
    "kill9-engine-paused-in-place": Fault("sync", "engine", flags=("--weight-update-mode", "in_place")),
    "sigstop-engine": Fault("generating", "engine", action="stop"),
    "kill9-trainer-rank-update": Fault("sync", "rank", flags=("--save", "{run}/save", "--save-interval", "1")),
    # Not "generating": the tiny CPU run's generation is over in a fraction of a second, and a driver
    # polling the engine's load can miss every one; the next step's generation needs the engine anyway.
    "restart-external-engine": Fault("trained", "external", action="restart"),
}
# What a fault's run leaves that is large and read by nothing after its row: checkpoints, weight exports.
BULKY = ("save", "weights")


class Cut(BaseException):
    """SIGTERM to the driver (the call's own time limit): stop the fault's run, keep its row."""


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

    def __init__(self, run_dir: Path, argv: list[str], env: dict[str, str], registry: Path):
        self.run_dir, self.log_path = run_dir, run_dir.with_suffix(".log")
        run_dir.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen([sys.executable, "-m", "actors.loop.cli", "train", "--run-dir",
                                             str(run_dir), "--no-progress-bar", *argv], stdout=log,
                                            stderr=subprocess.STDOUT, env=env, start_new_session=True)
        self.tree = Tree(self.process, registry)
        self.step_times: dict[int, float] = {}  # step -> when its metrics row was first seen
        self.consumed_groups: int | None = None  # the buffer's count at the last metrics row

    def poll(self) -> None:
        self.tree.track()
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
            if "buffer/consumed_groups" in row:
                self.consumed_groups = int(row["buffer/consumed_groups"])

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
        """The run and every process it started, gone (GPU memory back) before the next fault."""
        self.tree.stop()


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
           hold: Path | None = None, external: ExternalEngine | None = None) -> tuple[float, int]:
    """Wait for the fault's moment, inject it; (when, the last step trained before it).

    A sync fault's moment does not race the run: the run holds that sync, engines paused, until
    the fault is in (``hold``, --debug-hold-weight-sync); an in-place sync of a small model is
    over in tens of milliseconds, less than a log-watching driver may take to notice it."""
    if fault.trigger in ("generating", "trained"):
        wait_for(run, lambda: max(run.step_times, default=0) >= after, deadline, f"trained step {after}")
    if fault.trigger == "generating":
        url = engine_url(run)
        wait_for(run, lambda: running_requests(url) > 0, deadline, "a request running on the engine")
    elif fault.trigger == "sync":
        held = SYNC_HELD.format(version=after + 1)
        wait_for(run, lambda: held in run.log(), deadline, f"weight sync v{after + 1} held")
    if fault.target == "external":
        assert external is not None
        when = time.monotonic()
        external.kill9()  # the server and its schedulers, every one gone
        step = last_step(run)
        external.start()  # the same port: to the run, the engine it knows with other weights
        return when, step
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
            # b"\n" only: str.splitlines also cuts at U+2028 and U+0085, which orjson leaves raw
            # inside a generated response (a random model's bytes), and the group would count as lost.
            for line in path.read_bytes().split(b"\n"):
                try:
                    groups = json.loads(line)
                except json.JSONDecodeError:  # the last line of a run stopped while it wrote it
                    continue
                prompts += list({sample["prompt"] if isinstance(sample["prompt"], str) else json.dumps(sample["prompt"])
                                 for sample in groups})  # one entry per group
    return prompts


def row_numbers(expected: list[str], prompts: set[str], most: int = 10) -> str:
    """The data rows (0-based) of ``prompts``, the first ``most`` of them: which prompts to look for."""
    rows = [i for i, prompt in enumerate(expected) if prompt in prompts]
    return ", ".join(map(str, rows[:most])) + (f" and {len(rows) - most} more" if len(rows) > most else "")


def expected_prompts(data: Path, count: int) -> list[str]:
    rows = [json.loads(line) for line in data.read_text().splitlines() if line.strip()]
    return [row["prompt"] if isinstance(row["prompt"], str) else json.dumps(row["prompt"]) for row in rows[:count]]


def flag_value(argv: list[str], name: str) -> str | None:
    """The value of ``name`` in train flags: the last one given wins, as in the run's own parser."""
    values = [argv[i + 1] for i, token in enumerate(argv[:-1]) if token == name]
    return values[-1] if values else None


def keep_child_logs(run_dir: Path, into: Path, limit: int = 200_000) -> None:
    """The tail of every log the run's children wrote (engine, torchrun), beside the run's own, and
    the run's metrics (its counters say where a lost prompt went: failed groups, stale drops)."""
    for path in [*sorted((run_dir / "logs").glob("*.log")), run_dir / "metrics.jsonl"]:
        if not path.is_file():
            continue
        into.mkdir(parents=True, exist_ok=True)
        data = path.read_bytes()
        (into / path.name).write_bytes(data[-limit:])


def run_fault(name: str, args: argparse.Namespace, base: list[str], baseline_step_s: float | None) -> Row:
    fault, row = FAULTS[name], Row(name, median_step_s=baseline_step_s)
    runs = args.out / "runs"
    run_dir, dump, hold_dir = runs / name, runs / f"{name}-dump", runs / f"{name}-hold"
    for old in (run_dir, dump, hold_dir):  # an earlier attempt's, from another invocation
        shutil.rmtree(old, ignore_errors=True)
    flags = [flag.replace("{run}", str(run_dir)) for flag in fault.flags]
    hold = None
    if fault.trigger == "sync":
        hold = hold_file(hold_dir, args.fault_after)
        hold.parent.mkdir(parents=True, exist_ok=True)
        hold.touch()
        flags += ["--debug-hold-weight-sync", str(hold.parent)]
    started = time.monotonic()
    own_limit = started + args.timeout <= args.deadline
    deadline = min(started + args.timeout, args.deadline)
    run, external, fault_at, cut = None, None, None, ""
    train = base
    try:
        if fault.target == "external":
            train, sglang_flags = split_engine_flags(base)
            external = ExternalEngine(args.external_engine, flag_value(base, "--hf-checkpoint") or "",
                                      args.out / f"{name}.engine.log", sglang_flags, args.registry)
            (args.out / f"{name}.engine.log").unlink(missing_ok=True)
            external.start()
            external.wait_ready(deadline)
            train = [*train, "--engine-type", "external", "--rollout-external-engine-addrs", external.url]
        argv = [*train, "--train-mode", "sync", "--no-rollout-shuffle", "--num-rollout", str(args.steps),
                "--save-debug-rollout-data", str(dump), *flags]
        run = Run(run_dir, argv, {**os.environ}, args.registry)
        if fault.trigger:
            fault_at, row.injected_at_step = inject(run, fault, args.fault_after, args.stop_seconds, deadline, hold,
                                                    external)
        while run.alive() and time.monotonic() < deadline:
            run.poll()
            time.sleep(0.2)
        if run.alive():
            cut = (f"--timeout {args.timeout:g} s" if own_limit else "--deadline-s") + \
                f" reached {time.monotonic() - started:.0f} s into the run"
    except RuntimeError as error:
        if time.monotonic() >= deadline:
            cut = f"{'--timeout' if own_limit else '--deadline-s'} reached: {error}"
        else:
            row.notes.append(str(error))
    except Cut:
        cut = f"the driver was stopped (SIGTERM) {time.monotonic() - started:.0f} s into the run"
    finally:
        if run is not None:
            run.stop()
            run.poll()
        if hold is not None:
            hold.unlink(missing_ok=True)
        if external is not None:
            external.stop()
    if cut:
        row.notes.append(f"cut: {cut}")
    if run is None:
        row.outcome = "cut" if cut else "fails"
        return row
    log = run.log()
    # The logs first: whatever the row's analysis meets, the run's own account is kept.
    (args.out / f"{name}.log").write_text(log[-200_000:])
    keep_child_logs(run_dir, args.out / "logs" / name)
    row.exit_code = run.process.returncode
    row.steps_trained = len(run.step_times)
    row.last_line = (log.strip().splitlines() or [""])[-1][:300]
    restarted = "restart 1 of" in log
    row.outcome = ("cut" if cut else "fails" if row.exit_code != 0 else
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
        if not after and row.exit_code == 0:
            row.notes.append(f"no recovery to measure: no step from {first} on was trained after the fault")
    elif len(times) > 2:
        row.median_step_s = round(statistics.median(b - a for (_, a), (_, b) in zip(times[1:], times[2:])), 2)
    batch = int(flag_value(base, "--rollout-batch-size") or args.batch_size)
    trained = trained_prompts(dump, args.steps)
    expected = expected_prompts(args.data, args.steps * batch)
    counts, lost = Counter(trained), set(expected) - set(trained)
    row.prompts_repeated = sum(n - 1 for n in counts.values() if n > 1)
    row.prompts_lost = len(lost) if row.exit_code == 0 else None
    if row.prompts_lost:
        row.notes.append(f"lost rows {row_numbers(expected, lost)}")
    if row.prompts_repeated:
        row.notes.append(f"repeated rows {row_numbers(expected, {p for p, n in counts.items() if n > 1})}")
    if run.consumed_groups is not None and run.consumed_groups != len(trained):
        # The run's own count beside the dump's: a disagreement is the driver's to explain, not a loss.
        row.notes.append(f"the dump holds {len(trained)} groups, the run's metrics {run.consumed_groups}")
    if row.exit_code is not None and row.exit_code < 0 and not cut:
        row.notes.append(f"killed by signal {-row.exit_code}")
    for bulky in BULKY:
        shutil.rmtree(run_dir / bulky, ignore_errors=True)
    return row


def latest(rows: list[Row]) -> list[Row]:
    """Each fault's last row, in the order the faults first appear: a fault run again (its first
    attempt cut) shows once, as it went the last time."""
    last: dict[str, Row] = {}
    for row in rows:
        last[row.fault] = row  # a dict keeps a key's first position
    return list(last.values())


def _cell(value: float | None) -> str:
    return "—" if value is None else str(value)  # a run with no fault has no recovery to time


def table(rows: list[Row]) -> str:
    head = "| fault | outcome | steps | prompts lost | prompts repeated | recover (s) | baseline step (s) | last line |"
    lines = [head, "|" + "---|" * 8]
    for r in rows:
        last = r.last_line.replace("|", "\\|") if r.outcome == "fails" else ""
        lines.append(f"| {r.fault} | {r.outcome}{' (' + '; '.join(r.notes) + ')' if r.notes else ''} | "
                     f"{r.steps_trained} | {r.prompts_lost} | {r.prompts_repeated} | {_cell(r.recover_s)} | "
                     f"{_cell(r.median_step_s)} | {last} |")
    return "\n".join(lines)


def read_rows(path: Path) -> list[Row]:
    """The rows earlier invocations appended (a field this version lacks is left out)."""
    known = set(Row.__dataclass_fields__)
    rows = []
    if path.is_file():
        for line in path.read_text().splitlines():
            if line.strip():
                rows.append(Row(**{k: v for k, v in json.loads(line).items() if k in known}))
    return rows


def _cut(signum, frame) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # once: the stop that follows must not be cut itself
    raise Cut


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    own, base = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="rows, table and logs; rows accumulate here")
    parser.add_argument("--faults", default=",".join(FAULTS))
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--fault-after", type=int, default=2, help="inject once this step has trained")
    parser.add_argument("--stop-seconds", type=float, default=60.0, help="sigstop-engine: how long it stays stopped")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds a run may take, fault included")
    parser.add_argument("--deadline-s", type=float, default=0.0,
                        help="seconds this invocation may take (0: no limit); a run going then is cut, its row says so")
    parser.add_argument("--min-fault-s", type=float, default=60.0,
                        help="a fault is not started with fewer seconds than this left before --deadline-s")
    parser.add_argument("--external-engine", choices=("cpu", "sglang"), default="cpu",
                        help="restart-external-engine: the server the driver starts (the CPU engine or SGLang, "
                             "launched with the train flags' --sglang-* flags)")
    parser.add_argument("--skip-done", action="store_true",
                        help="leave out faults whose last row in OUT/chaos.jsonl is not cut: the same command, "
                             "repeated, runs what is left")
    parser.add_argument("--batch-size", type=int, default=32, help="the run's --rollout-batch-size when not in the flags")
    args = parser.parse_args(own)
    faults = args.faults.split(",")
    unknown = [name for name in faults if name not in FAULTS]
    if unknown:
        parser.error(f"--faults: unknown {unknown}; choose from {', '.join(FAULTS)}")
    # The step a fault hits must be followed by one trained once the target is back (recover_s).
    short = [name for name in faults if FAULTS[name].trigger
             and args.steps < args.fault_after + (2 if FAULTS[name].trigger == "sync" else 1)]
    if short:
        parser.error(f"--steps {args.steps} leaves no step to train after {', '.join(short)} with --fault-after "
                     f"{args.fault_after}: a sync fault needs --steps of at least --fault-after + 2, others + 1")
    if "--prompt-data" not in base:
        parser.error("the train flags after -- must give --prompt-data (the expected prompts are read from it)")
    if "restart-external-engine" in faults and flag_value(base, "--hf-checkpoint") is None:
        parser.error("restart-external-engine: the train flags after -- must give --hf-checkpoint (the model the "
                     "external engine serves)")
    args.data = Path(flag_value(base, "--prompt-data") or "")
    args.deadline = time.monotonic() + args.deadline_s if args.deadline_s > 0 else float("inf")
    args.out.mkdir(parents=True, exist_ok=True)
    args.registry = args.out / "running.json"
    for left in reap(args.registry):
        print(f"ended a process tree an earlier invocation left running: {left}", flush=True)
    rows = read_rows(args.out / "chaos.jsonl")
    baseline = next((r.median_step_s for r in reversed(rows) if r.fault == "none"), None)
    if args.skip_done:
        done = {r.fault for r in latest(rows) if r.outcome != "cut"}
        if done & set(faults):
            print(f"in the table already (--skip-done): {','.join(f for f in faults if f in done)}", flush=True)
        faults = [f for f in faults if f not in done]
    signal.signal(signal.SIGTERM, _cut)
    try:
        for i, name in enumerate(faults):
            left = args.deadline - time.monotonic()
            if left < args.min_fault_s:
                rest = ",".join(faults[i:])
                print(f"not started, {left:.0f} s left (--min-fault-s {args.min_fault_s:g}): FAULTS={rest}",
                      flush=True)
                break
            row = run_fault(name, args, base, baseline)
            if name == "none" and row.outcome == "completes":
                baseline = row.median_step_s
            rows.append(row)
            with open(args.out / "chaos.jsonl", "a") as handle:
                handle.write(json.dumps(asdict(row)) + "\n")
            (args.out / "chaos.md").write_text(table(latest(rows)) + "\n")
            print(table(rows[-1:]).splitlines()[-1], flush=True)
            if any(note.startswith("cut: the driver was stopped") for note in row.notes):
                return 1
    except Cut:
        print("stopped (SIGTERM)", flush=True)
        for left in reap(args.registry):  # a stop the SIGTERM itself interrupted
            print(f"ended {left}", flush=True)
        return 1
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    print(table(latest(rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
