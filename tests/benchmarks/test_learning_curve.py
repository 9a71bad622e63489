"""benchmarks/gpu/learning_curve.py: the table the GPU drivers print from a run's metrics.jsonl."""

from __future__ import annotations

import json

from benchmarks.gpu.learning_curve import main


def test_table_has_the_asked_columns_and_the_held_out_summary(tmp_path, capsys):
    rows = [
        {"step": 0, "time": 100.0, "eval/reward_mean": 0.25},
        {"step": 1, "time": 103.0, "rollout/reward_mean": 0.5, "rollout/tool_calls": 1.25},
        {"step": 2, "time": 110.0, "rollout/reward_mean": 0.75, "rollout/tool_calls": 1.0},
        {"step": 2, "time": 112.0, "eval/reward_mean": 0.5},  # the evaluation lands after the step
    ]
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main([str(path), "--columns", "rollout/tool_calls"]) == 0
    out = capsys.readouterr().out
    header = out.splitlines()[0]
    assert header.endswith("| tool_calls |")
    assert "| 1 | 3 |  | 0.5 |" in out and out.splitlines()[3].endswith("| 1.25 |")
    assert "| 2 | 10 | 0.500 | 0.75 |" in out  # both log calls of step 2 merged into one row
    assert "0.250 at step 0 -> 0.500 at step 2 (+25.0 points, 12 s between the two evaluations; best 0.500)" in out
