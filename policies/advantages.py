"""Advantage estimators: rewards of sampled responses -> per-token advantages.

Layout convention: a batch is flat. `rewards: Tensor[N]` holds one scalar reward per response
and `group_ids: Tensor[N]` (integers, any values, any order) says which responses were sampled
from the same prompt. A flat layout with ids instead of `[G, n]` lets groups differ in size
(dynamic sampling and dropped samples make that common). Token-level tensors are `[N, T]`,
response-aligned and right-padded, with `loss_mask [N, T]` (1 = trainable token).

Scalar-per-sample estimators (`grpo_advantages`, ...) return `Tensor[N]`;
`compute_advantages` broadcasts to `[N, T]` with zeros on masked tokens.
"""

from __future__ import annotations

import torch

ADVANTAGE_EPS = 1e-6  # added to the group std (GRPO), as slime and verl do
WHITEN_EPS = 1e-8  # added to the variance when whitening over the batch


def _group_index(group_ids: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Map arbitrary group ids to 0..G-1; return (index per sample, G)."""
    unique_ids, inverse = torch.unique(group_ids, return_inverse=True)
    return inverse, unique_ids.numel()


def _group_sums(values: torch.Tensor, index: torch.Tensor, num_groups: int) -> torch.Tensor:
    return torch.zeros(num_groups, dtype=values.dtype, device=values.device).index_add_(
        0, index, values
    )


def _group_stats(
    rewards: torch.Tensor, group_ids: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-sample (group sum, group size, group mean) as float64 tensors of shape [N].

    float64 because a float32 sum of equal rewards rounds (16 × 2.2 sums to 35.200005), and
    after division by a tiny std that rounding became an advantage of 0.19 for a group with
    nothing to learn; in float64 the sum of up to 2^29 equal float32 values is exact.
    """
    if rewards.shape != group_ids.shape or rewards.dim() != 1:
        raise ValueError(
            f"rewards and group_ids must both be 1-D of equal length, got "
            f"{tuple(rewards.shape)} and {tuple(group_ids.shape)}"
        )
    rewards = rewards.double()
    index, num_groups = _group_index(group_ids)
    sums = _group_sums(rewards, index, num_groups)[index]
    counts = _group_sums(torch.ones_like(rewards), index, num_groups)[index]
    return sums, counts, sums / counts


def _uniform_groups(rewards: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """Per sample: True where every reward of its group is the same value (nothing to learn)."""
    index, num_groups = _group_index(group_ids)
    rewards = rewards.double()
    init = torch.zeros(num_groups, dtype=rewards.dtype, device=rewards.device)
    high = init.scatter_reduce(0, index, rewards, "amax", include_self=False)
    low = init.scatter_reduce(0, index, rewards, "amin", include_self=False)
    return (high == low)[index]


def _centered(rewards: torch.Tensor, group_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(r_i − mean_group in float64, exactly 0 for a group of equal rewards; group sizes)."""
    _, counts, mean = _group_stats(rewards, group_ids)
    centered = rewards.double() - mean
    return torch.where(_uniform_groups(rewards, group_ids), torch.zeros_like(centered), centered), counts


def dr_grpo_advantages(rewards: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """Dr. GRPO: A_i = r_i − mean_{j in group(i)} r_j (no std division, no length bias)."""
    return _centered(rewards, group_ids)[0].float()


def grpo_advantages(
    rewards: torch.Tensor, group_ids: torch.Tensor, eps: float = ADVANTAGE_EPS
) -> torch.Tensor:
    """GRPO: A_i = (r_i − mean_g) / (std_g + eps), std unbiased (Bessel, as torch.std).

    A group whose rewards all agree gets exactly A = 0 (its numerator is set to 0, not left to
    rounding). A group of one sample has no spread to learn from and gets A = 0 too (its
    unbiased std would be 0/0).
    """
    centered, counts = _centered(rewards, group_ids)
    index, num_groups = _group_index(group_ids)
    sq = _group_sums(centered.square(), index, num_groups)[index]
    std = (sq / (counts - 1).clamp_min(1)).sqrt()
    adv = centered / (std + eps)
    return torch.where(counts > 1, adv, torch.zeros_like(adv)).float()


def gspo_advantages(
    rewards: torch.Tensor, group_ids: torch.Tensor, eps: float = ADVANTAGE_EPS
) -> torch.Tensor:
    """GSPO uses GRPO's group-normalised advantages; the difference is in the loss."""
    return grpo_advantages(rewards, group_ids, eps)


def rloo_advantages(rewards: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """RLOO: A_i = r_i − (Σ_{j≠i} r_j) / (n − 1), the mean of the *other* samples.

    Equivalently n/(n−1)·(r_i − mean), computed so; exactly 0 for a group of equal rewards. A
    group of one sample has no baseline and gets A = 0.
    """
    centered, counts = _centered(rewards, group_ids)
    adv = centered * counts / (counts - 1).clamp_min(1)
    return torch.where(counts > 1, adv, torch.zeros_like(adv)).float()


def masked_whiten(values: torch.Tensor, mask: torch.Tensor, eps: float = WHITEN_EPS) -> torch.Tensor:
    """(x − μ) / sqrt(σ² + eps) over the masked entries; masked-out entries become 0.

    μ and σ² (unbiased, Bessel-corrected) are taken over entries with mask = 1 only, in float64
    (float32 rounding of μ would whiten equal values into noise of order 1e-3). When all masked
    entries are equal the result is exactly 0. With fewer than two masked entries the variance
    is taken as 0, so the result is x − μ (= 0 for one). Returned as float32.
    """
    mask = mask.double()
    count = mask.sum()
    if count == 0:
        return torch.zeros_like(values, dtype=torch.float32)
    values = values.double()
    masked_values = values[mask > 0]
    if bool((masked_values == masked_values[0]).all()):
        return torch.zeros_like(values, dtype=torch.float32)
    mean = (values * mask).sum() / count
    centered = (values - mean) * mask
    var = centered.square().sum() / (count - 1).clamp_min(1)
    return (centered * torch.rsqrt(var + eps)).float()


def _check_token_shapes(rewards: torch.Tensor, loss_mask: torch.Tensor) -> None:
    if loss_mask.dim() != 2 or loss_mask.shape[0] != rewards.shape[0]:
        raise ValueError(
            f"loss_mask must be [N, T] with N = len(rewards) = {rewards.shape[0]}, "
            f"got {tuple(loss_mask.shape)}"
        )


def reinforce_plus_plus_returns(
    rewards: torch.Tensor,
    loss_mask: torch.Tensor,
    kl: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    gamma: float = 1.0,
) -> torch.Tensor:
    """Discounted per-token returns of REINFORCE++ (before whitening), shape [N, T].

    Per-token reward: r_t = −kl_coef · kl_t on trainable tokens (0 elsewhere), plus the scalar
    reward R placed on the LAST trainable token. Return: G_t = r_t + γ · G_{t+1}, computed over
    all positions (tool-output positions carry no reward of their own but are still steps of
    the discount, as in slime). A sequence with no trainable token gets all-zero returns.
    """
    _check_token_shapes(rewards, loss_mask)
    mask = loss_mask.float()
    n, t = mask.shape
    token_rewards = torch.zeros(n, t, dtype=torch.float32, device=mask.device)
    if t == 0:
        return token_rewards  # zero-length responses: nothing to credit
    if kl is not None and kl_coef != 0.0:
        token_rewards = token_rewards - kl_coef * kl.float() * mask
    positions = torch.arange(t, device=mask.device).expand(n, t)
    # Index of the last trainable token per row; -1 for an all-masked row.
    last = torch.where(mask > 0, positions, torch.full_like(positions, -1)).max(dim=1).values
    has_token = last >= 0
    rows = torch.arange(n, device=mask.device)[has_token]
    token_rewards[rows, last[has_token]] += rewards.float()[has_token]
    returns = torch.zeros_like(token_rewards)
    running = torch.zeros(n, dtype=torch.float32, device=mask.device)
    for step in range(t - 1, -1, -1):
        running = token_rewards[:, step] + gamma * running
        returns[:, step] = running
    return returns


def reinforce_plus_plus_advantages(
    rewards: torch.Tensor,
    loss_mask: torch.Tensor,
    kl: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    gamma: float = 1.0,
) -> torch.Tensor:
    """REINFORCE++: `reinforce_plus_plus_returns` whitened over all trainable tokens of the batch."""
    returns = reinforce_plus_plus_returns(rewards, loss_mask, kl, kl_coef, gamma)
    return masked_whiten(returns, loss_mask)


def reinforce_plus_plus_baseline_advantages(
    rewards: torch.Tensor,
    group_ids: torch.Tensor,
    loss_mask: torch.Tensor,
    kl: torch.Tensor | None = None,
    kl_coef: float = 0.0,
) -> torch.Tensor:
    """REINFORCE++-baseline: A_t = whiten_batch((r_i − mean_group) − kl_coef · kl_t)."""
    _check_token_shapes(rewards, loss_mask)
    centered = dr_grpo_advantages(rewards, group_ids)
    per_token = centered[:, None].expand(loss_mask.shape).clone()
    if kl is not None and kl_coef != 0.0:
        per_token = per_token - kl_coef * kl.float()
    return masked_whiten(per_token, loss_mask)


_SCALAR_ESTIMATORS = {
    "grpo": grpo_advantages,
    "gspo": gspo_advantages,
    "dr_grpo": dr_grpo_advantages,
    "rloo": rloo_advantages,
}


def compute_advantages(
    estimator: str,
    rewards: torch.Tensor,
    group_ids: torch.Tensor,
    loss_mask: torch.Tensor,
    *,
    kl: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    gamma: float = 1.0,
    normalize: bool = False,
) -> torch.Tensor:
    """Per-token advantages [N, T] for `estimator`, zero on tokens with loss_mask = 0.

    Scalar estimators (grpo, gspo, dr_grpo, rloo) broadcast A_i to every token of response i;
    with `normalize` they are then whitened over all trainable tokens of the batch
    (slime's --normalize-advantages). The REINFORCE++ variants use `kl` ([N, T], e.g. k1 of
    π_old vs π_ref) with `kl_coef` as a reward penalty and are always whitened; `gamma`
    discounts REINFORCE++ returns.
    """
    _check_token_shapes(rewards, loss_mask)
    mask = loss_mask.float()
    if estimator in _SCALAR_ESTIMATORS:
        scalar = _SCALAR_ESTIMATORS[estimator](rewards, group_ids)
        per_token = scalar[:, None] * mask
        return masked_whiten(per_token, mask) if normalize else per_token
    if estimator == "reinforce_plus_plus":
        return reinforce_plus_plus_advantages(rewards, loss_mask, kl, kl_coef, gamma)
    if estimator == "reinforce_plus_plus_baseline":
        return reinforce_plus_plus_baseline_advantages(rewards, group_ids, loss_mask, kl, kl_coef)
    known = sorted([*_SCALAR_ESTIMATORS, "reinforce_plus_plus", "reinforce_plus_plus_baseline"])
    raise ValueError(f"advantage_estimator {estimator!r} is not one of {known}")
