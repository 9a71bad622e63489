"""benchmarks/gpu/opd_table.py and learning_curve.stitch: a run resumed across device calls on one
clock, and the steps and minutes each run needs to reach 90% of the teacher's held-out accuracy."""

from __future__ import annotations

import json

from benchmarks.gpu.learning_curve import stitch
from benchmarks.gpu.opd_table import main

# The teacher's run in two parts: the first checkpointed at step 2 and was stopped during step 3;
# the second resumed from step 2 (its evaluation of step 2 repeats the first part's).
PART1 = [
    {"step": 0, "time": 100.0, "eval/reward_mean": 0.1},
    {"step": 1, "time": 104.0, "perf/step_time": 4.0},
    {"step": 2, "time": 108.0, "perf/step_time": 4.0},
    {"step": 2, "time": 109.0, "eval/reward_mean": 0.2},
    {"step": 3, "time": 112.0, "perf/step_time": 4.0},  # lost: trained after the last checkpoint
]
PART2 = [
    {"step": 2, "time": 500.0, "eval/reward_mean": 0.25},
    {"step": 3, "time": 505.0, "perf/step_time": 5.0},
    {"step": 4, "time": 509.0, "perf/step_time": 4.0},
    {"step": 4, "time": 510.0, "eval/reward_mean": 0.4},
]


def _write(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def test_stitch_drops_the_lost_steps_and_the_gap_between_the_parts():
    rows = stitch([PART1, PART2])
    # Part 2's clock continues from part 1's step-2 row (108): 500 -> 108, 505 -> 113, ...
    assert [(r["step"], r["time"]) for r in rows] == [(0, 100.0), (1, 104.0), (2, 108.0), (2, 109.0),
                                                      (3, 113.0), (4, 117.0), (4, 118.0)]
    assert [r["eval/reward_mean"] for r in rows if "eval/reward_mean" in r] == [0.1, 0.2, 0.4]


def test_table_gives_steps_and_minutes_to_ninety_percent_of_the_teacher(tmp_path, capsys):
    opd = [{"step": 0, "time": 0.0, "eval/reward_mean": 0.1},
           {"step": 1, "time": 30.0, "perf/step_time": 30.0},
           {"step": 2, "time": 60.0, "perf/step_time": 30.0},
           {"step": 2, "time": 66.0, "eval/reward_mean": 0.36}]  # 0.9 x 0.4 exactly
    slow = [{"step": 0, "time": 0.0, "eval/reward_mean": 0.1}, {"step": 4, "time": 90.0, "eval/reward_mean": 0.3}]
    code = main(["--teacher", _write(tmp_path / "t1.jsonl", PART1), _write(tmp_path / "t2.jsonl", PART2),
                 "--run", "GRPO + OPD", _write(tmp_path / "opd.jsonl", opd),
                 "--run", "slow", _write(tmp_path / "slow.jsonl", slow)])
    assert code == 0
    out = capsys.readouterr().out
    assert "teacher: held-out 0.400 at step 4 (its run's last evaluation); 90% of it: 0.360" in out
    assert "| 2 | 0.200 (0.1 min) | 0.360 (1.1 min) |  |" in out
    assert "| GRPO alone (the teacher's run) | 4 | 0.3 | 0.400 at step 4 (0.3 min) |" in out
    assert "| GRPO + OPD | 2 | 1.1 | 0.360 at step 2 (1.1 min) |" in out
    assert "| slow | not within 4 steps | not within 1.5 min | 0.300 at step 4 (1.5 min) |" in out


def test_a_missing_file_is_one_line(tmp_path, capsys):
    assert main(["--teacher", str(tmp_path / "nope.jsonl")]) == 2
    assert capsys.readouterr().err.strip() == f"error: {tmp_path / 'nope.jsonl'}: no such file"
