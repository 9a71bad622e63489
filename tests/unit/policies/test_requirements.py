"""What a AlgorithmConfig needs before training: the reference's logprobs, π_old for the steps, π_old for
the advantages. Each case is the spec's flags read against the rule in the test's name."""

import pytest

from policies.algorithm import AlgorithmConfig
from policies.requirements import needs_old_for_advantages, needs_old_logprobs, needs_reference


# ----- the frozen reference ---------------------------------------------------------------------

def test_vanilla_grpo_needs_no_reference():
    assert not needs_reference(AlgorithmConfig())


def test_the_kl_loss_needs_the_reference():
    assert needs_reference(AlgorithmConfig(use_kl_loss=True))


def test_the_kl_loss_needs_the_reference_even_with_coefficient_zero():
    # slime's recipes pass --use-kl-loss --kl-loss-coef 0: the KL is still measured and logged.
    assert needs_reference(AlgorithmConfig(use_kl_loss=True, kl_loss_coef=0.0))


def test_the_kl_reward_penalty_needs_the_reference():
    assert needs_reference(AlgorithmConfig(advantage_estimator="reinforce_plus_plus", kl_coef=0.1))


# ----- π_old for several optimizer steps on one rollout -----------------------------------------

@pytest.mark.parametrize("policy_loss", ["ppo", "cispo", "gspo"])
def test_every_policy_loss_needs_a_recomputed_pi_old(policy_loss):
    assert needs_old_logprobs(AlgorithmConfig(policy_loss=policy_loss))


def test_rollout_logprobs_stand_in_for_pi_old():
    assert not needs_old_logprobs(AlgorithmConfig(use_rollout_logprobs=True))


def test_sft_needs_no_pi_old():
    assert not needs_old_logprobs(AlgorithmConfig(loss_type="sft"))


# ----- π_old for the advantages ----------------------------------------------------------------

@pytest.mark.parametrize("estimator", ["reinforce_plus_plus", "reinforce_plus_plus_baseline", "ppo"])
def test_the_kl_reward_penalty_needs_pi_old(estimator):
    assert needs_old_for_advantages(AlgorithmConfig(advantage_estimator=estimator, kl_coef=0.1))


@pytest.mark.parametrize("estimator", ["reinforce_plus_plus", "reinforce_plus_plus_baseline", "ppo"])
def test_without_the_penalty_the_advantages_need_no_pi_old(estimator):
    assert not needs_old_for_advantages(AlgorithmConfig(advantage_estimator=estimator))


@pytest.mark.parametrize("estimator", ["grpo", "dr_grpo", "rloo", "gspo"])
def test_the_scalar_estimators_ignore_the_penalty_so_need_no_pi_old(estimator):
    assert not needs_old_for_advantages(AlgorithmConfig(advantage_estimator=estimator, kl_coef=1.0))


def test_rollout_logprobs_stand_in_for_pi_old_in_the_penalty():
    assert not needs_old_for_advantages(AlgorithmConfig(advantage_estimator="reinforce_plus_plus", kl_coef=1.0,
                                                 use_rollout_logprobs=True))
