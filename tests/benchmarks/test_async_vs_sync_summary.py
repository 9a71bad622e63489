"""benchmarks/gpu/async_vs_sync.py: a run's steady-state numbers from its metrics.jsonl rows."""

import pytest

from benchmarks.gpu.async_vs_sync import summarize


def row(time, step_time, tokens, train, sync, dropped, consumed, resumed=0.0, staleness=0.0):
    return {"time": time, "perf/step_time": step_time, "rollout/tokens": tokens, "perf/train_time": train,
            "perf/weight_sync_time": sync, "buffer/dropped_stale": dropped, "buffer/consumed_groups": consumed,
            "rollout/samples_resumed": resumed, "buffer/staleness_max": staleness, "rollout/concurrency": 64.0}


def test_the_warm_up_steps_are_left_out_of_every_number():
    rows = [row(10.0, 10.0, 999, 9, 9, 5, 4),  # warm-up: its 5 drops and 999 tokens do not count
            row(12.0, 2.0, 100, 1.0, 0.2, 5, 8, resumed=3, staleness=1),
            row(16.0, 4.0, 300, 1.0, 0.4, 7, 12, resumed=1, staleness=2)]
    s = summarize(rows, warmup=1)
    assert s["steps"] == 2 and s["s_per_step"] == pytest.approx(3.0)  # (16 - 10) / 2
    assert s["engine_tokens_per_s"] == pytest.approx(400 / 6) and s["tokens_per_step"] == 200
    assert s["trainer_busy"] == pytest.approx(2 / 6) and s["sync_s"] == pytest.approx(0.3)
    assert (s["dropped_stale"], s["resumed"], s["staleness_max"]) == (2, 4, 2)
    assert s["dropped_stale_frac"] == pytest.approx(2 / (2 + 8))  # 2 dropped, 8 consumed after the warm-up


def test_without_warm_up_the_first_step_counts_from_its_start():
    s = summarize([row(5.0, 5.0, 50, 1, 0, 0, 4)], warmup=0)
    assert s["s_per_step"] == 5.0
