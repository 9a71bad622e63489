"""The critic's clipped value loss and explained variance against hand-computed values."""

import pytest
import torch

from policies.value_loss import clipped_value_loss, explained_variance, masked_mean

# V − V_old = [0.5, 0, −0.3] with clip 0.2:
#   t0: V_clip = 0.7, (0.7 − 2)² = 1.69 > (1 − 2)² = 1      -> 1.69, clipped
#   t1: both (0.5 − 0)² = 0.25                                -> 0.25
#   t2: V_clip = −0.2, 0.04 < (−0.3)² = 0.09                  -> 0.09, clipped
VALUES = [1.0, 0.5, -0.3]
OLD = torch.tensor([[0.5, 0.5, 0.0]])
RETURNS = torch.tensor([[2.0, 0.0, 0.0]])


def test_the_loss_is_the_larger_of_the_clipped_and_unclipped_squared_errors():
    terms = clipped_value_loss(torch.tensor([VALUES]), OLD, RETURNS, torch.ones(1, 3), value_clip=0.2,
                               loss_agg="token_mean", normalizer=3.0)
    assert float(terms.loss) == pytest.approx(2.03 / 3, abs=1e-6)
    assert float(terms.clipfrac) == pytest.approx(2 / 3, abs=1e-6)


def test_masked_tokens_do_not_count():
    terms = clipped_value_loss(torch.tensor([VALUES]), OLD, RETURNS, torch.tensor([[1, 1, 0]]), value_clip=0.2,
                               loss_agg="token_mean", normalizer=2.0)
    assert float(terms.loss) == pytest.approx((1.69 + 0.25) / 2, abs=1e-6)
    assert float(terms.clipfrac) == pytest.approx(0.5, abs=1e-6)


def test_the_gradient_vanishes_where_the_clipped_error_wins():
    # t0 takes the clipped branch, whose clamp is saturated: no gradient. t1: 2·0.5/3; t2: 2·(−0.3)/3.
    values = torch.tensor([VALUES], requires_grad=True)
    clipped_value_loss(values, OLD, RETURNS, torch.ones(1, 3), value_clip=0.2, loss_agg="token_mean",
                       normalizer=3.0).loss.backward()
    torch.testing.assert_close(values.grad, torch.tensor([[0.0, 1 / 3, -0.2]]), atol=1e-6, rtol=0)


def test_a_non_positive_clip_is_refused():
    with pytest.raises(ValueError, match="value_clip"):
        clipped_value_loss(OLD, OLD, RETURNS, torch.ones(1, 3), value_clip=0.0, loss_agg="token_mean", normalizer=3.0)


def test_explained_variance():
    # Var(G) = 14/9 (G = [1, 2, 4]); G − V = [0, 0, 1], Var = 2/9; 1 − (2/9)/(14/9) = 6/7.
    ev = explained_variance(torch.tensor([[1.0, 2.0, 3.0]]), torch.tensor([[1.0, 2.0, 4.0]]), torch.ones(1, 3))
    assert ev == pytest.approx(6 / 7, abs=1e-6)


def test_explained_variance_is_undefined_for_constant_returns():
    assert explained_variance(torch.tensor([[0.1, 0.5]]), torch.tensor([[1.0, 1.0]]), torch.ones(1, 2)) is None


def test_masked_mean_skips_masked_tokens():
    assert masked_mean(torch.tensor([[1.0, 5.0, 3.0]]), torch.tensor([[1, 0, 1]])) == pytest.approx(2.0)
