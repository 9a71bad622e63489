"""benchmarks/staleness_ablation.py: its summaries (hand-computed), and one tiny grid end to end."""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from actors.megatron.config import TrainerConfig

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("staleness_ablation", REPO / "benchmarks" / "staleness_ablation.py")
ablation = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = ablation  # dataclasses look their module up there
_spec.loader.exec_module(ablation)


def test_curve_area_is_the_trapezoid_mean_over_the_step_span():
    # 10 · (0.2 + 0.4) / 2 + 20 · (0.4 + 0.6) / 2 = 3 + 10 = 13 over 30 steps
    assert ablation.curve_area([(0, 0.2), (10, 0.4), (30, 0.6)]) == pytest.approx(13 / 30)
    assert ablation.curve_area([(0, 0.5)]) == 0.5
    assert math.isnan(ablation.curve_area([]))


def test_summarize_metrics_reads_evals_staleness_and_trained_samples():
    rows = [
        {"step": 0, "eval/reward_mean": 0.25},
        {"step": 1, "perf/step_time": 1.0, "rollout/staleness_mean": 0.0, "rollout/staleness_max": 0.0,
         "buffer/consumed_groups": 16.0, "train/tis_clipfrac": 0.1},
        {"step": 2, "perf/step_time": 1.0, "rollout/staleness_mean": 1.5, "rollout/staleness_max": 2.0,
         "buffer/consumed_groups": 32.0, "buffer/dropped_stale": 1.0, "train/tis_clipfrac": 0.3},
        {"step": 2, "eval/reward_mean": 0.75},
    ]
    s = ablation.summarize_metrics(rows)
    assert s["evals"] == [(0, 0.25), (2, 0.75)]
    assert (s["final_reward"], s["best_reward"], s["auc"]) == (0.75, 0.75, 0.5)
    assert (s["staleness_mean"], s["staleness_max"]) == (0.75, 2.0)
    assert s["trained_samples"] == 32 * 8 and s["steps"] == 2 and s["dropped_stale_groups"] == 1.0
    assert s["extra"]["train/tis_clipfrac"] == pytest.approx(0.2)


def _result(k, correction, seed, final, stale=1.0, ok=True):
    return ablation.RunResult(k, correction, seed, ok, 10.0, evals=[(0, 0.3), (4, final)], final_reward=final,
                              best_reward=final, auc=(0.3 + final) / 2, staleness_mean=stale,
                              staleness_max=stale, trained_samples=512)


def test_table_gives_mean_and_sample_std_over_seeds_per_configuration():
    results = [_result(2, "tis", 1, 0.4), _result(2, "tis", 2, 0.6), _result(0, "none", 1, 0.5, stale=0.0),
               _result(2, "none", 1, 0.0, ok=False)]
    table = ablation.markdown_table(results, 0.3)
    rows = [line for line in table.splitlines() if line.startswith("| ") and line[2].isdigit()]
    # ordered by staleness, then correction in CORRECTIONS order; stdev([0.4, 0.6]) = 0.1414
    assert rows[0].startswith("| 0 | none | 0.00 / 0 | 0.500 |")
    assert rows[1].startswith("| 2 | none | — |") and "0 (1 failed)" in rows[1]
    assert rows[2].startswith("| 2 | tis | 1.00 / 1 | 0.500 ± 0.141 | 0.500 ± 0.141 | 0.400 ± 0.071 | 512 | 2 |")
    assert "warm start (step 0): 0.300" in table


def test_a_negative_train_step_delay_is_refused_naming_the_flag():
    with pytest.raises(ValueError, match="--train-step-delay must be >= 0"):
        TrainerConfig(hf_checkpoint="unused", micro_batch_size=1, train_step_delay=-1.0).validate()


@pytest.mark.slow
def test_one_configuration_writes_the_table_and_the_json(tmp_path):
    out = tmp_path / "out"
    # 2 prompts a step and 4 held-out prompts (a flag after --, passed to the run): the wiring, not the numbers.
    heldout = tmp_path / "heldout.jsonl"
    heldout.write_text("".join(json.dumps({"prompt": f"reverse {n}:", "label": str(n)[::-1]}) + "\n"
                               for n in (1234, 5678, 9012, 3456)))
    done = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "staleness_ablation.py"), "--out", str(out), "--staleness", "1",
         "--corrections", "tis", "--seeds", "1", "--steps", "2", "--rollout-batch-size", "2", "--eval-interval", "2",
         "--sft-steps", "0", "--train-delay", "1.0", "--", "--eval-prompt-data", str(heldout)],
        capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "| 1 | tis |" in done.stdout
    assert "| 1 | tis |" in (out / "table.md").read_text()
    results = json.loads((out / "results.json").read_text())
    (run,) = results["runs"]
    assert run["ok"] and run["trained_samples"] == 2 * 2 * 8
    assert [step for step, _ in run["evals"]] == [0, 2]
    # The injected delay reached the trainer: every train step took at least that long.
    metrics = [json.loads(line) for line in (out / "runs" / "k1-tis-s1" / "metrics.jsonl").read_text().splitlines()]
    assert all(m["eval/samples"] == 4 for m in metrics if "eval/samples" in m)
    train_times = [m["perf/train_time"] for m in metrics if "perf/train_time" in m]
    assert len(train_times) == 2 and min(train_times) >= 1.0
