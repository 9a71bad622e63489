"""benchmarks/gpu/chaos.py against the CPU engine: the logic the GPU run (benchmarks/gpu/chaos.sh)
uses, tested before any GPU minute is spent — a real run, a real kill -9 of its engine while a weight
update holds its requests paused in place, and the table row that says what happened."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.gpu.chaos import Row, expected_prompts, main, table, trained_prompts
from examples.models.tiny import build_tiny_model

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def test_expected_and_trained_prompts_count_losses_and_repeats(tmp_path):
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"prompt": p, "label": "x"}) + "\n" for p in ("a", "b", "c")))
    dump = tmp_path / "dump"
    dump.mkdir()
    group = lambda prompt: json.dumps([{"prompt": prompt}, {"prompt": prompt}])  # noqa: E731 - two samples
    (dump / "step_000001.jsonl").write_text(group("a") + "\n" + group("a") + "\n")
    (dump / "step_000002.jsonl").write_text(group("c") + "\n")
    assert expected_prompts(data, 2) == ["a", "b"]
    assert trained_prompts(dump, 2) == ["a", "a", "c"]  # one entry per group


def test_the_table_shows_a_failures_last_line_only():
    rows = [Row("none", "completes", 0, 4, 0, 0, None, 1.5), Row("x", "fails", 1, 2, None, 0, None, 1.5,
                                                                 last_line="error: a | b")]
    lines = table(rows).splitlines()
    assert lines[2].endswith("| 1.5 |  |")
    assert lines[3].endswith("| error: a \\| b |")


def test_kill_9_of_the_cpu_engine_paused_in_place_completes_with_no_prompt_lost_or_repeated(tmp_path, capsys):
    model = build_tiny_model(tmp_path / "model", arch="qwen2", seed=5)
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{a}+1=", "label": str(a + 1)}) + "\n" for a in range(64)))
    out = tmp_path / "out"
    assert main(["--out", str(out), "--faults", "kill9-engine-paused-in-place", "--steps", "3", "--fault-after", "1",
                 "--timeout", "400", "--", "--hf-checkpoint", str(model), "--prompt-data", str(data),
                 "--rollout-batch-size", "2", "--n-samples-per-prompt", "2", "--rollout-max-response-len", "16",
                 "--rm-type", "exact", "--engine-type", "cpu", "--micro-batch-size", "4",
                 "--router-health-interval", "0.5", "--router-health-failures", "1"]) == 0
    row = json.loads((out / "chaos.jsonl").read_text())
    assert row["outcome"] == "completes", (out / "kill9-engine-paused-in-place.log").read_text()[-3000:]
    assert (row["steps_trained"], row["prompts_lost"], row["prompts_repeated"]) == (3, 0, 0)
    assert row["recover_s"] > 0 and row["injected_at_step"] == 1
    # The engine died inside sync v2's pause (held there until the driver saw it gone): its transfer failed.
    log = (out / "kill9-engine-paused-in-place.log").read_text()
    held = log.index("weight sync v2: held until")
    assert held < log.index("weight sync v2: released", held) < log.index("weight update failed on 1 engine(s)", held)
    assert (out / "chaos.md").read_text().splitlines()[2].startswith("| kill9-engine-paused-in-place | completes | 3 |")


def test_a_fault_with_no_step_after_it_to_recover_by_is_refused_at_start(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["--out", str(tmp_path), "--faults", "kill9-engine-paused-in-place", "--steps", "2", "--fault-after", "1",
              "--", "--prompt-data", str(tmp_path / "prompts.jsonl")])
    assert "--steps 2 leaves no step to train after kill9-engine-paused-in-place" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()  # nothing was started
