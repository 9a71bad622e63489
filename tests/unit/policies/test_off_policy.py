"""Off-policy corrections against hand-computed values.

Most cases set rollout (μ) logprobs to 0 so that log π_old = log(π_old/μ).
"""

import math

import pytest
import torch

from policies.off_policy import (
    decoupled_behaviour_weights,
    icepop_weights,
    mis_weights,
    tis_weights,
)


def close(actual, expected, atol=1e-5):
    torch.testing.assert_close(actual, torch.tensor(expected, dtype=torch.float32), atol=atol, rtol=0)


def logs(ratios):
    return torch.tensor([[math.log(r) for r in ratios]])


# ratios π_old/μ = [0.5, 1.5, 3.0, 10.0]; the last token is masked
TIS_OLD = logs([0.5, 1.5, 3.0, 10.0])
TIS_MASK = torch.tensor([[1, 1, 1, 0]])


def test_tis_truncates_the_ratio_at_clip_and_zeroes_masked_tokens():
    # [0.5, 1.5, min(3, 2) = 2, masked 0]; only the 3.0 was truncated
    out = tis_weights(TIS_OLD, torch.zeros(1, 4), TIS_MASK, clip=2.0)
    close(out.weights, [[0.5, 1.5, 2.0, 0.0]])
    close(out.affected, [[0.0, 0.0, 1.0, 0.0]])


def test_tis_clip_low_raises_small_ratios():
    # clamp to [0.8, 2]: [0.8, 1.5, 2.0]
    out = tis_weights(TIS_OLD, torch.zeros(1, 4), TIS_MASK, clip=2.0, clip_low=0.8)
    close(out.weights, [[0.8, 1.5, 2.0, 0.0]])
    close(out.affected, [[1.0, 0.0, 1.0, 0.0]])


def test_tis_weights_carry_no_gradient():
    old = TIS_OLD.clone().requires_grad_(True)
    assert not tis_weights(old, torch.zeros(1, 4), TIS_MASK, clip=2.0).weights.requires_grad


def test_icepop_weights_tokens_inside_the_band_by_their_ratio_and_drops_the_rest():
    # band [0.5, 2]: ratio 0.4 dropped, 1.5 kept with weight π_old/μ = 1.5 (as slime's icepop),
    # 3.0 dropped
    out = icepop_weights(logs([0.4, 1.5, 3.0]), torch.zeros(1, 3), torch.ones(1, 3), 0.5, 2.0)
    close(out.weights, [[0.0, 1.5, 0.0]])
    close(out.affected, [[1.0, 0.0, 1.0]])


def test_icepop_weights_are_zero_on_masked_tokens():
    # ratios 0.8 and 1.25, both in [0.5, 5]; the second token has loss_mask 0
    out = icepop_weights(logs([0.8, 1.25]), torch.zeros(1, 2), torch.tensor([[1, 0]]), 0.5, 5.0)
    close(out.weights, [[0.8, 0.0]])
    close(out.affected, [[0.0, 0.0]])


def test_icepop_band_bounds_are_inclusive():
    # ratio exactly 1 with band [1, 1] is kept
    out = icepop_weights(torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1, 1), 1.0, 1.0)
    close(out.weights, [[1.0]])


# log(π_old/μ) per token; seq 0 [0.5, 0.5, -], seq 1 [-0.25, -0.25, (9 masked)], seq 2 [0.1, -0.1, -]
MIS_OLD = torch.tensor([[0.5, 0.5, 0.0], [-0.25, -0.25, 9.0], [0.1, -0.1, 0.0]])
MIS_MASK = torch.tensor([[1, 1, 0], [1, 1, 0], [1, 1, 0]])
# sequence weights: e^1 = 2.7182818, e^-0.5 = 0.6065307, e^0 = 1


def _mis(level, mode, low, high):
    return mis_weights(MIS_OLD, torch.zeros(3, 3), MIS_MASK, level, mode, low, high)


def test_mis_sequence_truncate_caps_the_product_of_ratios_above_only():
    # [min(2.718, 2), 0.6065307 (below low but truncate ignores low), 1]
    out = _mis("sequence", "truncate", 0.7, 2.0)
    close(out.weights, [[2.0, 2.0, 0.0], [0.6065307, 0.6065307, 0.0], [1.0, 1.0, 0.0]])
    close(out.affected[:, 0], [1.0, 0.0, 0.0])


def test_mis_sequence_clip_clamps_to_both_bounds():
    # [2, max(0.6065, 0.7) = 0.7, 1]
    out = _mis("sequence", "clip", 0.7, 2.0)
    close(out.weights[:, 0], [2.0, 0.7, 1.0])
    close(out.affected[:, 0], [1.0, 1.0, 0.0])


def test_mis_sequence_mask_rejects_sequences_outside_the_bounds():
    # 2.718 > 2 rejected, 0.6065 < 0.7 rejected, 1 kept with weight 1
    out = _mis("sequence", "mask", 0.7, 2.0)
    close(out.weights[:, :2], [[0.0, 0.0], [0.0, 0.0], [1.0, 1.0]])
    close(out.affected[:, 0], [1.0, 1.0, 0.0])


def test_mis_geometric_uses_the_mean_log_ratio():
    # e^0.5 = 1.6487213, e^-0.25 = 0.7788008, e^0 = 1 (all within [0.7, 2])
    out = _mis("geometric", "truncate", 0.7, 2.0)
    close(out.weights[:, 0], [1.6487213, 0.7788008, 1.0])
    close(out.affected[:, 0], [0.0, 0.0, 0.0])


def test_mis_of_an_all_masked_sequence_is_zero():
    out = mis_weights(torch.ones(1, 2), torch.zeros(1, 2), torch.zeros(1, 2), "sequence", "clip", 0.5, 2.0)
    close(out.weights, [[0.0, 0.0]])


def test_mis_of_a_long_sequence_does_not_overflow():
    # Σ log ratio = 200 -> e^200 overflows float32; truncate gives the bound, mask rejects
    old = torch.ones(1, 200)
    mask = torch.ones(1, 200)
    truncated = mis_weights(old, torch.zeros(1, 200), mask, "sequence", "truncate", 0.5, 2.0)
    masked = mis_weights(old, torch.zeros(1, 200), mask, "sequence", "mask", 0.5, 2.0)
    assert torch.all(truncated.weights == 2.0)
    assert torch.all(masked.weights == 0.0)


def test_mis_rejects_an_unknown_level_by_name():
    with pytest.raises(ValueError, match="mis_level 'token'"):
        _mis("token", "clip", 0.5, 2.0)


def test_mis_rejects_an_unknown_mode_by_name():
    with pytest.raises(ValueError, match="mis_mode 'drop'"):
        _mis("sequence", "drop", 0.5, 2.0)


def test_decoupled_behaviour_weight_is_proximal_over_behaviour_and_drops_above_cap():
    # π_prox/μ = [1, 2, 4], cap 3 -> [1, 2, 0 (dropped)]
    out = decoupled_behaviour_weights(logs([1.0, 2.0, 4.0]), torch.zeros(1, 3), torch.ones(1, 3), cap=3.0)
    close(out.weights, [[1.0, 2.0, 0.0]])
    close(out.affected, [[0.0, 0.0, 1.0]])


def test_decoupled_behaviour_weight_without_cap_keeps_every_token():
    out = decoupled_behaviour_weights(logs([1.0, 2.0, 4.0]), torch.zeros(1, 3), torch.tensor([[1, 1, 0]]))
    close(out.weights, [[1.0, 2.0, 0.0]])
