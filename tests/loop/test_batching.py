"""build_train_batch: the REINFORCE++ KL penalty uses --kl-loss-type on π_old, as slime does.

One sample, reward R = 1, three response tokens, kl_coef 1, γ = 1:
    log π_old − log π_ref = [1, 2, 0]   (μ, the rollout logprobs, differ: π_old − μ = [0.3, 0.3, 0.3])
    k2 = ½ · log_ratio²    = [0.5, 2, 0]
    returns G_t = Σ_{s>=t} −kl_s + R·[t = last] = [−1.5, −1, 1]
    whitened over the 3 tokens: mean −0.5, centered [−1, −0.5, 1.5], unbiased var 3.5/2 = 1.75,
    std 1.3228757 -> [−0.7559289, −0.3779645, 1.1338934]
"""

import pytest
import torch

from actors.loop.batching import build_train_batch
from policies.algorithm import AlgorithmConfig
from slime_async.sample import Sample, Status

OLD = [[-1.0, -2.0, -0.5]]
REF = [[-2.0, -4.0, -0.5]]
ROLLOUT = [-1.3, -2.3, -0.8]


def sample() -> Sample:
    s = Sample(group_index=0, index=0, prompt="p", tokens=[5, 6])
    s.append_generated([7, 8, 9], ROLLOUT, version=0)
    s.reward = 1.0
    s.status = Status.COMPLETED
    return s


def advantages(spec: AlgorithmConfig, old=OLD) -> list[float]:
    batch, _ = build_train_batch([[sample()]], spec, train_version=0, temperature=1.0, ref_logprobs=REF,
                                 old_logprobs=old)
    return batch.advantages[0]


SPEC = AlgorithmConfig(advantage_estimator="reinforce_plus_plus", kl_coef=1.0, kl_loss_type="k2")


def test_reinforce_plus_plus_kl_penalty_is_the_configured_estimator_of_pi_old_against_the_reference():
    torch.testing.assert_close(torch.tensor(advantages(SPEC)), torch.tensor([-0.7559289, -0.3779645, 1.1338934]))


def test_use_rollout_logprobs_takes_the_penalty_on_mu_instead():
    # μ − π_ref = [0.7, 1.7, −0.3]; k1 = the same -> G = [−2.1 + 1, −1.4 + 1, 0.3 + 1] = [−1.1, −0.4, 1.3]
    # mean −0.0666667, centered [−1.0333333, −0.3333333, 1.3666667], var (1.0677778 + 0.1111111
    # + 1.8677778)/2 = 1.5233333, std 1.2342339 -> [−0.8372247, −0.2700725, 1.1072972]
    spec = AlgorithmConfig(advantage_estimator="reinforce_plus_plus", kl_coef=1.0, kl_loss_type="k1",
                    use_rollout_logprobs=True)
    torch.testing.assert_close(torch.tensor(advantages(spec, old=None)),
                               torch.tensor([-0.8372247, -0.2700725, 1.1072972]))


def test_the_penalty_without_pi_old_is_refused():
    with pytest.raises(ValueError, match="kl-coef"):
        advantages(SPEC, old=None)


def test_pi_old_travels_in_the_batch():
    batch, _ = build_train_batch([[sample()]], SPEC, train_version=0, temperature=1.0, ref_logprobs=REF,
                                 old_logprobs=OLD)
    assert batch.old_logprobs == OLD


def test_the_train_batch_carries_each_samples_engine_experts_for_r3_and_none_without():
    with_experts = sample()
    with_experts.rollout_routed_experts = [[[0, 1]], [[2, 3]], [[1, 3]], [[0, 2]]]  # 5 tokens -> 4 rows, 1 layer
    batch, _ = build_train_batch([[with_experts, sample()]], AlgorithmConfig(), train_version=0, temperature=1.0)
    assert batch.routed_experts[0].shape == (4, 1, 2) and batch.routed_experts[0][2].tolist() == [[1, 3]]
    assert batch.routed_experts[1] is None  # routed by the trainer itself
    plain, _ = build_train_batch([[sample()]], AlgorithmConfig(), train_version=0, temperature=1.0)
    assert plain.routed_experts is None
