"""MonitorActor: TensorBoard event files, metrics.jsonl, console progress bar and summary."""

from __future__ import annotations

import io
import json
import logging
import math

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from actors.monitor import MonitorActor, MonitorConfig
from slime_async.actor import spawn


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def read_tb(tb_dir) -> EventAccumulator:
    acc = EventAccumulator(str(tb_dir))
    acc.Reload()
    return acc


def read_jsonl(path) -> list[dict]:
    def reject(constant: str):
        raise ValueError(f"{constant} is not valid JSON")

    return [json.loads(line, parse_constant=reject) for line in path.read_text().splitlines()]


async def run_monitor(run_dir, calls, config: MonitorConfig | None = None, **kwargs) -> None:
    """Start a monitor, send ``calls`` as ``log`` messages, stop it (which closes the files)."""
    ref = await spawn(MonitorActor(config or MonitorConfig(), run_dir, **kwargs))
    for step, metrics in calls:
        ref.tell("log", step, metrics)
    await ref.ask("flush")
    await ref.stop()
    await ref.wait()  # raises if the monitor failed


async def test_scalars_are_written_to_tensorboard_event_files(tmp_path):
    await run_monitor(tmp_path, [(0, {"rollout/reward_mean": 0.25}), (1, {"rollout/reward_mean": 0.5,
                                                                        "train/loss": 1.5})])
    acc = read_tb(tmp_path / "tb")
    assert [(e.step, e.value) for e in acc.Scalars("rollout/reward_mean")] == [(0, 0.25), (1, 0.5)]
    assert [(e.step, e.value) for e in acc.Scalars("train/loss")] == [(1, 1.5)]


async def test_tensorboard_dir_can_be_set(tmp_path):
    await run_monitor(tmp_path / "run", [(3, {"perf/step_time": 2.0})],
                      MonitorConfig(tensorboard_dir=str(tmp_path / "elsewhere")))
    assert read_tb(tmp_path / "elsewhere").Scalars("perf/step_time")[0].step == 3
    assert not (tmp_path / "run" / "tb").exists()


async def test_each_log_call_is_one_jsonl_line_with_step_and_time(tmp_path):
    await run_monitor(tmp_path, [(1, {"train/loss": 0.5, "buffer/size": 3}), (2, {"eval/reward_mean": 1.0})])
    rows = read_jsonl(tmp_path / "metrics.jsonl")
    assert [{k: v for k, v in r.items() if k != "time"} for r in rows] == [
        {"step": 1, "train/loss": 0.5, "buffer/size": 3.0},
        {"step": 2, "eval/reward_mean": 1.0},
    ]
    assert all(isinstance(r["time"], float) and r["time"] > 0 for r in rows)


async def test_non_finite_values_are_null_in_jsonl_and_as_is_in_tensorboard(tmp_path):
    metrics = {"train/loss": float("nan"), "train/grad_norm": float("inf"), "train/kl": float("-inf")}
    await run_monitor(tmp_path, [(1, metrics)])
    (row,) = read_jsonl(tmp_path / "metrics.jsonl")
    assert (row["train/loss"], row["train/grad_norm"], row["train/kl"]) == (None, None, None)
    acc = read_tb(tmp_path / "tb")
    assert math.isnan(acc.Scalars("train/loss")[0].value)
    assert acc.Scalars("train/grad_norm")[0].value == math.inf
    assert acc.Scalars("train/kl")[0].value == -math.inf


async def test_jsonl_is_appended_to_by_a_resumed_run(tmp_path):
    await run_monitor(tmp_path, [(1, {"train/loss": 1.0})])
    await run_monitor(tmp_path, [(2, {"train/loss": 2.0})])
    assert [r["step"] for r in read_jsonl(tmp_path / "metrics.jsonl")] == [1, 2]


async def test_resumed_run_replaces_tensorboard_points_from_its_resume_step(tmp_path):
    await run_monitor(tmp_path, [(step, {"train/loss": float(step)}) for step in range(1, 5)])
    await run_monitor(tmp_path, [(step, {"train/loss": 10.0 * step}) for step in (3, 4)], resume_step=3)
    points = [(e.step, e.value) for e in read_tb(tmp_path / "tb").Scalars("train/loss")]
    assert points == [(1, 1.0), (2, 2.0), (3, 30.0), (4, 40.0)]


async def test_flush_makes_metrics_readable_while_running(tmp_path):
    ref = await spawn(MonitorActor(MonitorConfig(), tmp_path))
    ref.tell("log", 4, {"rollout/reward_mean": 0.75})
    await ref.ask("flush")
    assert read_tb(tmp_path / "tb").Scalars("rollout/reward_mean")[0].value == 0.75
    assert read_jsonl(tmp_path / "metrics.jsonl")[0]["rollout/reward_mean"] == 0.75
    await ref.stop()


async def test_outputs_can_be_turned_off(tmp_path):
    await run_monitor(tmp_path, [(1, {"train/loss": 1.0})], MonitorConfig(tensorboard=False, metrics_jsonl=False))
    assert not (tmp_path / "tb").exists()
    assert not (tmp_path / "metrics.jsonl").exists()


async def test_non_numeric_value_is_skipped_without_failing_the_monitor(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="actors.monitor"):
        await run_monitor(tmp_path, [(1, {"train/loss": 1.0, "rollout/note": "hello"}), (2, {"rollout/note": [1]})])
    rows = read_jsonl(tmp_path / "metrics.jsonl")
    assert [sorted(r) for r in rows] == [["step", "time", "train/loss"], ["step", "time"]]
    warnings = [r.getMessage() for r in caplog.records if "rollout/note" in r.getMessage()]
    assert len(warnings) == 1  # once per metric name, not once per call


async def test_progress_bar_shows_steps_reward_and_tokens_per_second(tmp_path):
    console = FakeTerminal()
    await run_monitor(tmp_path, [(3, {"rollout/reward_mean": 0.5, "perf/rollout_tokens_per_s": 1234.0})],
                      total_steps=10, console=console)
    output = console.getvalue()
    assert "3/10" in output
    assert "reward=0.500" in output
    assert "tok/s=1234" in output


async def test_progress_bar_keeps_the_last_reward_when_a_call_has_none(tmp_path):
    console = FakeTerminal()
    await run_monitor(tmp_path, [(1, {"rollout/reward_mean": 0.125}), (2, {"train/loss": 1.0})],
                      MonitorConfig(log_interval=0), total_steps=4, console=console)
    last_frame = console.getvalue().split("\r")[-2]  # the frame drawn for step 2
    assert "2/4" in last_frame and "reward=0.125" in last_frame


async def test_no_progress_bar_when_the_console_is_not_a_terminal(tmp_path):
    console = io.StringIO()
    await run_monitor(tmp_path, [(1, {"rollout/reward_mean": 0.5})], MonitorConfig(log_interval=0),
                      total_steps=10, console=console)
    assert console.getvalue() == ""


async def test_no_progress_bar_when_disabled_by_config(tmp_path):
    console = FakeTerminal()
    await run_monitor(tmp_path, [(1, {"rollout/reward_mean": 0.5})],
                      MonitorConfig(progress_bar=False, log_interval=0), total_steps=10, console=console)
    assert console.getvalue() == ""


async def test_summary_line_is_logged_every_log_interval_steps(tmp_path, caplog):
    calls = [(step, {"rollout/reward_mean": step / 10, "perf/step_time": 1.0}) for step in range(1, 7)]
    with caplog.at_level(logging.INFO, logger="actors.monitor"):
        await run_monitor(tmp_path, calls, MonitorConfig(log_interval=3), console=io.StringIO())
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("step ")]
    assert lines == [
        "step 3: rollout/reward_mean=0.3 perf/step_time=1",
        "step 6: rollout/reward_mean=0.6 perf/step_time=1",
    ]


def test_negative_log_interval_is_a_config_error():
    with pytest.raises(ValueError, match="--log-interval must be >= 0"):
        MonitorConfig(log_interval=-1).validate()
