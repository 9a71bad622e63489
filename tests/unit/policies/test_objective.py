"""compute_objective: composition of policy loss, corrections, KL, entropy and aggregation.

Shared micro-batch (token_mean, normalizer = 3 trainable tokens):
    logprobs   [[-1, -2, -3], [-1, -1, -1]]
    loss_mask  [[ 1,  1,  0], [ 1,  0,  0]]
    advantages [[ 1,  1,  1], [-0.5, -0.5, -0.5]]
On-policy (old = logprobs.detach()) the ratio is 1, so the PPO per-token loss is -A:
    pg_loss = (-1 - 1 + 0.5) / 3 = -0.5
"""

import dataclasses
import math

import pytest
import torch

from policies.algorithm import AlgorithmConfig
from policies.objective import compute_objective

MASK = torch.tensor([[1, 1, 0], [1, 0, 0]])
ADV = torch.tensor([[1.0, 1.0, 1.0], [-0.5, -0.5, -0.5]])


def logprobs():
    return torch.tensor([[-1.0, -2.0, -3.0], [-1.0, -1.0, -1.0]], requires_grad=True)


def run(spec=AlgorithmConfig(), **kwargs):
    kwargs.setdefault("logprobs", logprobs())
    kwargs.setdefault("loss_mask", MASK)
    kwargs.setdefault("normalizer", 3)
    if spec.loss_type == "policy_loss":
        kwargs.setdefault("advantages", ADV)
    return compute_objective(spec, **kwargs)


def test_on_policy_ppo_loss_is_minus_the_mean_advantage():
    out = run()
    assert out.loss.item() == pytest.approx(-0.5)
    assert out.metrics["pg_loss"] == pytest.approx(-0.5)
    assert out.metrics["pg_clipfrac"] == 0.0
    assert out.metrics["ppo_kl"] == 0.0
    assert out.metrics["kl_loss"] == 0.0


def test_on_policy_gradient_is_minus_advantage_over_normalizer_on_trainable_tokens():
    # d/dlogπ of -A·r/3 at r = 1: -A/3 -> [[-1/3, -1/3, 0], [1/6, 0, 0]]
    lp = logprobs()
    run(logprobs=lp).loss.backward()
    torch.testing.assert_close(lp.grad, torch.tensor([[-1 / 3, -1 / 3, 0.0], [1 / 6, 0.0, 0.0]]))


def test_clipped_tokens_are_counted_in_pg_clipfrac():
    # token (0, 0) has ratio 1.5 > 1.2 with A = 1: clipped; 1 of 3 tokens -> 1/3
    lp = logprobs()
    old = lp.detach().clone()
    old[0, 0] -= math.log(1.5)
    out = run(logprobs=lp, old_logprobs=old)
    assert out.metrics["pg_clipfrac"] == pytest.approx(1 / 3)
    # pg: token (0,0) -> -1.2, others -1 and +0.5 -> (-1.2 - 1 + 0.5)/3 = -0.5666667
    assert out.metrics["pg_loss"] == pytest.approx(-1.7 / 3)


def test_kl_loss_is_added_with_its_coefficient():
    # ref = logπ - 0.3 -> k1 = 0.3 per token -> kl_loss = 0.9/3 = 0.3; loss = -0.5 + 0.1·0.3 = -0.47
    spec = AlgorithmConfig(use_kl_loss=True, kl_loss_coef=0.1, kl_loss_type="k1")
    out = run(spec, ref_logprobs=logprobs().detach() - 0.3)
    assert out.metrics["kl_loss"] == pytest.approx(0.3)
    assert out.loss.item() == pytest.approx(-0.47)


def test_entropy_bonus_is_subtracted_with_its_coefficient():
    # entropy 0.6 per token -> 1.8/3 = 0.6; loss = -0.5 - 0.01·0.6 = -0.506
    out = run(AlgorithmConfig(entropy_coef=0.01), entropy=torch.full((2, 3), 0.6))
    assert out.metrics["entropy"] == pytest.approx(0.6)
    assert out.loss.item() == pytest.approx(-0.506)


def test_entropy_is_reported_even_without_a_bonus():
    out = run(entropy=torch.full((2, 3), 0.6))
    assert out.metrics["entropy"] == pytest.approx(0.6)
    assert out.loss.item() == pytest.approx(-0.5)


ROLLOUT_SHIFT = torch.tensor([[math.log(2.5), 0.0, 0.0], [0.0, 0.0, 0.0]])


def test_tis_reweights_tokens_by_the_truncated_ratio():
    # π_old/μ = [[2.5 -> 2, 1], [1]]: pg = (-1·2 - 1·1 + 0.5·1)/3 = -2.5/3 = -0.8333333
    lp = logprobs()
    out = run(AlgorithmConfig(use_tis=True), logprobs=lp, rollout_logprobs=lp.detach() - ROLLOUT_SHIFT)
    assert out.loss.item() == pytest.approx(-2.5 / 3)
    assert out.metrics["tis_weight_mean"] == pytest.approx(4 / 3)
    assert out.metrics["tis_clipfrac"] == pytest.approx(1 / 3)


def test_mismatch_metrics_are_logged_when_tis_is_off():
    # loss unchanged (-0.5); |diff| = ln 2.5 on one of 3 tokens -> 0.9162907/3 = 0.3054302
    lp = logprobs()
    out = run(logprobs=lp, rollout_logprobs=lp.detach() - ROLLOUT_SHIFT)
    assert out.loss.item() == pytest.approx(-0.5)
    assert out.metrics["logprob_abs_diff"] == pytest.approx(math.log(2.5) / 3)
    assert out.metrics["tis_weight_mean"] == pytest.approx(4 / 3)


def test_mismatch_metrics_are_absent_without_rollout_logprobs():
    assert "logprob_abs_diff" not in run().metrics


def test_icepop_drops_mismatched_tokens_from_the_loss():
    # ratio 2.5 outside [0.5, 2]: token (0,0) dropped -> pg = (-1 + 0.5)/3 = -1/6
    lp = logprobs()
    spec = AlgorithmConfig(use_icepop=True, icepop_low=0.5, icepop_high=2.0)
    out = run(spec, logprobs=lp, rollout_logprobs=lp.detach() - ROLLOUT_SHIFT)
    assert out.loss.item() == pytest.approx(-1 / 6)
    assert out.metrics["icepop_dropfrac"] == pytest.approx(1 / 3)


def test_icepop_alone_reweights_the_kept_tokens_by_the_ratio():
    # band [0.5, 3]: token (0,0) has π_old/μ = 2.5, kept with weight 2.5; the others ratio 1
    # pg = (-1·2.5 - 1·1 + 0.5·1)/3 = -3/3 = -1
    lp = logprobs()
    spec = AlgorithmConfig(use_icepop=True, icepop_low=0.5, icepop_high=3.0)
    out = run(spec, logprobs=lp, rollout_logprobs=lp.detach() - ROLLOUT_SHIFT)
    assert out.loss.item() == pytest.approx(-1.0)
    assert out.metrics["icepop_dropfrac"] == 0.0


def test_mis_sequence_weight_multiplies_every_token_of_the_sequence():
    # seq 0: product 2.5 truncated to 2 -> tokens -1·2, -1·2; seq 1: weight 1 -> +0.5
    # pg = (-2 - 2 + 0.5)/3 = -3.5/3
    lp = logprobs()
    spec = AlgorithmConfig(mis_level="sequence", mis_mode="truncate", mis_threshold_high=2.0)
    out = run(spec, logprobs=lp, rollout_logprobs=lp.detach() - ROLLOUT_SHIFT)
    assert out.loss.item() == pytest.approx(-3.5 / 3)


def test_decoupled_ppo_clips_against_proximal_and_weights_by_behaviour_ratio():
    # π_θ = π_prox (ratio 1, nothing clipped although μ is far off); π_prox/μ = [[1, 2], [4]], cap 3
    # weights [[1, 2], [0]] -> pg = (-1·1 - 1·2 + 0.5·0)/3 = -1
    lp = logprobs()
    behaviour = lp.detach() - torch.tensor([[0.0, math.log(2.0), 0.0], [math.log(4.0), 0.0, 0.0]])
    spec = AlgorithmConfig(use_decoupled_ppo=True, decoupled_behave_cap=3.0)
    out = run(spec, logprobs=lp, old_logprobs=lp.detach(), rollout_logprobs=behaviour)
    assert out.loss.item() == pytest.approx(-1.0)
    assert out.metrics["pg_clipfrac"] == 0.0
    assert out.metrics["decoupled_dropfrac"] == pytest.approx(1 / 3)


@pytest.mark.parametrize(("eps_clip_c", "expected"), [(None, 4.0), (3.0, 3.0)])
def test_gspo_objective_applies_the_dual_clip(eps_clip_c, expected):
    # one sequence, s = exp(mean(ln 4, ln 4)) = 4, A = -1: PPO-clipped loss 4, dual clip 3·|A| = 3
    ln4 = math.log(4.0)
    spec = AlgorithmConfig(policy_loss="gspo", loss_agg="seq_mean_token_mean", eps_clip_c=eps_clip_c)
    out = compute_objective(spec, logprobs=torch.tensor([[ln4, ln4]], requires_grad=True),
                            loss_mask=torch.ones(1, 2), advantages=-torch.ones(1, 2),
                            old_logprobs=torch.zeros(1, 2), normalizer=1)
    assert out.loss.item() == pytest.approx(expected)


def test_use_rollout_logprobs_takes_mu_as_pi_old():
    # π_old := μ = logπ − ROLLOUT_SHIFT: token (0,0) has ratio π_θ/μ = 2.5 > 1.2 with A = 1 -> clipped
    # pg = (-1.2 - 1 + 0.5)/3 = -1.7/3; the given old_logprobs (= π_θ) are ignored
    lp = logprobs()
    spec = AlgorithmConfig(use_rollout_logprobs=True)
    out = run(spec, logprobs=lp, old_logprobs=lp.detach(), rollout_logprobs=lp.detach() - ROLLOUT_SHIFT)
    assert out.metrics["pg_loss"] == pytest.approx(-1.7 / 3)
    assert out.metrics["pg_clipfrac"] == pytest.approx(1 / 3)
    # mismatch is measured between π_θ and μ: |ln 2.5| on one of 3 tokens
    assert out.metrics["logprob_abs_diff"] == pytest.approx(math.log(2.5) / 3)


def test_gspo_objective_with_seq_mean_token_mean():
    # on-policy s = 1 -> per-token -A; seq means: -1 and +0.5 over 2 sequences -> -0.25
    out = run(AlgorithmConfig(policy_loss="gspo", loss_agg="seq_mean_token_mean"), normalizer=2)
    assert out.loss.item() == pytest.approx(-0.25)


def test_cispo_objective_on_policy_is_minus_advantage_times_logprob():
    # w = 1: -A·logπ: (-(1)(-1) - (1)(-2) - (-0.5)(-1))/3 = (1 + 2 - 0.5)/3 = 2.5/3
    out = run(AlgorithmConfig(policy_loss="cispo"))
    assert out.loss.item() == pytest.approx(2.5 / 3)


def test_sft_loss_is_mean_negative_logprob_and_needs_no_advantages():
    # (1 + 2 + 1)/3 = 4/3
    out = run(AlgorithmConfig(loss_type="sft"))
    assert out.loss.item() == pytest.approx(4 / 3)


def test_micro_batch_losses_and_metrics_sum_to_the_full_batch():
    lp = logprobs().detach()
    rollout = lp - ROLLOUT_SHIFT
    spec = AlgorithmConfig(use_tis=True, use_kl_loss=True, kl_loss_coef=0.1)
    ref = lp - 0.3
    full = run(spec, logprobs=lp, rollout_logprobs=rollout, ref_logprobs=ref)
    halves = [
        run(
            spec,
            logprobs=lp[s],
            loss_mask=MASK[s],
            advantages=ADV[s],
            rollout_logprobs=rollout[s],
            ref_logprobs=ref[s],
        )
        for s in (slice(0, 1), slice(1, 2))
    ]
    assert halves[0].loss.item() + halves[1].loss.item() == pytest.approx(full.loss.item())
    for key, value in full.metrics.items():
        assert halves[0].metrics[key] + halves[1].metrics[key] == pytest.approx(value, abs=1e-6), key


def test_an_all_masked_micro_batch_contributes_zero_loss():
    out = run(loss_mask=torch.zeros(2, 3), normalizer=0)
    assert out.loss.item() == 0.0


@pytest.mark.parametrize("policy_loss", ["ppo", "cispo", "gspo"])
def test_zero_length_responses_give_a_zero_loss_that_backpropagates(policy_loss):
    lp = torch.zeros(2, 0, requires_grad=True)
    empty = torch.zeros(2, 0)
    out = compute_objective(
        AlgorithmConfig(policy_loss=policy_loss, use_tis=True),
        logprobs=lp,
        loss_mask=empty,
        advantages=empty,
        rollout_logprobs=empty,
        normalizer=0,
    )
    out.loss.backward()
    assert out.loss.item() == 0.0
    assert out.metrics["tis_weight_mean"] == 0.0


@pytest.mark.parametrize(
    ("spec", "missing", "message"),
    [
        (AlgorithmConfig(use_tis=True), "rollout_logprobs", "use_tis"),
        (AlgorithmConfig(use_kl_loss=True, kl_loss_coef=0.1), "ref_logprobs", "ref_logprobs"),
        (AlgorithmConfig(entropy_coef=0.01), "entropy", "entropy"),
        (AlgorithmConfig(), "advantages", "advantages"),
    ],
)
def test_missing_inputs_fail_naming_what_is_needed(spec, missing, message):
    lp = logprobs()
    inputs = {
        "rollout_logprobs": lp.detach(),
        "ref_logprobs": lp.detach(),
        "entropy": torch.ones(2, 3),
        "advantages": ADV,
    }
    del inputs[missing]
    with pytest.raises(ValueError, match=message):
        compute_objective(spec, logprobs=lp, loss_mask=MASK, normalizer=3, **inputs)


def test_invalid_spec_is_rejected_before_computing():
    with pytest.raises(ValueError, match="eps_clip_c"):
        run(dataclasses.replace(AlgorithmConfig(), eps_clip_c=0.5))
