"""The training objective of one micro-batch: the single entry point the trainer calls.

    loss = agg(pg_t · corrections_t) + kl_loss_coef · agg(kl_t) − entropy_coef · agg(H_t)

where pg_t is the SFT, PPO, CISPO or GSPO per-token loss, corrections_t the product of the
enabled off-policy weights (TIS, ICE-POP, MIS, decoupled PPO's behaviour weight) and agg
`policies.losses.aggregate` with `spec.loss_agg` and the caller's global normalizer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from policies.kl import kl_estimate
from policies.algorithm import AlgorithmConfig
from policies.losses import aggregate, cispo_loss, gspo_loss, ppo_clip_loss, sft_loss
from policies.off_policy import (
    decoupled_behaviour_weights,
    icepop_weights,
    mis_weights,
    mismatch_token_stats,
    tis_weights,
)


@dataclass
class ObjectiveOutput:
    """`loss`: differentiable scalar to backpropagate. `metrics`: floats, see compute_objective."""

    loss: torch.Tensor
    metrics: dict[str, float] = field(default_factory=dict)


def compute_objective(
    spec: AlgorithmConfig,
    *,
    logprobs: torch.Tensor,
    loss_mask: torch.Tensor,
    advantages: torch.Tensor | None = None,
    old_logprobs: torch.Tensor | None = None,
    rollout_logprobs: torch.Tensor | None = None,
    ref_logprobs: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
    normalizer: float,
) -> ObjectiveOutput:
    """Loss and metrics of one micro-batch; all tensors `[B, T]` response-aligned.

    logprobs: log π_θ of the sampled tokens (with gradient). old_logprobs: π_old, the trainer's
    recompute before the first optimizer step of a rollout; None means one update per batch,
    where π_old = π_θ.detach() (the same values). With spec.use_rollout_logprobs, π_old is
    rollout_logprobs (μ) instead. rollout_logprobs: μ from the engine (needed by TIS / ICE-POP / MIS /
    decoupled PPO; when given, mismatch metrics are logged even with every correction off).
    ref_logprobs: π_ref for the KL loss. entropy: per-token entropy of π_θ (with gradient when
    entropy_coef > 0). normalizer: the GLOBAL-batch denominator of `aggregate` for
    `spec.loss_agg` (masked tokens of the global batch for token_mean, sequences for
    seq_mean_token_mean, max_len × sequences for seq_mean_token_sum_norm).

    Metrics are aggregated exactly like the loss (same mode, same normalizer), so the trainer
    SUMS them over the micro-batches of a global batch to get the batch value. Keys:
    loss, pg_loss, pg_clipfrac, ppo_kl, kl_loss (0.0 when off), entropy (when given); with
    rollout_logprobs: logprob_abs_diff, logprob_diff, mismatch_k3_kl, tis_weight_mean,
    tis_clipfrac (TIS statistics with spec.tis_clip even when TIS is off), plus
    icepop_dropfrac / mis_weight_mean / mis_affected_frac / decoupled_behave_weight_mean /
    decoupled_dropfrac for the enabled corrections. Under seq_mean_token_sum_norm the
    token-average metrics come out scaled by mean length / max_len.
    """
    spec.validate()

    def agg(per_token: torch.Tensor) -> torch.Tensor:
        return aggregate(per_token, loss_mask, spec.loss_agg, normalizer)

    metrics: dict[str, float] = {}
    if spec.loss_type == "sft":
        loss = agg(sft_loss(logprobs))
        metrics["pg_loss"] = float(loss.detach())
    else:
        per_token, policy_metrics = _policy_loss(
            spec, logprobs, loss_mask, advantages, old_logprobs, rollout_logprobs, agg
        )
        loss = agg(per_token)
        metrics["pg_loss"] = float(loss.detach())
        metrics.update(policy_metrics)

    kl_value = torch.zeros((), dtype=loss.dtype, device=loss.device)
    if spec.use_kl_loss:
        if ref_logprobs is None:
            raise ValueError("use_kl_loss is set but ref_logprobs were not given")
        kl_value = agg(kl_estimate(logprobs, ref_logprobs, spec.kl_loss_type))
        loss = loss + spec.kl_loss_coef * kl_value
    metrics["kl_loss"] = float(kl_value.detach())

    if entropy is not None:
        entropy_value = agg(entropy)
        metrics["entropy"] = float(entropy_value.detach())
        if spec.entropy_coef != 0.0:
            loss = loss - spec.entropy_coef * entropy_value
    elif spec.entropy_coef != 0.0:
        raise ValueError(f"entropy_coef={spec.entropy_coef} but entropy was not given")

    metrics["loss"] = float(loss.detach())
    return ObjectiveOutput(loss=loss, metrics=metrics)


def _policy_loss(
    spec: AlgorithmConfig,
    logprobs: torch.Tensor,
    loss_mask: torch.Tensor,
    advantages: torch.Tensor | None,
    old_logprobs: torch.Tensor | None,
    rollout_logprobs: torch.Tensor | None,
    agg: Callable[[torch.Tensor], torch.Tensor],
) -> tuple[torch.Tensor, dict[str, float]]:
    """Per-token policy loss with the enabled off-policy corrections applied, and its metrics."""
    if advantages is None:
        raise ValueError(f"loss_type='policy_loss' ({spec.policy_loss}) needs advantages")
    if spec.use_rollout_logprobs:
        if rollout_logprobs is None:
            raise ValueError("use_rollout_logprobs needs rollout_logprobs, which were not given")
        old = rollout_logprobs.detach()
    else:
        old = logprobs.detach() if old_logprobs is None else old_logprobs.detach()
    advantages = advantages.detach()
    if spec.policy_loss == "ppo":
        terms = ppo_clip_loss(logprobs, old, advantages, spec.eps_clip, spec.clip_high, spec.eps_clip_c)
    elif spec.policy_loss == "cispo":
        terms = cispo_loss(logprobs, old, advantages, spec.eps_clip, spec.clip_high)
    else:
        terms = gspo_loss(logprobs, old, advantages, loss_mask, spec.eps_clip, spec.clip_high, spec.eps_clip_c)

    metrics = {
        "pg_clipfrac": float(agg(terms.clipfrac)),
        "ppo_kl": float(agg(terms.ppo_kl)),
    }
    per_token = terms.loss
    if rollout_logprobs is None:
        needs = [
            name
            for name, on in (
                ("use_tis", spec.use_tis),
                ("use_icepop", spec.use_icepop),
                ("mis_level", spec.mis_level is not None),
                ("use_decoupled_ppo", spec.use_decoupled_ppo),
            )
            if on
        ]
        if needs:
            raise ValueError(f"{', '.join(needs)} need rollout_logprobs, which were not given")
        return per_token, metrics

    # With π_old = μ the mismatch is measured on π_θ instead (as slime does).
    trainer_side = logprobs.detach() if spec.use_rollout_logprobs else old
    for name, value in mismatch_token_stats(trainer_side, rollout_logprobs).items():
        metrics[name] = float(agg(value))
    tis = tis_weights(trainer_side, rollout_logprobs, loss_mask, spec.tis_clip, spec.tis_clip_low)
    metrics["tis_weight_mean"] = float(agg(tis.weights))
    metrics["tis_clipfrac"] = float(agg(tis.affected))
    if spec.use_tis:
        per_token = per_token * tis.weights
    if spec.use_icepop:
        kept = icepop_weights(old, rollout_logprobs, loss_mask, spec.icepop_low, spec.icepop_high)
        per_token = per_token * kept.weights
        metrics["icepop_dropfrac"] = float(agg(kept.affected))
    if spec.mis_level is not None:
        mis = mis_weights(
            old,
            rollout_logprobs,
            loss_mask,
            spec.mis_level,
            spec.mis_mode,
            spec.mis_threshold_low,
            spec.mis_threshold_high,
        )
        per_token = per_token * mis.weights
        metrics["mis_weight_mean"] = float(agg(mis.weights))
        metrics["mis_affected_frac"] = float(agg(mis.affected))
    if spec.use_decoupled_ppo:
        behave = decoupled_behaviour_weights(
            old, rollout_logprobs, loss_mask, spec.decoupled_behave_cap
        )
        per_token = per_token * behave.weights
        metrics["decoupled_behave_weight_mean"] = float(agg(behave.weights))
        metrics["decoupled_dropfrac"] = float(agg(behave.affected))
    return per_token, metrics
