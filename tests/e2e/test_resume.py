"""End-to-end: crashes after a checkpoint lose nothing — by hand (`--load`) and by the run itself.

Run A (`slime-async train`, CPU engine + Megatron CPU trainer, fully-async, 6 steps, a checkpoint
every 2) has its supervisor SIGKILLed (alone: what it started must die by itself) as soon as its
step-2 checkpoint exists, while generation and step 3 are in flight. Run B resumes it with `--load`. After B's step-4 checkpoint its trainer rank is
SIGKILLed: B restarts itself from that checkpoint (`--max-run-restarts`) and trains to step 6.
Across both crashes every prompt the data cursor has passed is accounted for exactly once:
trained, or still buffered or pending in the final checkpoint, in the dataset's own order.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from transformers import AutoTokenizer

from actors.loop.debug_dump import read_groups
from actors.rollout.data import PromptDataset
from examples.models.tiny import build_tiny_model

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "chaos"))
from process_tree import DescendantTracker  # noqa: E402 - the chaos suite's tracker, shared

# The module's fixture runs two whole runs: more than pytest's default 300 s on a busy machine.
pytestmark = pytest.mark.timeout(900)

STEPS, SAVE_INTERVAL, GROUPS_PER_STEP = 6, 2, 2

# Full-length generations, so generation runs while the checkpoint is taken; and one episode
# that never ends (a tool that hangs, say), so there is always a group in flight to checkpoint.
GENERATE_MODULE = """
import asyncio

from actors.rollout.generate import default_generate

NEVER_ENDS = {never_ends!r}

async def long_generate(ctx, sample, sampling_params):
    if sample.prompt == NEVER_ENDS:
        await asyncio.Event().wait()
    return await default_generate(ctx, sample, {{**sampling_params, "ignore_eos": True}})
"""


def train_argv(root: Path, model: Path, data: Path, name: str, *extra: str) -> list[str]:
    return [
        sys.executable, "-m", "actors.loop.cli", "train",
        "--hf-checkpoint", str(model), "--prompt-data", str(data), "--run-dir", str(root / name),
        "--train-mode", "fully-async", "--buffer-capacity", "4",
        "--rollout-batch-size", str(GROUPS_PER_STEP), "--n-samples-per-prompt", "2",
        "--num-rollout", str(STEPS), "--rollout-max-response-len", "64", "--rm-type", "exact",
        "--custom-generate-function-path", "resume_generate:long_generate",
        "--engine-type", "cpu", "--micro-batch-size", "4", "--lr", "1e-3",
        "--save", str(root / "save"), "--save-interval", str(SAVE_INTERVAL),
        "--save-debug-rollout-data", str(root / f"dump-{name}"), "--no-progress-bar", *extra,
    ]


def is_trainer_rank(cmdline: str) -> bool:
    return "actors.trainer.worker" in cmdline and "torch.distributed.run" not in cmdline


def start_run(argv: list[str], log_path: Path, env: dict) -> tuple[subprocess.Popen, DescendantTracker]:
    """The run, and a tracker recording every process it starts while it lives (every 0.2 s)."""
    with open(log_path, "wb") as log:
        run = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=log_path.parent, env=env,
                               start_new_session=True)
    return run, DescendantTracker(run.pid)


def wait_for_checkpoint(save: Path, step: int, run: subprocess.Popen, log_path: Path) -> None:
    deadline = time.monotonic() + 400
    latest = save / "latest"
    while not (latest.is_file() and latest.read_text() == f"step_{step:06d}"):
        assert run.poll() is None, log_path.read_text()[-4000:]
        assert time.monotonic() < deadline, f"no step-{step} checkpoint in time"
        time.sleep(0.1)


def trained_groups(dump: Path, steps: range) -> list[list[dict]]:
    return [group for step in steps for group in read_groups(dump / f"step_{step:06d}.jsonl")]


def run_state(save: Path, step: int) -> dict:
    return json.loads((save / f"step_{step:06d}" / "run_state.json").read_text())


def held_prompts(state: dict) -> tuple[list[str], list[str]]:
    """(prompts of the buffered groups, prompts pending in the rollout) of a checkpoint."""
    buffered = [group[0]["prompt"] for group in state["buffer"]["groups"]]
    pending = [p["prompt"]["prompt"] for p in state["rollout"]["pending_prompts"]]
    return buffered, pending


@pytest.fixture(scope="module")
def crash_and_resume(tmp_path_factory):
    root = tmp_path_factory.mktemp("e2e-resume")
    model = build_tiny_model(root / "model", arch="qwen2", seed=3)
    data = root / "prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{a}*3=", "label": str(3 * a)}) + "\n" for a in range(24)))
    dataset = PromptDataset(data, AutoTokenizer.from_pretrained(model))  # the run's defaults: its order
    order = [dataset.next_prompt().prompt for _ in range(len(dataset))]
    never_ends = order[2]  # started before the step-2 checkpoint, in both runs
    (root / "resume_generate.py").write_text(GENERATE_MODULE.format(never_ends=never_ends))
    save = root / "save"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}

    crashed, tracker_a = start_run(train_argv(root, model, data, "a"), root / "run-a.log", env)
    wait_for_checkpoint(save, SAVE_INTERVAL, crashed, root / "run-a.log")
    tracker_a.scan()
    helpers_a = checkpoint_helpers(tracker_a)
    # The supervisor alone (not its group): every descendant, the checkpoint writer's helpers
    # included, dies by a parent-death signal or its own parent watch (1 s), so within 10 s.
    os.kill(crashed.pid, signal.SIGKILL)
    crashed.wait()
    latest = (save / "latest").read_text()
    recorded_a, left_a = tracker_a.recorded(), tracker_a.wait_all_gone(10)
    tracker_a.stop()

    resumed, tracker_b = start_run(train_argv(root, model, data, "b", "--load", str(save)), root / "run-b.log", env)
    wait_for_checkpoint(save, 2 * SAVE_INTERVAL, resumed, root / "run-b.log")
    tracker_b.scan()
    ranks = [r.pid for r in tracker_b.recorded() if is_trainer_rank(r.cmdline) and r.alive()]
    assert ranks, "no trainer rank of run B found"
    # The processes the ranks started (megatron's checkpoint writer: a Manager, a resource tracker):
    # they must go too when their rank is killed.
    helpers = checkpoint_helpers(tracker_b)
    os.kill(ranks[0], signal.SIGKILL)
    assert resumed.wait(timeout=600) == 0, (root / "run-b.log").read_text()[-4000:]
    recorded_b, left_b = tracker_b.recorded(), tracker_b.wait_all_gone(10)
    tracker_b.stop()
    for tracker in (tracker_a, tracker_b):
        tracker.kill_survivors()  # so a failing check leaves nothing to the rest of the suite
    metrics = [json.loads(line) for line in (root / "b" / "metrics.jsonl").read_text().splitlines()]
    return {"root": root, "order": order, "never_ends": never_ends, "save": save, "latest": latest,
            "recorded": {"a": recorded_a, "b": recorded_b}, "left": {"a": left_a, "b": left_b},
            "helpers": {"a": helpers_a, "b": helpers},
            "log_b": (root / "run-b.log").read_text(), "metrics": [m for m in metrics if "train/version" in m]}


def test_no_process_a_run_started_outlives_a_kill_9_of_the_run_or_of_its_trainer_rank(crash_and_resume):
    # Every descendant recorded while the runs lived: engine, torchrun, ranks, checkpoint helpers.
    recorded = crash_and_resume["recorded"]
    assert any(is_trainer_rank(r.cmdline) for r in recorded["a"]) and any("actors.engine" in r.cmdline for r in recorded["a"])
    helpers = crash_and_resume["helpers"]
    assert helpers["a"] and helpers["b"], "the checkpoint writer started no helper process: nothing to test"
    assert crash_and_resume["left"] == {"a": [], "b": []}


def _parent(pid: int) -> int | None:
    try:
        return psutil.Process(pid).ppid()
    except psutil.Error:
        return None


def checkpoint_helpers(tracker: DescendantTracker) -> list:
    """The live processes the trainer ranks started (megatron's checkpoint writer: a Manager, a resource tracker)."""
    ranks = {r.pid for r in tracker.recorded() if is_trainer_rank(r.cmdline) and r.alive()}
    return [r for r in tracker.recorded() if r.alive() and _parent(r.pid) in ranks]


def test_the_resumed_run_continues_at_the_checkpointed_step_and_version(crash_and_resume):
    assert crash_and_resume["latest"] == f"step_{SAVE_INTERVAL:06d}"
    first_attempt = [m for m in crash_and_resume["metrics"] if m["run/restarts"] == 0]
    assert [m["step"] for m in first_attempt][:2] == [3, 4]
    assert [m["train/version"] for m in first_attempt][:2] == [3.0, 4.0]


def test_a_run_whose_trainer_rank_dies_restarts_itself_from_its_latest_checkpoint(crash_and_resume):
    restarted = [m for m in crash_and_resume["metrics"] if m["run/restarts"] == 1]
    assert [m["step"] for m in restarted] == [5, 6]
    assert [m["train/version"] for m in restarted] == [5.0, 6.0]
    assert "trainer rank 0" in crash_and_resume["log_b"]
    assert "restart 1 of 3 from" in crash_and_resume["log_b"]


def test_every_prompt_passed_by_the_cursor_is_trained_or_held_exactly_once(crash_and_resume):
    root, save = crash_and_resume["root"], crash_and_resume["save"]
    # A step's dump is rewritten when a restart trains it again: each file is the surviving history.
    trained = [g[0]["prompt"] for g in trained_groups(root / "dump-a", range(1, SAVE_INTERVAL + 1))]
    trained += [g[0]["prompt"] for g in trained_groups(root / "dump-b", range(SAVE_INTERVAL + 1, STEPS + 1))]
    final = run_state(save, STEPS)
    buffered, pending = held_prompts(final)
    accounted = trained + buffered + pending
    assert len(accounted) == len(set(accounted)), "a prompt was repeated across the crashes"
    assert final["buffer"]["dropped_stale_groups"] == 0  # no staleness bound: nothing may be dropped
    cursor = final["rollout"]["dataset"]
    assert cursor["epoch"] == 0
    assert sorted(accounted) == sorted(crash_and_resume["order"][: cursor["position"]]), "a prompt was skipped"


@pytest.mark.parametrize("crash_step", [SAVE_INTERVAL, 2 * SAVE_INTERVAL])
def test_a_group_in_flight_at_a_crash_is_generated_again_after_it(crash_and_resume, crash_step):
    assert held_prompts(run_state(crash_and_resume["save"], crash_step))[1] == [crash_and_resume["never_ends"]]


@pytest.mark.parametrize("crash_step", [SAVE_INTERVAL, 2 * SAVE_INTERVAL])
def test_groups_buffered_at_a_crash_are_trained_after_it_as_they_were_generated(crash_and_resume, crash_step):
    checkpointed = run_state(crash_and_resume["save"], crash_step)["buffer"]["groups"]
    trained_after = {g[0]["prompt"]: g for g in trained_groups(crash_and_resume["root"] / "dump-b",
                                                               range(crash_step + 1, STEPS + 1))}
    assert checkpointed, "nothing was buffered at the crash"
    for group in checkpointed:  # at most --buffer-capacity 4 groups, and at least 4 are trained after
        kept = trained_after[group[0]["prompt"]]
        assert [s["tokens"] for s in kept] == [s["tokens"] for s in group]
        assert [s["token_versions"] for s in kept] == [s["token_versions"] for s in group]


@pytest.mark.parametrize("crash_step", [SAVE_INTERVAL, 2 * SAVE_INTERVAL])
def test_the_engines_after_a_crash_serve_the_checkpointed_weights(crash_and_resume, crash_step):
    checkpointed = {g[0]["prompt"] for g in run_state(crash_and_resume["save"], crash_step)["buffer"]["groups"]}
    generated_after = [s for g in trained_groups(crash_and_resume["root"] / "dump-b", range(crash_step + 1, STEPS + 1))
                       if g[0]["prompt"] not in checkpointed for s in g]
    # A fresh engine serves the HF checkpoint as version 0; the run must sync the checkpoint's weights first.
    assert generated_after
    assert all(min(s["token_versions"]) >= crash_step for s in generated_after)
