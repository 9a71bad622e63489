"""Corrections for training on tokens the trainer's policy did not generate.

Three policies meet here (per token, log-probabilities of the sampled token, `[B, T]`):
    μ      rollout_logprobs  the engine that sampled the token (behaviour policy),
    π_old  old_logprobs      the trainer's recompute before the update (proximal policy),
    π_θ    logprobs          the policy being optimised.
π_old/μ captures the train-inference mismatch (different kernels, precision) and, in async
modes, staleness. Every weight returned here is a constant (no gradient) and is 0 on tokens
with loss_mask = 0.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

MIS_LEVELS = ("sequence", "geometric")
MIS_MODES = ("truncate", "clip", "mask")

# Log-ratios are clamped before exp() so a pathological sequence cannot produce inf.
_MAX_LOG_WEIGHT = 20.0


class CorrectionWeights(NamedTuple):
    """Per-token weights and a 0/1 mask of the tokens the correction changed (for metrics)."""

    weights: torch.Tensor
    affected: torch.Tensor


def _log_ratio(old_logprobs: torch.Tensor, rollout_logprobs: torch.Tensor) -> torch.Tensor:
    return (old_logprobs.detach().float() - rollout_logprobs.detach().float())


def tis_weights(
    old_logprobs: torch.Tensor,
    rollout_logprobs: torch.Tensor,
    loss_mask: torch.Tensor,
    clip: float,
    clip_low: float = 0.0,
) -> CorrectionWeights:
    """Token-level truncated importance sampling (TIS).

        w_t = clamp(π_old/μ, clip_low, clip) · m_t        affected_t = 1 where the clamp acted

    Truncation trades a little bias for bounded variance: a token the engine found unlikely
    but the trainer finds likely would otherwise get an unbounded weight.
    """
    mask = loss_mask.float()
    ratio = torch.exp(_log_ratio(old_logprobs, rollout_logprobs).clamp(max=_MAX_LOG_WEIGHT))
    clamped = ratio.clamp(clip_low, clip)
    affected = (clamped != ratio).float() * mask
    return CorrectionWeights(clamped * mask, affected)


def icepop_weights(
    old_logprobs: torch.Tensor,
    rollout_logprobs: torch.Tensor,
    loss_mask: torch.Tensor,
    low: float,
    high: float,
) -> CorrectionWeights:
    """ICE-POP: the IS weight π_old/μ inside the band, 0 outside it (as slime's `icepop`).

        w_t = π_old/μ · m_t   if low <= π_old/μ <= high,   else 0

    Like TIS the kept tokens are importance-weighted; unlike TIS a token whose ratio leaves
    the band is discarded outright (its gradient is considered noise) instead of truncated.
    affected = the dropped tokens.
    """
    mask = loss_mask.float()
    ratio = torch.exp(_log_ratio(old_logprobs, rollout_logprobs).clamp(max=_MAX_LOG_WEIGHT))
    keep = ((ratio >= low) & (ratio <= high)).float()
    return CorrectionWeights(ratio * keep * mask, (1.0 - keep) * mask)


def mis_weights(
    old_logprobs: torch.Tensor,
    rollout_logprobs: torch.Tensor,
    loss_mask: torch.Tensor,
    level: str,
    mode: str,
    low: float,
    high: float,
) -> CorrectionWeights:
    """Sequence-level importance weight, broadcast to the sequence's trainable tokens.

        level="sequence":  w_i = Π_t (π_old/μ)          = exp( Σ_t m_t · log(π_old/μ) )
        level="geometric": w_i = (Π_t (π_old/μ))^(1/n)  = exp( Σ_t m_t · log(π_old/μ) / n )
        mode="truncate": w = min(w, high)            (upper bound only)
        mode="clip":     w = clamp(w, low, high)
        mode="mask":     w if low <= w <= high else 0 (reject the whole sequence)

    A sequence with no trainable token has n = 0, log w = 0 and all-zero weights. affected = the
    trainable tokens of sequences whose weight was truncated, clipped or rejected.
    """
    if level not in MIS_LEVELS:
        raise ValueError(f"mis_level {level!r} is not one of {list(MIS_LEVELS)}")
    if mode not in MIS_MODES:
        raise ValueError(f"mis_mode {mode!r} is not one of {list(MIS_MODES)}")
    mask = loss_mask.float()
    log_w = (_log_ratio(old_logprobs, rollout_logprobs) * mask).sum(dim=-1, keepdim=True)
    if level == "geometric":
        log_w = log_w / mask.sum(dim=-1, keepdim=True).clamp_min(1.0)
    # Compare in log space: a long sequence's product over/underflows in float32.
    log_low = math.log(low) if low > 0 else -math.inf
    log_high = math.log(high)
    above = log_w > log_high
    below = log_w < log_low
    if mode == "truncate":
        affected = above
        w = torch.exp(log_w.clamp(max=log_high))
    elif mode == "clip":
        affected = above | below
        w = torch.exp(log_w.clamp(min=log_low, max=log_high))
    else:
        affected = above | below
        w = torch.where(affected, torch.zeros_like(log_w), torch.exp(log_w.clamp(max=log_high)))
    return CorrectionWeights(w * mask, affected.float() * mask)


def decoupled_behaviour_weights(
    proximal_logprobs: torch.Tensor,
    behaviour_logprobs: torch.Tensor,
    loss_mask: torch.Tensor,
    cap: float | None = None,
) -> CorrectionWeights:
    """Behaviour weight of AReaL's decoupled PPO: w_t = π_prox/μ, 0 where it exceeds `cap`.

    Decoupled PPO (Fu et al., AReaL) separates the two roles π_old plays in PPO:
        L_t = w_t · max(−A · r_t, −A · clamp(r_t, 1 − ε, 1 + ε)),   r_t = π_θ / π_prox
    the trust region is measured against the recent proximal policy π_prox (the trainer's
    recompute) while w_t corrects for the stale behaviour policy μ that sampled the token.
    Tokens with w_t > cap are dropped (weight 0) rather than clipped, as in AReaL.
    Use `ppo_clip_loss(logprobs, proximal_logprobs, ...)` for the clipped term.
    """
    mask = loss_mask.float()
    w = torch.exp(_log_ratio(proximal_logprobs, behaviour_logprobs).clamp(max=_MAX_LOG_WEIGHT))
    if cap is None:
        return CorrectionWeights(w * mask, torch.zeros_like(mask))
    dropped = (w > cap).float() * mask
    return CorrectionWeights(w * mask * (1.0 - dropped), dropped)


def mismatch_token_stats(
    old_logprobs: torch.Tensor, rollout_logprobs: torch.Tensor
) -> dict[str, torch.Tensor]:
    """Per-token train-inference mismatch statistics ([B, T] each, unmasked).

        logprob_abs_diff = |logπ_old − logμ|
        logprob_diff     = logπ_old − logμ
        mismatch_k3_kl   = k3 estimate of KL(μ || π_old) = π_old/μ − log(π_old/μ) − 1
    """
    diff = _log_ratio(old_logprobs, rollout_logprobs)
    return {
        "logprob_abs_diff": diff.abs(),
        "logprob_diff": diff,
        "mismatch_k3_kl": torch.exp(diff.clamp(max=_MAX_LOG_WEIGHT)) - diff - 1.0,
    }
