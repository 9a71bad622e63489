"""KL estimators against hand-computed values."""

import math

import pytest
import torch

from policies.kl import kl_estimate

# log π = [-1, -2], log q = [-2, -1] -> log_ratio = [1, -1]
LOGP = torch.tensor([-1.0, -2.0])
LOGQ = torch.tensor([-2.0, -1.0])


def close(actual, expected):
    torch.testing.assert_close(actual, torch.tensor(expected), atol=1e-6, rtol=0)


def test_k1_is_the_log_ratio():
    close(kl_estimate(LOGP, LOGQ, "k1"), [1.0, -1.0])


def test_k2_is_half_the_squared_log_ratio():
    close(kl_estimate(LOGP, LOGQ, "k2"), [0.5, 0.5])


def test_k3_is_exp_of_negative_log_ratio_minus_it_minus_one():
    # r = q/π: exp(-1) - (-1) - 1 = e^-1 = 0.3678794; exp(1) - 1 - 1 = e - 2 = 0.7182818
    close(kl_estimate(LOGP, LOGQ, "k3"), [math.exp(-1.0), math.e - 2.0])


def test_all_estimators_are_zero_when_the_policies_agree():
    for kind in ("k1", "k2", "k3", "low_var_kl"):
        close(kl_estimate(LOGP, LOGP, kind), [0.0, 0.0])


def test_low_var_kl_equals_k3_inside_the_bound():
    close(kl_estimate(LOGP, LOGQ, "low_var_kl"), [math.exp(-1.0), math.e - 2.0])


def test_low_var_kl_clamps_large_values_to_ten():
    # log_ratio -20: k3 = e^20 - 20 - 1 ≈ 4.85e8 -> 10; log_ratio 20: k3 = e^-20 + 19 ≈ 19 -> 10
    logp = torch.tensor([-20.0, 0.0])
    logq = torch.tensor([0.0, -20.0])
    assert kl_estimate(logp, logq, "k3")[0] > 1e8
    close(kl_estimate(logp, logq, "low_var_kl"), [10.0, 10.0])


def test_kl_is_computed_in_float32_for_bf16_inputs():
    out = kl_estimate(LOGP.bfloat16(), LOGQ.bfloat16(), "k1")
    assert out.dtype == torch.float32


def test_unknown_kind_is_rejected_by_name():
    with pytest.raises(ValueError, match="'k4'"):
        kl_estimate(LOGP, LOGQ, "k4")
