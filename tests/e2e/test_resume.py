"""End-to-end: a fully-async run SIGKILLed after a checkpoint resumes with `--load` and loses nothing.

Run A (`slime-async train`, CPU engine + Megatron CPU trainer, 6 steps, a checkpoint every 2)
is killed with SIGKILL as soon as its step-2 checkpoint exists, while generation and step 3
are in flight. Run B resumes from it and trains steps 3 to 6. Across the crash every prompt
the data cursor has passed is accounted for exactly once: trained by A, trained by B, or still
buffered or pending in B's final checkpoint, in the dataset's own order.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from actors.rollout.data import PromptDataset
from slime_async.tiny_model import build_tiny_model

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
        sys.executable, "-m", "slime_async.cli", "train",
        "--hf-checkpoint", str(model), "--prompt-data", str(data), "--run-dir", str(root / name),
        "--train-mode", "fully-async", "--buffer-capacity", "4",
        "--rollout-batch-size", str(GROUPS_PER_STEP), "--n-samples-per-prompt", "2",
        "--num-rollout", str(STEPS), "--rollout-max-response-len", "64", "--rm-type", "exact",
        "--custom-generate-function-path", "resume_generate:long_generate",
        "--engine-type", "cpu", "--micro-batch-size", "4", "--lr", "1e-3",
        "--save", str(root / "save"), "--save-interval", str(SAVE_INTERVAL),
        "--save-debug-rollout-data", str(root / f"dump-{name}"), "--no-progress-bar", *extra,
    ]


def processes_mentioning(text: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if text in (entry / "cmdline").read_bytes().decode(errors="replace"):
                    found.append(int(entry.name))
            except OSError:
                pass
    return found


def trained_groups(dump: Path, steps: range) -> list[list[dict]]:
    return [json.loads(line) for step in steps for line in (dump / f"step_{step:06d}.jsonl").read_text().splitlines()]


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

    with open(root / "run-a.log", "wb") as log:
        crashed = subprocess.Popen(train_argv(root, model, data, "a"), stdout=log, stderr=subprocess.STDOUT,
                                   cwd=root, env=env, start_new_session=True)
    deadline = time.monotonic() + 400
    while not (save / "latest").is_file():
        assert crashed.poll() is None, (root / "run-a.log").read_text()[-4000:]
        assert time.monotonic() < deadline, "run A wrote no checkpoint in time"
        time.sleep(0.1)
    os.killpg(crashed.pid, signal.SIGKILL)
    crashed.wait()
    latest = (save / "latest").read_text()
    deadline = time.monotonic() + 30
    while (left := processes_mentioning(str(root))) and time.monotonic() < deadline:
        time.sleep(0.5)

    resumed = subprocess.run(train_argv(root, model, data, "b", "--load", str(save)),
                             capture_output=True, text=True, timeout=600, cwd=root, env=env)
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    metrics = [json.loads(line) for line in (root / "b" / "metrics.jsonl").read_text().splitlines()]
    return {"root": root, "order": order, "never_ends": never_ends, "save": save, "latest": latest, "left": left,
            "metrics": [m for m in metrics if "train/version" in m]}


def test_a_sigkilled_run_leaves_no_engine_or_trainer_behind(crash_and_resume):
    assert crash_and_resume["left"] == []


def test_the_resumed_run_continues_at_the_checkpointed_step_and_version(crash_and_resume):
    assert crash_and_resume["latest"] == f"step_{SAVE_INTERVAL:06d}"
    steps = crash_and_resume["metrics"]
    assert [m["step"] for m in steps] == list(range(SAVE_INTERVAL + 1, STEPS + 1))
    assert [m["train/version"] for m in steps] == [float(v) for v in range(SAVE_INTERVAL + 1, STEPS + 1)]


def test_every_prompt_passed_by_the_cursor_is_trained_or_held_exactly_once(crash_and_resume):
    root, save = crash_and_resume["root"], crash_and_resume["save"]
    trained = [g[0]["prompt"] for g in trained_groups(root / "dump-a", range(1, SAVE_INTERVAL + 1))]
    trained += [g[0]["prompt"] for g in trained_groups(root / "dump-b", range(SAVE_INTERVAL + 1, STEPS + 1))]
    final = run_state(save, STEPS)
    buffered, pending = held_prompts(final)
    accounted = trained + buffered + pending
    assert len(accounted) == len(set(accounted)), "a prompt was repeated across the crash"
    assert final["buffer"]["dropped_stale_groups"] == 0  # no staleness bound: nothing may be dropped

    cursor = final["rollout"]["dataset"]
    assert cursor["epoch"] == 0
    assert sorted(accounted) == sorted(crash_and_resume["order"][: cursor["position"]]), "a prompt was skipped"


def test_a_group_in_flight_at_the_crash_is_generated_again_after_it(crash_and_resume):
    never_ends = crash_and_resume["never_ends"]
    assert held_prompts(run_state(crash_and_resume["save"], SAVE_INTERVAL))[1] == [never_ends]
    assert held_prompts(run_state(crash_and_resume["save"], STEPS))[1] == [never_ends]


def test_groups_buffered_at_the_crash_are_trained_after_it_as_they_were_generated(crash_and_resume):
    root = crash_and_resume["root"]
    checkpointed = run_state(crash_and_resume["save"], SAVE_INTERVAL)["buffer"]["groups"]
    trained_after = {g[0]["prompt"]: g for g in trained_groups(root / "dump-b", range(SAVE_INTERVAL + 1, STEPS + 1))}
    assert checkpointed, "nothing was buffered at the crash"
    for group in checkpointed:  # at most --buffer-capacity 4 groups, and B trains 8: all of them
        kept = trained_after[group[0]["prompt"]]
        assert [s["tokens"] for s in kept] == [s["tokens"] for s in group]
        assert [s["token_versions"] for s in kept] == [s["token_versions"] for s in group]


def test_the_engines_of_the_resumed_run_serve_the_checkpointed_weights(crash_and_resume):
    root = crash_and_resume["root"]
    checkpointed = {g[0]["prompt"] for g in run_state(crash_and_resume["save"], SAVE_INTERVAL)["buffer"]["groups"]}
    generated_after = [s for g in trained_groups(root / "dump-b", range(SAVE_INTERVAL + 1, STEPS + 1))
                       if g[0]["prompt"] not in checkpointed for s in g]
    # A fresh engine serves the HF checkpoint as version 0; B must sync the resumed weights first.
    assert generated_after
    assert all(min(s["token_versions"]) >= SAVE_INTERVAL for s in generated_after)
