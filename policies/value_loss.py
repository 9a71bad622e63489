"""The critic's objective: PPO's clipped value loss, and how well values explain returns.

All tensors `[B, T]`, response-aligned; `values` carries the gradient, `old_values` (what the
critic predicted for this rollout before its update) and `returns` are constants.

    V_clip = V_old + clamp(V − V_old, −c, c)
    L_t    = max((V_clip − G)², (V − G)²)            clipfrac_t = 1 where |V − V_old| > c

as slime's value_loss_function (no ½ factor), aggregated like the policy loss
(`policies.losses.aggregate`, the loss mask and the caller's global normalizer).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from policies.losses import aggregate


class ValueLossTerms(NamedTuple):
    loss: torch.Tensor  # scalar, this micro-batch's share of the global-batch loss
    clipfrac: torch.Tensor  # scalar, aggregated the same way


def clipped_value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    loss_mask: torch.Tensor,
    *,
    value_clip: float,
    loss_agg: str,
    normalizer: float,
) -> ValueLossTerms:
    if value_clip <= 0:
        raise ValueError(f"value_clip must be > 0, got {value_clip}")
    old_values, returns = old_values.detach().float(), returns.detach().float()
    values = values.float()
    clipped = old_values + (values - old_values).clamp(-value_clip, value_clip)
    per_token = torch.maximum((clipped - returns).square(), (values - returns).square())
    clipped_frac = ((values - old_values).abs() > value_clip).float()
    mask = loss_mask.float()
    return ValueLossTerms(
        aggregate(per_token, mask, loss_agg, normalizer),
        aggregate(clipped_frac.detach(), mask, loss_agg, normalizer),
    )


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> float | None:
    """1 − Var(G − V) / Var(G) over the masked tokens (population variances); None when the
    returns do not vary (nothing to explain) or no token is masked in."""
    mask = mask.float()
    count = mask.sum()
    if count == 0:
        return None

    def var(x: torch.Tensor) -> torch.Tensor:
        mean = (x * mask).sum() / count
        return ((x - mean).square() * mask).sum() / count

    var_returns = var(returns.float())
    if var_returns <= 0:
        return None
    return float(1.0 - var(returns.float() - values.float()) / var_returns)


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> float | None:
    mask = mask.float()
    count = mask.sum()
    return float((values.float() * mask).sum() / count) if count > 0 else None
