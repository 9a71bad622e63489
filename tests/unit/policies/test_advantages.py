"""Advantage estimators against hand-computed values."""

import pytest
import torch

from policies.advantages import (
    compute_advantages,
    dr_grpo_advantages,
    grpo_advantages,
    gspo_advantages,
    masked_whiten,
    reinforce_plus_plus_advantages,
    reinforce_plus_plus_baseline_advantages,
    reinforce_plus_plus_returns,
    rloo_advantages,
)


def close(actual, expected, atol=1e-5):
    torch.testing.assert_close(actual, torch.tensor(expected, dtype=torch.float32), atol=atol, rtol=0)


# Group 7 = rewards [1, 0, 0, 1] (positions 0, 2, 4, 5); group 3 = [2, 2] (positions 1, 3).
REWARDS = torch.tensor([1.0, 2.0, 0.0, 2.0, 0.0, 1.0])
GROUPS = torch.tensor([7, 3, 7, 3, 7, 7])


def test_grpo_normalises_by_unbiased_group_std_and_zeroes_all_equal_groups():
    # group 7: mean 0.5, deviations ±0.5, unbiased var = 4·0.25/3 = 1/3, std = 0.5773503
    #          A = ±0.5 / (0.5773503 + 1e-6) = ±0.8660239
    # group 3: all equal -> A = 0
    a = 0.8660239
    close(grpo_advantages(REWARDS, GROUPS), [a, 0.0, -a, 0.0, -a, a])


def test_grpo_gives_zero_to_a_group_of_one():
    close(grpo_advantages(torch.tensor([5.0]), torch.tensor([0])), [0.0])


def test_gspo_advantages_equal_grpo_advantages():
    torch.testing.assert_close(gspo_advantages(REWARDS, GROUPS), grpo_advantages(REWARDS, GROUPS))


def test_dr_grpo_only_subtracts_the_group_mean():
    # group 0: [3, 1, 2], mean 2 -> [1, -1, 0]; group 1: [1, 0], mean 0.5 -> [0.5, -0.5]
    rewards = torch.tensor([3.0, 1.0, 2.0, 1.0, 0.0])
    groups = torch.tensor([0, 0, 0, 1, 1])
    close(dr_grpo_advantages(rewards, groups), [1.0, -1.0, 0.0, 0.5, -0.5])


def test_rloo_subtracts_the_mean_of_the_other_samples():
    # group 7 [1, 0, 0, 1]: r=1 -> 1 - (0+0+1)/3 = 2/3; r=0 -> 0 - (1+0+1)/3 = -2/3
    # group 3 [2, 2]: 2 - 2/1 = 0
    t = 2.0 / 3.0
    close(rloo_advantages(REWARDS, GROUPS), [t, 0.0, -t, 0.0, -t, t])


def test_rloo_gives_zero_to_a_group_of_one():
    close(rloo_advantages(torch.tensor([5.0]), torch.tensor([0])), [0.0])


def test_masked_whiten_uses_only_masked_entries_with_bessel_correction():
    # masked values 1, 2, 3: mean 2, unbiased var (1 + 0 + 1)/2 = 1 -> -1, 0, 1; the 99 is ignored
    values = torch.tensor([[1.0, 2.0, 99.0], [3.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    close(masked_whiten(values, mask), [[-1.0, 0.0, 0.0], [1.0, 0.0, 0.0]])


def test_masked_whiten_of_an_all_masked_batch_is_zero():
    close(masked_whiten(torch.ones(2, 3), torch.zeros(2, 3)), [[0.0] * 3] * 2)


def test_reinforce_plus_plus_return_places_reward_on_last_trainable_token_and_discounts():
    # gamma 0.5, kl_coef 0.5, kl [0.2, 0.4, 0.6], mask [1, 1, 0], reward 1
    # token rewards: t0 = -0.5·0.2 = -0.1; t1 = -0.5·0.4 + 1 = 0.8; t2 masked = 0
    # G2 = 0; G1 = 0.8; G0 = -0.1 + 0.5·0.8 = 0.3
    returns = reinforce_plus_plus_returns(
        torch.tensor([1.0]),
        torch.tensor([[1, 1, 0]]),
        kl=torch.tensor([[0.2, 0.4, 0.6]]),
        kl_coef=0.5,
        gamma=0.5,
    )
    close(returns, [[0.3, 0.8, 0.0]])


def test_reinforce_plus_plus_return_discounts_through_tool_output_positions():
    # mask [1, 0, 1], gamma 0.5, reward 1 on t2: G2 = 1, G1 = 0.5, G0 = 0.25
    returns = reinforce_plus_plus_returns(torch.tensor([1.0]), torch.tensor([[1, 0, 1]]), gamma=0.5)
    close(returns, [[0.25, 0.5, 1.0]])


def test_reinforce_plus_plus_return_of_an_all_masked_response_is_zero():
    returns = reinforce_plus_plus_returns(torch.tensor([1.0, 1.0]), torch.tensor([[0, 0], [1, 0]]))
    close(returns, [[0.0, 0.0], [1.0, 0.0]])


def test_reinforce_plus_plus_whitens_returns_over_the_batch():
    # returns [[1, 1], [0, 0]]: mean 0.5, unbiased var 4·0.25/3 = 1/3, std 0.5773503 -> ±0.8660254
    adv = reinforce_plus_plus_advantages(torch.tensor([1.0, 0.0]), torch.ones(2, 2))
    a = 0.8660254
    close(adv, [[a, a], [-a, -a]])


def test_reinforce_plus_plus_baseline_subtracts_group_mean_and_kl_then_whitens():
    # centred rewards [0.5, -0.5]; kl_coef 1, kl [[0.5, 0], [0, 0]]
    # tokens [[0.0, 0.5], [-0.5, -0.5]]: mean -0.125; deviations 0.125, 0.625, -0.375, -0.375
    # unbiased var (0.015625 + 0.390625 + 0.140625 + 0.140625)/3 = 0.2291667, std 0.4787136
    # -> [[0.2611165, 1.3055824], [-0.7833495, -0.7833495]]
    adv = reinforce_plus_plus_baseline_advantages(
        torch.tensor([1.0, 0.0]),
        torch.tensor([0, 0]),
        torch.ones(2, 2),
        kl=torch.tensor([[0.5, 0.0], [0.0, 0.0]]),
        kl_coef=1.0,
    )
    close(adv, [[0.2611165, 1.3055824], [-0.7833495, -0.7833495]])


def test_compute_advantages_broadcasts_scalar_advantages_and_zeroes_masked_tokens():
    # dr_grpo of [1, 0] in one group = [0.5, -0.5]
    adv = compute_advantages(
        "dr_grpo", torch.tensor([1.0, 0.0]), torch.tensor([0, 0]), torch.tensor([[1, 1, 0], [1, 0, 0]])
    )
    close(adv, [[0.5, 0.5, 0.0], [-0.5, 0.0, 0.0]])


def test_compute_advantages_normalize_whitens_over_masked_tokens():
    # tokens 0.5, 0.5, -0.5: mean 1/6; deviations 1/3, 1/3, -2/3; unbiased var (1/9+1/9+4/9)/2 = 1/3
    # std 0.5773503 -> 0.5773503, 0.5773503, -1.1547005
    adv = compute_advantages(
        "dr_grpo",
        torch.tensor([1.0, 0.0]),
        torch.tensor([0, 0]),
        torch.tensor([[1, 1, 0], [1, 0, 0]]),
        normalize=True,
    )
    close(adv, [[0.5773503, 0.5773503, 0.0], [-1.1547005, 0.0, 0.0]])


@pytest.mark.parametrize(
    "estimator", ["grpo", "dr_grpo", "rloo", "gspo", "reinforce_plus_plus", "reinforce_plus_plus_baseline"]
)
def test_compute_advantages_of_zero_length_responses_is_empty(estimator):
    adv = compute_advantages(estimator, torch.tensor([1.0, 0.0]), torch.tensor([0, 0]), torch.zeros(2, 0))
    assert adv.shape == (2, 0)


def test_compute_advantages_rejects_unknown_estimator_by_name():
    with pytest.raises(ValueError, match="advantage_estimator 'ppo_gae'"):
        compute_advantages("ppo_gae", torch.tensor([1.0]), torch.tensor([0]), torch.ones(1, 1))


def test_compute_advantages_rejects_mask_with_wrong_batch_size():
    with pytest.raises(ValueError, match="loss_mask must be"):
        compute_advantages("grpo", torch.tensor([1.0, 0.0]), torch.tensor([0, 0]), torch.ones(3, 2))


@pytest.mark.parametrize("value", [2.2, 0.7, 1.0 / 3.0])
@pytest.mark.parametrize("estimator", [grpo_advantages, dr_grpo_advantages, rloo_advantages])
def test_a_group_of_equal_float32_rewards_gets_exactly_zero_advantage(estimator, value):
    # 16 × 2.2 in float32: a float32 running sum is 35.200005, mean 2.2000003, so r − mean is
    # −3e-7 and GRPO divided that by (std ≈ 3e-7) + 1e-6 into −0.19. Exactly 0 is required.
    rewards = torch.full((16,), value, dtype=torch.float32)
    groups = torch.zeros(16, dtype=torch.long)
    assert torch.equal(estimator(rewards, groups), torch.zeros(16))


def test_equal_groups_stay_zero_next_to_a_group_with_spread():
    # group 0: 16 × 0.7 -> 0; group 1: [0.7, 0.2] mean 0.45, deviations ±0.25,
    # unbiased std = sqrt(2·0.0625/1) = 0.3535534 -> A = ±0.25/0.3535544 = ±0.7071048
    rewards = torch.tensor([0.7] * 16 + [0.7, 0.2])
    groups = torch.tensor([0] * 16 + [1, 1])
    adv = grpo_advantages(rewards, groups)
    assert torch.equal(adv[:16], torch.zeros(16))
    close(adv[16:], [0.7071048, -0.7071048])


def test_masked_whiten_of_equal_values_is_exactly_zero():
    values = torch.full((2, 8), 2.2)
    mask = torch.ones(2, 8)
    mask[1, 5:] = 0
    assert torch.equal(masked_whiten(values, mask), torch.zeros(2, 8))


def test_normalized_advantages_of_a_batch_of_equal_groups_are_zero():
    rewards = torch.full((16,), 2.2)
    groups = torch.tensor([0] * 8 + [1] * 8)
    adv = compute_advantages("grpo", rewards, groups, torch.ones(16, 4), normalize=True)
    assert torch.equal(adv, torch.zeros(16, 4))
