"""Per-token policy losses and their aggregation into one scalar.

All tensors are `[B, T]`, response-aligned; `logprobs` carries the gradient, `old_logprobs`
(π_old) and `advantages` are treated as constants. Every loss here is to be MINIMISED.
Convention shared with slime: ppo_kl = log π_old − log π_θ, so ratio = exp(−ppo_kl).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

AGGREGATIONS = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm")


class PolicyLossTerms(NamedTuple):
    """Per-token output of a policy loss: the loss, where clipping was active, and ppo_kl."""

    loss: torch.Tensor
    clipfrac: torch.Tensor
    ppo_kl: torch.Tensor


def ppo_clip_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    eps_clip: float,
    eps_clip_high: float | None = None,
    eps_clip_c: float | None = None,
) -> PolicyLossTerms:
    """PPO clipped surrogate, with clip-higher and dual clip.

        ratio = exp(logπ_θ − logπ_old)
        L1 = −A · ratio,   L2 = −A · clamp(ratio, 1 − eps_clip, 1 + eps_clip_high)
        L  = max(L1, L2)                         clipfrac = 1 where L2 > L1
        dual clip (only where A < 0): L = min(L, −A · eps_clip_c)

    The dual clip bounds the loss of a negative-advantage token whose ratio has grown huge
    (ratio > eps_clip_c), where plain PPO's max() would let it grow without limit.
    """
    high = eps_clip if eps_clip_high is None else eps_clip_high
    ppo_kl = old_logprobs - logprobs
    ratio = torch.exp(-ppo_kl)
    loss_unclipped = -advantages * ratio
    loss_clipped = -advantages * ratio.clamp(1.0 - eps_clip, 1.0 + high)
    loss = torch.maximum(loss_unclipped, loss_clipped)
    clipfrac = (loss_clipped > loss_unclipped).float()
    return PolicyLossTerms(_dual_clip(loss, advantages, eps_clip_c), clipfrac, ppo_kl.detach())


def _dual_clip(loss: torch.Tensor, advantages: torch.Tensor, eps_clip_c: float | None) -> torch.Tensor:
    """Dual clip: where A < 0, L = min(L, −A · eps_clip_c) (slime's compute_policy_loss)."""
    if eps_clip_c is None:
        return loss
    if eps_clip_c <= 1.0:
        raise ValueError(f"eps_clip_c (dual clip) must be > 1, got {eps_clip_c}")
    return torch.where(advantages < 0, torch.minimum(loss, -advantages * eps_clip_c), loss)


def cispo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    eps_clip: float,
    eps_clip_high: float | None = None,
) -> PolicyLossTerms:
    """CISPO (MiniMax-M1): REINFORCE with a clipped, stop-gradient importance weight.

        w = sg(clamp(ratio, 1 − eps_clip, 1 + eps_clip_high)),   L = −w · A · logπ_θ

    Unlike PPO no token loses its gradient: clipping only caps the weight. MiniMax uses a large
    eps_clip (no lower bound in practice) and tunes eps_clip_high. clipfrac = 1 where the
    weight was clamped.
    """
    high = eps_clip if eps_clip_high is None else eps_clip_high
    ppo_kl = (old_logprobs - logprobs).detach()
    ratio = torch.exp(-ppo_kl)
    weight = ratio.clamp(1.0 - eps_clip, 1.0 + high)
    clipfrac = (weight != ratio).float()
    loss = -weight * advantages * logprobs
    return PolicyLossTerms(loss, clipfrac, ppo_kl)


def gspo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    eps_clip: float,
    eps_clip_high: float | None = None,
    eps_clip_c: float | None = None,
) -> PolicyLossTerms:
    """GSPO (Qwen): PPO clipping applied to a sequence-level, length-normalised ratio.

        s_i = exp( Σ_t m_t (logπ_θ − logπ_old) / max(1, Σ_t m_t) )       (one value per sequence)
        s_{i,t} = sg(s_i) · exp(logπ_θ,t − sg(logπ_θ,t))                  (GSPO-token form)
        L_{i,t} = max(−A_{i,t} · s_{i,t}, −A_{i,t} · clamp(s_{i,t}, 1 − eps_clip, 1 + eps_clip_high))

    s_{i,t} equals s_i in value and has gradient s_i · ∇logπ_θ,t, so averaging L over a
    sequence's tokens (loss_agg = seq_mean_token_mean) gives exactly GSPO's gradient
    s_i · A_i · (1/|y_i|) Σ_t ∇logπ_θ,t. Clipping is therefore all-or-nothing per sequence;
    clipfrac and ppo_kl (= −log s_i) are broadcast to the sequence's tokens. With eps_clip_c
    the dual clip bounds L of negative-advantage sequences by −A · eps_clip_c, as slime applies
    it to GSPO's sequence ratio (per token, so the whole sequence is bounded together).
    """
    high = eps_clip if eps_clip_high is None else eps_clip_high
    mask = loss_mask.to(logprobs.dtype)
    lengths = mask.sum(dim=-1, keepdim=True).clamp_min(1.0)
    log_seq_ratio = ((logprobs - old_logprobs) * mask).sum(dim=-1, keepdim=True) / lengths
    log_token_ratio = log_seq_ratio.detach() + logprobs - logprobs.detach()
    ratio = torch.exp(log_token_ratio)
    loss_unclipped = -advantages * ratio
    loss_clipped = -advantages * ratio.clamp(1.0 - eps_clip, 1.0 + high)
    loss = torch.maximum(loss_unclipped, loss_clipped)
    clipfrac = (loss_clipped > loss_unclipped).float()
    ppo_kl = (-log_seq_ratio).detach().expand_as(logprobs)
    return PolicyLossTerms(_dual_clip(loss, advantages, eps_clip_c), clipfrac, ppo_kl)


def sft_loss(logprobs: torch.Tensor) -> torch.Tensor:
    """Supervised fine-tuning: per-token negative log-likelihood, L_t = −logπ_θ(y_t)."""
    return -logprobs


def aggregate(
    per_token: torch.Tensor, loss_mask: torch.Tensor, mode: str, normalizer: float
) -> torch.Tensor:
    """Reduce a per-token quantity of ONE micro-batch to its share of the GLOBAL-batch scalar.

    Gradient accumulation sums micro-batch losses, so each micro-batch divides by the global
    denominator, never by its own size; summing the returned values over all micro-batches of
    a global batch then gives exactly the full-batch value. The caller passes:

        mode                       value returned                       normalizer
        token_mean                 Σ_{i,t} m·x / normalizer             masked tokens of the global batch
        seq_mean_token_mean        Σ_i [Σ_t m·x / max(1, Σ_t m)] / norm  sequences of the global batch
        seq_mean_token_sum_norm    Σ_{i,t} m·x / normalizer             max_len × sequences (Dr. GRPO's
                                                                       constant; max_len fixed per run)

    A sequence with no trainable token contributes 0. normalizer = 0 is accepted only for a
    micro-batch without trainable tokens (the result is then 0); otherwise it is a caller bug
    and raises.
    """
    if mode not in AGGREGATIONS:
        raise ValueError(f"loss_agg {mode!r} is not one of {list(AGGREGATIONS)}")
    if normalizer < 0:
        raise ValueError(f"aggregate normalizer must be >= 0, got {normalizer}")
    if normalizer == 0 and bool((loss_mask > 0).any()):
        raise ValueError(
            f"aggregate normalizer is 0 but the micro-batch has trainable tokens; pass the "
            f"global-batch denominator for loss_agg={mode!r}"
        )
    mask = loss_mask.to(per_token.dtype)
    denom = normalizer if normalizer > 0 else 1.0
    # where() rather than a product: padding positions may hold inf/nan (e.g. −inf logprobs).
    masked = torch.where(loss_mask > 0, per_token, torch.zeros_like(per_token))
    if mode == "seq_mean_token_mean":
        lengths = mask.sum(dim=-1).clamp_min(1.0)
        return (masked.sum(dim=-1) / lengths).sum() / denom
    return masked.sum() / denom
