"""build_train_batch with --advantage-estimator ppo: GAE over the critic's values, KL in the reward.

One sample, reward R = 1, three response tokens, critic values V = [0.5, 0.2, 0.1], kl_coef 1 (k1),
γ = λ = 1; log π_old − log π_ref = [1, 2, 0], so the token rewards are [−1, −2, 0 + R]:
    δ2 = 1 − 0.1 = 0.9    δ1 = −2 + 0.1 − 0.2 = −2.1    δ0 = −1 + 0.2 − 0.5 = −1.3
    A = [−2.5, −1.2, 0.9]    G = A + V = [−2, −1, 1]
"""

import pytest
import torch

from actors.loop.batching import build_train_batch
from policies.algorithm import AlgorithmConfig
from slime_async.sample import Sample, Status

OLD = [[-1.0, -2.0, -0.5]]
REF = [[-2.0, -4.0, -0.5]]
VALUES = [[0.5, 0.2, 0.1]]
SPEC = AlgorithmConfig(advantage_estimator="ppo", kl_coef=1.0, kl_loss_type="k1")


def sample(loss_mask=None) -> Sample:
    s = Sample(group_index=0, index=0, prompt="p", tokens=[5, 6])
    s.append_generated([7, 8, 9], [-1.3, -2.3, -0.8], version=0)
    if loss_mask is not None:
        s.loss_mask = loss_mask
    s.reward = 1.0
    s.status = Status.COMPLETED
    return s


def close(actual, expected):
    torch.testing.assert_close(torch.tensor(actual), torch.tensor(expected), atol=1e-6, rtol=0)


def test_advantages_and_returns_are_gae_over_the_critics_values():
    batch, _ = build_train_batch([[sample()]], SPEC, train_version=0, temperature=1.0, ref_logprobs=REF,
                                 old_logprobs=OLD, values=VALUES)
    close(batch.advantages, [[-2.5, -1.2, 0.9]])
    close(batch.returns, [[-2.0, -1.0, 1.0]])
    assert batch.values == VALUES


def test_a_tool_token_costs_no_kl_and_gets_no_advantage():
    # loss_mask [1, 0, 1]: rewards [−1, 0, 1]; δ1 = 0.1 − 0.2 = −0.1 -> A = [−0.5, 0.8, 0.9], masked
    # to [−0.5, 0, 0.9]; G = [0, 1, 1].
    batch, _ = build_train_batch([[sample([1, 0, 1])]], SPEC, train_version=0, temperature=1.0, ref_logprobs=REF,
                                 old_logprobs=OLD, values=VALUES)
    close(batch.advantages, [[-0.5, 0.0, 0.9]])
    close(batch.returns, [[0.0, 1.0, 1.0]])


def test_lambda_reaches_gae():
    # No KL: rewards [0, 0, 1]; λ = 0 -> A = δ = [0.2 − 0.5, 0.1 − 0.2, 1 − 0.1].
    batch, _ = build_train_batch([[sample()]], AlgorithmConfig(advantage_estimator="ppo"), train_version=0,
                                 temperature=1.0, values=VALUES, lambd=0.0)
    close(batch.advantages, [[-0.3, -0.1, 0.9]])


def test_ppo_without_values_is_refused():
    with pytest.raises(ValueError, match="critic's values"):
        build_train_batch([[sample()]], AlgorithmConfig(advantage_estimator="ppo"), train_version=0, temperature=1.0)
