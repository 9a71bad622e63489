"""PPO's GAE (policies.gae) against hand-computed values."""

import pytest
import torch

from policies.gae import gae, ppo_advantages, ppo_token_rewards


def close(actual, expected, atol=1e-6):
    torch.testing.assert_close(actual, torch.tensor(expected, dtype=torch.float32), atol=atol, rtol=0)


VALUES = torch.tensor([[0.5, 0.2, 0.1]])
LENGTH = torch.tensor([3])


def test_the_reward_sits_on_the_last_response_token():
    # Row 1 has 2 of 3 positions: its reward goes to position 1, not to the padding.
    close(ppo_token_rewards(torch.tensor([1.0, -2.0]), torch.tensor([3, 2]), 3), [[0, 0, 1.0], [0, -2.0, 0]])


def test_kl_in_the_reward_costs_every_response_token():
    # r = −0.1 · kl, plus R = 1 on the last token: [−0.05, 1 − 0.02]; the padding's kl is ignored.
    kl = torch.tensor([[0.5, 0.2, 7.0]])
    close(ppo_token_rewards(torch.tensor([1.0]), torch.tensor([2]), 3, kl, kl_coef=0.1), [[-0.05, 0.98, 0.0]])


def test_an_empty_response_gets_no_reward():
    close(ppo_token_rewards(torch.tensor([1.0]), torch.tensor([0]), 2), [[0.0, 0.0]])


def test_gamma_and_lambda_one_give_monte_carlo_returns():
    # δ2 = 1 − 0.1 = 0.9; δ1 = 0.1 − 0.2 = −0.1; δ0 = 0.2 − 0.5 = −0.3; A = suffix sums of δ.
    out = gae(torch.tensor([[0.0, 0.0, 1.0]]), VALUES, LENGTH, gamma=1.0, lambd=1.0)
    close(out.advantages, [[0.5, 0.8, 0.9]])
    close(out.returns, [[1.0, 1.0, 1.0]])


def test_gamma_and_lambda_below_one():
    # γ = λ = 0.5: δ2 = 0.9, δ1 = 0.5·0.1 − 0.2 = −0.15, δ0 = 0.5·0.2 − 0.5 = −0.4;
    # A2 = 0.9, A1 = −0.15 + 0.25·0.9 = 0.075, A0 = −0.4 + 0.25·0.075 = −0.38125; G = A + V.
    out = gae(torch.tensor([[0.0, 0.0, 1.0]]), VALUES, LENGTH, gamma=0.5, lambd=0.5)
    close(out.advantages, [[-0.38125, 0.075, 0.9]])
    close(out.returns, [[0.11875, 0.275, 1.0]])


def test_lambda_zero_is_the_one_step_td_error():
    out = gae(torch.tensor([[0.0, 0.0, 1.0]]), VALUES, LENGTH, gamma=0.5, lambd=0.0)
    close(out.advantages, [[-0.4, -0.15, 0.9]])


def test_gamma_zero_is_reward_minus_value():
    out = gae(torch.tensor([[0.0, 0.0, 1.0]]), VALUES, LENGTH, gamma=0.0, lambd=1.0)
    close(out.advantages, [[-0.5, -0.2, 0.9]])
    close(out.returns, [[0.0, 0.0, 1.0]])


def test_padding_is_ignored_and_stays_zero():
    # Row 1 (length 2, R = −1, V = [0.4, −0.2], padding value 9 ignored): δ1 = −1 + 0.2 = −0.8,
    # δ0 = −0.2 − 0.4 = −0.6; A = [−1.4, −0.8], G = [−1, −1].
    rewards = ppo_token_rewards(torch.tensor([1.0, -1.0]), torch.tensor([3, 2]), 3)
    values = torch.tensor([[0.5, 0.2, 0.1], [0.4, -0.2, 9.0]])
    out = gae(rewards, values, torch.tensor([3, 2]), gamma=1.0, lambd=1.0)
    close(out.advantages, [[0.5, 0.8, 0.9], [-1.4, -0.8, 0.0]])
    close(out.returns, [[1.0, 1.0, 1.0], [-1.0, -1.0, 0.0]])


def test_tool_observation_tokens_are_steps_of_the_recurrence_but_get_no_advantage():
    # loss_mask [1, 0, 0, 1]: positions 1-2 are tool output. γ = 0.9, λ = 0.8 (γλ = 0.72), R = 1,
    # V = [0.1, 0.3, 0.6, 0.8]:
    #   δ3 = 1 − 0.8 = 0.2                 A3 = 0.2
    #   δ2 = 0.9·0.8 − 0.6 = 0.12          A2 = 0.12 + 0.72·0.2 = 0.264
    #   δ1 = 0.9·0.6 − 0.3 = 0.24          A1 = 0.24 + 0.72·0.264 = 0.43008
    #   δ0 = 0.9·0.3 − 0.1 = 0.17          A0 = 0.17 + 0.72·0.43008 = 0.4796576
    # The advantages of the tool tokens are zeroed (nothing trains on them); returns are not.
    out = ppo_advantages(torch.tensor([1.0]), torch.tensor([[0.1, 0.3, 0.6, 0.8]]), torch.tensor([4]),
                         torch.tensor([[1, 0, 0, 1]]), gamma=0.9, lambd=0.8)
    close(out.advantages, [[0.4796576, 0.0, 0.0, 0.2]])
    close(out.returns, [[0.5796576, 0.73008, 0.864, 1.0]])


def test_normalised_advantages_are_whitened_over_trainable_tokens_and_returns_are_not():
    # Unnormalised A on the trainable tokens: [0.5, 0.8, 0.9] (the test above with γ = λ = 1);
    # mean 0.7333333, unbiased var = (0.0544444 + 0.0044444 + 0.0277778) / 2 = 0.0433333.
    out = ppo_advantages(torch.tensor([1.0]), VALUES, LENGTH, torch.ones(1, 3), normalize=True)
    std = 0.0433333 ** 0.5
    close(out.advantages, [[(0.5 - 0.7333333) / std, (0.8 - 0.7333333) / std, (0.9 - 0.7333333) / std]], atol=1e-4)
    close(out.returns, [[1.0, 1.0, 1.0]])


@pytest.mark.parametrize("gamma, lambd", [(1.1, 1.0), (1.0, -0.1)])
def test_gamma_and_lambda_outside_the_unit_interval_are_refused(gamma, lambd):
    with pytest.raises(ValueError, match="gamma and lambd"):
        gae(torch.zeros(1, 2), torch.zeros(1, 2), torch.tensor([2]), gamma=gamma, lambd=lambd)
