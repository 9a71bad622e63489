"""What a `AlgorithmConfig` needs computed before training: the frozen reference's logprobs, π_old.

Pure functions of the spec. The loop asks them before it builds a batch (which logprobs to fetch
from the trainer), the trainer actor before several optimizer steps on one rollout, and the run
config when it decides whether the trainer keeps a reference model.
"""

from __future__ import annotations

from policies.algorithm import AlgorithmConfig

# The estimators whose advantages take slime's --kl-coef penalty KL(π_old || π_ref) in the reward.
_KL_PENALISED_ESTIMATORS = ("reinforce_plus_plus", "reinforce_plus_plus_baseline", "ppo")


def needs_reference(spec: AlgorithmConfig) -> bool:
    """Whether the loss or the advantages use the frozen reference model's logprobs."""
    return spec.use_kl_loss or spec.kl_coef > 0


def needs_old_logprobs(spec: AlgorithmConfig) -> bool:
    """Whether several optimizer steps on one rollout need a recomputed π_old: the policy losses,
    unless --use-rollout-logprobs takes the engine's logprobs (μ) as π_old."""
    return spec.loss_type == "policy_loss" and not spec.use_rollout_logprobs


def needs_old_for_advantages(spec: AlgorithmConfig) -> bool:
    """Whether the advantages need π_old before training: the --kl-coef reward penalty of the
    estimators that take it, and on-policy distillation's reverse KL (with --use-rollout-logprobs,
    μ stands in for π_old)."""
    return not spec.use_rollout_logprobs and (
        spec.use_opd or (spec.kl_coef > 0 and spec.advantage_estimator in _KL_PENALISED_ESTIMATORS))


def needs_trainer_teacher(spec: AlgorithmConfig) -> bool:
    """Whether the trainer ranks forward a frozen teacher (--opd-type megatron) before training."""
    return spec.use_opd and spec.opd_type == "megatron"


def needs_engine_teacher(spec: AlgorithmConfig) -> bool:
    """Whether the rollout has a teacher engine score every final sample (--opd-type sglang)."""
    return spec.use_opd and spec.opd_type == "sglang"
