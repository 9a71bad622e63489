"""The warm-start rule of benchmarks/gpu/pick_warm_start.py (hand-computed cases)."""

from __future__ import annotations

import pytest

from benchmarks.gpu.pick_warm_start import choose, main, measure_order


def test_the_first_candidate_in_the_band_is_picked():
    assert choose([(0, 0.0), (2, 0.02), (3, 0.3), (4, 0.4)], low=0.1, high=0.5) == 3


def test_an_overshoot_gives_way_to_the_previous_candidate_that_already_earns_reward():
    # CPU, SmolLM2: 0.10 after 5 SFT steps, 0.91 after 6 — with 0.05 before, that one is kept.
    assert choose([(0, 0.0), (1, 0.05), (2, 0.91)], low=0.1, high=0.5) == 1
    # ... but a previous candidate that earns nothing leaves nothing for GRPO to reinforce.
    assert choose([(0, 0.0), (1, 0.0), (2, 0.91)], low=0.1, high=0.5) == 2
    assert choose([(0, 0.97)], low=0.1, high=0.5) == 0


def test_without_a_candidate_in_reach_the_best_and_latest_is_picked():
    assert choose([(0, 0.0), (2, 0.04), (4, 0.01)], low=0.1, high=0.5) == 2
    assert choose([(0, 0.0), (5, 0.0)], low=0.1, high=0.5) == 5
    with pytest.raises(ValueError, match="no candidate"):
        choose([], low=0.1, high=0.5)


def test_candidates_are_measured_by_stride_then_the_one_before_the_first_to_reach_the_band():
    rewards = [0.0, 0.0, 0.01, 0.08, 0.2, 0.9, 0.95]
    asked = []

    def reward_of(index):
        asked.append(index)
        return rewards[index]

    assert measure_order(len(rewards), 2, 0.1, reward_of) == [(0, 0.0), (2, 0.01), (3, 0.08), (4, 0.2)]
    assert asked == [0, 2, 4, 3]
    asked.clear()
    # None reaches the band: the last candidate is measured too.
    assert measure_order(4, 2, 0.5, reward_of) == [(0, 0.0), (2, 0.01), (3, 0.08)]
    assert asked == [0, 2, 3]


def test_a_band_upside_down_is_refused_at_start(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["a", "--engine", "http://127.0.0.1:1", "--low", "0.6", "--high", "0.5", "--run-dir", str(tmp_path),
              "--out", str(tmp_path / "x")])
    assert "--low 0.6 must be <= --high 0.5" in capsys.readouterr().err
