"""A non-finite loss or gradient skips the optimizer step on every rank (bf16/fp32 optimizers
have no grad scaler that would notice), and non-finite weights are never exported.

A real torchrun group of two DP ranks running the worker's TrainerOps: the loss is NaN on one
rank only, and later a NaN is written into one rank's weights; both ranks must agree.
"""

from __future__ import annotations

import json
import math

import pytest

from conftest import run_torchrun

pytestmark = pytest.mark.slow  # one torchrun group of two ranks: ~35 s on 2 cores


@pytest.fixture(scope="module")
def report(tiny_hf_dirs, tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("non_finite") / "report.json"
    run_torchrun("non_finite_step.py", 2, f"--hf-dir={tiny_hf_dirs['qwen2']}", f"--out={out}", timeout=240)
    return json.loads(out.read_text())


def test_a_nan_loss_on_one_rank_skips_the_step_on_every_rank_and_counts_it(report):
    metrics = report["skipped"]
    assert metrics["update_successful"] == 0.0
    assert metrics["skipped_steps"] == 1.0 and metrics["step"] == 0.0
    assert math.isnan(metrics["grad_norm"])
    assert report["unchanged"], "a skipped step changed the weights"


def test_non_finite_weights_on_one_rank_are_refused_by_every_rank(report):
    first, last = report["export_errors"]
    assert "refusing to export weights" in last and "non-finite" in last and "on rank 1" in last
    assert "refusing to export weights" in first and "another rank" in first
    assert not report["exported"]
