"""AlgorithmConfig validation: contradictory knobs fail with the field's name."""

import dataclasses

import pytest

from policies.algorithm import AlgorithmConfig


def test_defaults_are_valid_grpo_with_ppo_clipping():
    spec = AlgorithmConfig().validate()
    assert (spec.loss_type, spec.advantage_estimator, spec.policy_loss) == ("policy_loss", "grpo", "ppo")
    assert spec.eps_clip == 0.2


def test_clip_high_defaults_to_eps_clip():
    assert AlgorithmConfig(eps_clip=0.25).clip_high == 0.25
    assert AlgorithmConfig(eps_clip=0.2, eps_clip_high=0.28).clip_high == 0.28


def test_spec_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        AlgorithmConfig().eps_clip = 0.3  # type: ignore[misc]


@pytest.mark.parametrize(
    ("overrides", "field_name"),
    [
        ({"loss_type": "dpo"}, "loss_type"),
        ({"advantage_estimator": "gae"}, "advantage_estimator"),
        ({"policy_loss": "reinforce"}, "policy_loss"),
        ({"kl_loss_type": "k4"}, "kl_loss_type"),
        ({"loss_agg": "sum"}, "loss_agg"),
        ({"mis_level": "token"}, "mis_level"),
        ({"mis_mode": "drop"}, "mis_mode"),
        ({"eps_clip_c": 1.0}, "eps_clip_c"),
        ({"eps_clip": -0.1}, "eps_clip"),
        ({"tis_clip": 0.5, "tis_clip_low": 1.0}, "tis_clip"),
        ({"icepop_low": 2.0, "icepop_high": 1.0}, "icepop_high"),
        ({"mis_threshold_low": 3.0, "mis_threshold_high": 2.0}, "mis_threshold_high"),
        ({"use_kl_loss": True, "kl_loss_coef": -0.1}, "kl_loss_coef"),
        ({"entropy_coef": -0.01}, "entropy_coef"),
        ({"kl_coef": -0.1}, "kl_coef"),
        ({"use_tis": True, "mis_level": "sequence"}, "use_tis"),
        ({"use_decoupled_ppo": True, "use_tis": True}, "use_decoupled_ppo"),
        ({"use_decoupled_ppo": True, "policy_loss": "cispo"}, "use_decoupled_ppo"),
        ({"decoupled_behave_cap": 0.0}, "decoupled_behave_cap"),
        ({"use_icepop": True, "use_tis": True}, "use_icepop"),
        ({"use_rollout_logprobs": True, "use_tis": True}, "use_rollout_logprobs"),
        ({"use_rollout_logprobs": True, "use_decoupled_ppo": True}, "use_rollout_logprobs"),
        ({"gamma": 1.5}, "gamma"),
    ],
)
def test_validate_names_the_offending_field(overrides, field_name):
    with pytest.raises(ValueError, match=field_name):
        AlgorithmConfig(**overrides).validate()


def test_a_kl_loss_with_coefficient_zero_is_accepted_as_in_slime_recipes():
    # slime's scripts pass --use-kl-loss --kl-loss-coef 0.0 to log the KL without training on it.
    AlgorithmConfig(use_kl_loss=True, kl_loss_coef=0.0).validate()


def test_dual_clip_above_one_is_accepted():
    AlgorithmConfig(eps_clip_c=3.0).validate()
