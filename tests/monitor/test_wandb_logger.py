"""--use-wandb: the monitor's wandb run, offline (no network here), read back from the run's
.wandb file: the same metrics as metrics.jsonl at the same steps, the flags' project / group /
name, the run's config, a clean finish on a normal stop and a failed one when the monitor fails,
the same run continued when the run resumes; without wandb installed, or online without an API
key, one line at start."""

from __future__ import annotations

import json
import math
import sys

import pytest
import yaml

from actors.loop.cli import main
from actors.loop.launch import with_outcome
from actors.monitor import MonitorActor, MonitorConfig
from slime_async.actor import ActorFailed, spawn
from examples.models.tiny import build_tiny_model
from tests.monitor.wandb_records import history, run_config, run_files, the_record

pytestmark = pytest.mark.timeout(120)

# What the loop logs, in the order it can log it: an evaluation of step 1 finishing after the
# rollout of step 2 (wandb's own step would drop that row), NaN and inf, a value that is no number.
CALLS = [
    (0, {"eval/reward_mean": 0.25}),
    (1, {"rollout/reward_mean": 0.5, "train/loss": 1.5, "train/grad_norm": float("inf"), "buffer/size": 3}),
    (2, {"rollout/reward_mean": 0.75, "train/loss": float("nan"), "train/kl": float("-inf"), "perf/note": "n/a"}),
    (1, {"eval/reward_mean": 0.5}),
]


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_X_DISABLE_STATS", "true")  # no system-metrics sampler on 2 shared cores


async def run_monitor(run_dir, calls, config: MonitorConfig, **kwargs) -> None:
    ref = await spawn(MonitorActor(config, run_dir, **kwargs))
    for step, metrics in calls:
        ref.tell("log", step, metrics)
    await ref.ask("flush")
    await ref.stop()
    await ref.wait()


def jsonl_rows(path) -> list[dict]:
    return [{k: v for k, v in json.loads(line).items() if k != "time"} for line in path.read_text().splitlines()]


def finite_or_none(row: dict) -> dict:
    return {k: (v if math.isfinite(v) else None) for k, v in row.items()}


async def test_each_log_call_is_one_wandb_row_equal_to_its_metrics_jsonl_line(tmp_path):
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({"rollout": {"n_samples_per_prompt": 4}}))
    config = MonitorConfig(use_wandb=True, wandb_project="proj", wandb_group="grp", wandb_run_name="name")
    await run_monitor(tmp_path, CALLS, config)
    (path,) = run_files(tmp_path / "wandb")
    rows = history(path)
    assert [finite_or_none(row) for row in rows] == jsonl_rows(tmp_path / "metrics.jsonl")
    assert [row["step"] for row in rows] == [0, 1, 2, 1]
    # Non-finite values go to wandb as they are (as to TensorBoard); only metrics.jsonl nulls them.
    assert rows[1]["train/grad_norm"] == math.inf and math.isnan(rows[2]["train/loss"])
    assert rows[2]["train/kl"] == -math.inf and "perf/note" not in rows[2]
    run = the_record(path, "run")
    assert (run.project, run.run_group, run.display_name) == ("proj", "grp", "name")
    assert run_config(path) == {"rollout": {"n_samples_per_prompt": 4}}
    assert the_record(path, "exit").exit_code == 0


async def test_a_monitor_that_fails_finishes_its_wandb_run_as_failed(tmp_path):
    ref = await spawn(MonitorActor(MonitorConfig(use_wandb=True), tmp_path))
    ref.tell("log", 1, {"train/loss": 0.5})
    await ref.ask("flush")
    ref.actor.fail(RuntimeError("a component failed"))
    with pytest.raises(ActorFailed):
        await ref.wait()
    (path,) = run_files(tmp_path / "wandb")
    assert history(path) == [{"step": 1, "train/loss": 0.5}]
    assert the_record(path, "exit").exit_code == 1
    assert the_record(path, "run").display_name == tmp_path.name  # none given: the run directory's name


async def test_a_resumed_run_logs_to_the_wandb_run_it_logged_to_before_and_a_new_one_starts_a_new_run(tmp_path):
    config = MonitorConfig(use_wandb=True, wandb_dir=str(tmp_path / "shared"))
    await run_monitor(tmp_path / "run", [(1, {"train/loss": 0.5})], config)
    await run_monitor(tmp_path / "run", [(1, {"train/loss": 0.4})], config, resume_step=1)
    await run_monitor(tmp_path / "run", [(1, {"train/loss": 0.3})], config)
    first, resumed, new = run_files(tmp_path / "shared" / "wandb")
    assert the_record(resumed, "run").run_id == the_record(first, "run").run_id
    assert the_record(new, "run").run_id != the_record(first, "run").run_id
    assert history(resumed) == [{"step": 1, "train/loss": 0.4}]


@pytest.fixture(scope="module")
def train_argv(tmp_path_factory) -> list[str]:
    root = tmp_path_factory.mktemp("wandb-preflight")
    model = build_tiny_model(root / "model", arch="qwen2", seed=0)
    (root / "prompts.jsonl").write_text(json.dumps({"prompt": "1+1=", "label": "2"}) + "\n")
    return ["train", "--use-wandb", "--hf-checkpoint", str(model), "--prompt-data", str(root / "prompts.jsonl")]


def train_error(argv: list[str], capsys) -> str:
    """``slime-async train ARGV``'s stderr, which must be one line, with exit code 2."""
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    return err


def test_use_wandb_without_wandb_installed_is_one_line_and_exit_2_before_anything_starts(
        train_argv, tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` now fails as if not installed
    err = train_error(train_argv + ["--run-dir", str(tmp_path / "run")], capsys)
    assert err.startswith("slime-async train: error: monitor: --use-wandb needs the wandb package (")
    assert err.endswith("pip install 'slime-async[wandb]'\n")
    assert not (tmp_path / "run").exists()


def test_online_without_an_api_key_is_one_line_at_start(train_argv, tmp_path, monkeypatch, capsys):
    for name in ("WANDB_API_KEY", "WANDB_IDENTITY_TOKEN_FILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc, no wandb settings file
    monkeypatch.setenv("NETRC", str(tmp_path / "netrc"))
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "config"))
    monkeypatch.chdir(tmp_path)
    err = train_error(train_argv + ["--wandb-mode", "online", "--run-dir", str(tmp_path / "run")], capsys)
    assert err == ("slime-async train: error: monitor: --use-wandb: no wandb API key for online mode (set "
                   "WANDB_API_KEY or run `wandb login`), or log offline with --wandb-mode offline\n")
    assert not (tmp_path / "run").exists()


async def test_a_run_that_fails_elsewhere_finishes_its_wandb_run_with_the_runs_exit_code(tmp_path):
    # The launcher's with_outcome tells the monitor how the run ended before the tree stops: a
    # component's failure or a SIGTERM (work cancelled) is exit code 1 in wandb, not "finished".
    ref = await spawn(MonitorActor(MonitorConfig(use_wandb=True), tmp_path))
    ref.tell("log", 1, {"train/loss": 0.5})

    async def failing_loop() -> int:
        raise RuntimeError("the trainer failed")

    with pytest.raises(RuntimeError, match="the trainer failed"):
        await with_outcome(ref, failing_loop())
    await ref.stop()
    await ref.wait()
    (path,) = run_files(tmp_path / "wandb")
    assert the_record(path, "exit").exit_code == 1
