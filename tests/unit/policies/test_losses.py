"""Per-token policy losses and aggregation against hand-computed values.

Most cases set log π_old = 0 so that log π_θ = log(ratio).
"""

import math

import pytest
import torch

from policies.losses import aggregate, cispo_loss, gspo_loss, ppo_clip_loss, sft_loss


def close(actual, expected, atol=1e-5):
    torch.testing.assert_close(actual, torch.tensor(expected, dtype=torch.float32), atol=atol, rtol=0)


def logp_of(ratios):
    return torch.tensor([math.log(r) for r in ratios], requires_grad=True)


# eps_clip 0.2, eps_clip_high 0.28 -> ratios are clamped to [0.8, 1.28]
def test_ppo_positive_advantage_is_clipped_only_above_one_plus_eps_high():
    # A = 1: r=1.5 -> max(-1.5, -1.28) = -1.28 (clipped); r=1.1 -> -1.1; r=0.5 -> max(-0.5, -0.8) = -0.5
    logp = logp_of([1.5, 1.1, 0.5])
    terms = ppo_clip_loss(logp, torch.zeros(3), torch.ones(3), 0.2, 0.28)
    close(terms.loss, [-1.28, -1.1, -0.5])
    close(terms.clipfrac, [1.0, 0.0, 0.0])


def test_ppo_negative_advantage_is_clipped_only_below_one_minus_eps():
    # A = -1: r=0.5 -> max(0.5, 0.8) = 0.8 (clipped); r=1.5 -> max(1.5, 1.28) = 1.5
    terms = ppo_clip_loss(logp_of([0.5, 1.5]), torch.zeros(2), -torch.ones(2), 0.2, 0.28)
    close(terms.loss, [0.8, 1.5])
    close(terms.clipfrac, [1.0, 0.0])


def test_ppo_clipped_tokens_get_no_gradient():
    # d(-A·r)/dlogπ = -A·r: r=1.1 -> -1.1, r=0.5 -> -0.5; r=1.5 is clipped -> 0
    logp = logp_of([1.5, 1.1, 0.5])
    ppo_clip_loss(logp, torch.zeros(3), torch.ones(3), 0.2, 0.28).loss.sum().backward()
    close(logp.grad, [0.0, -1.1, -0.5])


def test_ppo_ratio_exactly_at_the_boundary_is_not_counted_as_clipped():
    # eps 0: clamp range [1, 1] and r = 1 -> L1 = L2 = -1, clipfrac 0
    terms = ppo_clip_loss(torch.zeros(1), torch.zeros(1), torch.ones(1), 0.0)
    close(terms.loss, [-1.0])
    close(terms.clipfrac, [0.0])


def test_ppo_eps_clip_high_defaults_to_eps_clip():
    # r = 1.5, A = 1, eps 0.2 both sides -> -1.2
    close(ppo_clip_loss(logp_of([1.5]), torch.zeros(1), torch.ones(1), 0.2).loss, [-1.2])


def test_dual_clip_caps_the_loss_of_negative_advantages_at_c_times_abs_advantage():
    # r = 4, A = -1: PPO max(4, 1.28) = 4, dual clip min(4, 3·1) = 3 (and no gradient)
    logp = logp_of([4.0])
    terms = ppo_clip_loss(logp, torch.zeros(1), -torch.ones(1), 0.2, 0.28, eps_clip_c=3.0)
    close(terms.loss, [3.0])
    terms.loss.sum().backward()
    close(logp.grad, [0.0])


def test_dual_clip_leaves_positive_advantages_alone():
    # r = 4, A = +1: max(-4, -1.28) = -1.28; dual clip only applies where A < 0
    terms = ppo_clip_loss(logp_of([4.0]), torch.zeros(1), torch.ones(1), 0.2, 0.28, eps_clip_c=3.0)
    close(terms.loss, [-1.28])


def test_dual_clip_constant_must_exceed_one():
    with pytest.raises(ValueError, match="eps_clip_c"):
        ppo_clip_loss(torch.zeros(1), torch.zeros(1), torch.ones(1), 0.2, eps_clip_c=1.0)


def test_ppo_kl_is_old_minus_new_logprob():
    # log π_old = -1, log π_θ = -1.5 -> ppo_kl = 0.5
    terms = ppo_clip_loss(torch.tensor([-1.5]), torch.tensor([-1.0]), torch.ones(1), 0.2)
    close(terms.ppo_kl, [0.5])


def test_cispo_uses_clipped_stop_gradient_weight_times_logprob():
    # r=1.5, A=1:  w = 1.28, L = -1.28·1·log 1.5 = -1.28·0.4054651 = -0.5189953
    # r=0.5, A=-1: w = 0.8,  L = -0.8·(-1)·log 0.5 = 0.8·(-0.6931472) = -0.5545177
    # r=1.1, A=1:  w = 1.1,  L = -1.1·log 1.1 = -1.1·0.0953102 = -0.1048412
    logp = logp_of([1.5, 0.5, 1.1])
    terms = cispo_loss(logp, torch.zeros(3), torch.tensor([1.0, -1.0, 1.0]), 0.2, 0.28)
    close(terms.loss, [-0.5189953, -0.5545177, -0.1048412])
    close(terms.clipfrac, [1.0, 1.0, 0.0])


def test_cispo_keeps_gradient_on_clipped_tokens():
    # dL/dlogπ = -w·A: -1.28, +0.8, -1.1
    logp = logp_of([1.5, 0.5, 1.1])
    cispo_loss(logp, torch.zeros(3), torch.tensor([1.0, -1.0, 1.0]), 0.2, 0.28).loss.sum().backward()
    close(logp.grad, [-1.28, 0.8, -1.1])


def _gspo_case():
    # seq 0: logπ - logπ_old = [0.2, 0.4, (5.0 masked)] -> mean 0.3, s = e^0.3 = 1.3498588, A = +1
    # seq 1: logπ - logπ_old = [0.1, 0.0, (masked)]    -> mean 0.05, s = e^0.05 = 1.0512711, A = -1
    logp = torch.tensor([[0.2, 0.4, 5.0], [0.1, 0.0, 0.0]], requires_grad=True)
    old = torch.zeros(2, 3)
    adv = torch.tensor([[1.0, 1.0, 1.0], [-1.0, -1.0, -1.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 0]])
    return logp, old, adv, mask


def test_gspo_clips_the_sequence_ratio_as_a_whole():
    # seq 0: s = 1.3498588 > 1.2 and A > 0 -> every token's loss is -1.2, clipped
    # seq 1: s = 1.0512711 inside [0.8, 1.2] -> loss = -(-1)·s = 1.0512711
    logp, old, adv, mask = _gspo_case()
    terms = gspo_loss(logp, old, adv, mask, 0.2)
    close(terms.loss[:, :2], [[-1.2, -1.2], [1.0512711, 1.0512711]])
    close(terms.clipfrac[:, :2], [[1.0, 1.0], [0.0, 0.0]])
    close(terms.ppo_kl[:, :2], [[-0.3, -0.3], [-0.05, -0.05]])


def test_gspo_token_gradient_is_sequence_ratio_times_advantage():
    # seq 0 clipped -> 0; seq 1: d(-A·s_t)/dlogπ_t = -A·s = 1.0512711 per token; masked -> 0
    logp, old, adv, mask = _gspo_case()
    (gspo_loss(logp, old, adv, mask, 0.2).loss * mask).sum().backward()
    close(logp.grad, [[0.0, 0.0, 0.0], [1.0512711, 1.0512711, 0.0]])


def test_gspo_dual_clip_bounds_a_negative_advantage_sequence_at_c_times_abs_advantage():
    # seq 0: mean log ratio ln 4 -> s = 4, A = -1: max(4, 1.2) = 4, dual clip min(4, 3·1) = 3
    #        on every token, and no gradient;
    # seq 1: s = e^0.05 = 1.0512711, A = -1: inside the band, 1.0512711 < 3 -> unchanged
    ln4 = math.log(4.0)
    logp = torch.tensor([[ln4, ln4], [0.1, 0.0]], requires_grad=True)
    adv = torch.tensor([[-1.0, -1.0], [-1.0, -1.0]])
    terms = gspo_loss(logp, torch.zeros(2, 2), adv, torch.ones(2, 2), 0.2, eps_clip_c=3.0)
    close(terms.loss, [[3.0, 3.0], [1.0512711, 1.0512711]])
    terms.loss.sum().backward()
    close(logp.grad, [[0.0, 0.0], [1.0512711, 1.0512711]])


def test_gspo_without_dual_clip_lets_the_negative_advantage_loss_grow():
    ln4 = math.log(4.0)
    terms = gspo_loss(torch.tensor([[ln4, ln4]]), torch.zeros(1, 2), -torch.ones(1, 2), torch.ones(1, 2), 0.2)
    close(terms.loss, [[4.0, 4.0]])


def test_gspo_of_an_all_masked_response_has_ratio_one():
    # no trainable token -> log s = 0/1 = 0 -> s = 1, loss = -A = -2
    terms = gspo_loss(torch.tensor([[3.0, 3.0]]), torch.zeros(1, 2), torch.full((1, 2), 2.0), torch.zeros(1, 2), 0.2)
    close(terms.loss, [[-2.0, -2.0]])


def test_sft_loss_is_negative_logprob():
    close(sft_loss(torch.tensor([-0.5, -2.0])), [0.5, 2.0])


# per_token [[1, 2, 3], [4, 5, 6]] with mask [[1, 1, 0], [1, 0, 0]]: masked values 1, 2 | 4
PER_TOKEN = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
MASK = torch.tensor([[1, 1, 0], [1, 0, 0]])


def test_token_mean_divides_the_masked_sum_by_the_global_token_count():
    # (1 + 2 + 4) / 3 = 2.3333333
    close(aggregate(PER_TOKEN, MASK, "token_mean", 3), 7.0 / 3.0)


def test_seq_mean_token_mean_averages_per_sequence_means():
    # seq means 1.5 and 4 -> (1.5 + 4) / 2 = 2.75
    close(aggregate(PER_TOKEN, MASK, "seq_mean_token_mean", 2), 2.75)


def test_seq_mean_token_sum_norm_divides_by_max_len_times_sequences():
    # (1 + 2 + 4) / (3 · 2) = 1.1666667
    close(aggregate(PER_TOKEN, MASK, "seq_mean_token_sum_norm", 6), 7.0 / 6.0)


@pytest.mark.parametrize(
    ("mode", "normalizer"),
    [("token_mean", 3), ("seq_mean_token_mean", 2), ("seq_mean_token_sum_norm", 6)],
)
def test_micro_batch_values_sum_to_the_full_batch_value(mode, normalizer):
    full = aggregate(PER_TOKEN, MASK, mode, normalizer)
    parts = aggregate(PER_TOKEN[:1], MASK[:1], mode, normalizer) + aggregate(PER_TOKEN[1:], MASK[1:], mode, normalizer)
    torch.testing.assert_close(parts, full)


def test_an_all_masked_sequence_contributes_zero_to_seq_mean():
    # seq 0 mean (1+2)/2 = 1.5, seq 1 empty -> 0; / 2 sequences = 0.75
    out = aggregate(torch.tensor([[1.0, 2.0], [9.0, 9.0]]), torch.tensor([[1, 1], [0, 0]]), "seq_mean_token_mean", 2)
    close(out, 0.75)


def test_an_all_masked_batch_with_zero_normalizer_aggregates_to_zero():
    close(aggregate(PER_TOKEN, torch.zeros(2, 3), "token_mean", 0), 0.0)


def test_non_finite_values_on_padding_do_not_leak_into_the_loss():
    per_token = torch.tensor([[1.0, float("nan"), float("inf")]])
    close(aggregate(per_token, torch.tensor([[1, 0, 0]]), "token_mean", 1), 1.0)


def test_aggregate_rejects_an_unknown_mode_by_name():
    with pytest.raises(ValueError, match="loss_agg 'sum'"):
        aggregate(PER_TOKEN, MASK, "sum", 1)


def test_aggregate_rejects_a_zero_normalizer_when_tokens_are_trainable():
    with pytest.raises(ValueError, match="normalizer is 0"):
        aggregate(PER_TOKEN, MASK, "token_mean", 0)


def test_aggregate_rejects_a_negative_normalizer():
    with pytest.raises(ValueError, match="normalizer"):
        aggregate(PER_TOKEN, MASK, "token_mean", -1)
