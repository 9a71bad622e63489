"""PPO with a critic: per-token rewards and Generalised Advantage Estimation (GAE).

Layout as in `policies.advantages`: `[N, T]` response-aligned, right-padded tensors, with
`response_lengths [N]` saying where each row's response ends (positions >= length are padding).

Semantics follow slime's `--advantage-estimator ppo`:
- the scalar reward R sits on the LAST response token, and −kl_coef · kl_t on every token (a KL
  penalty in the reward, slime's --kl-coef);
- GAE runs over every response position, tool-observation tokens (loss_mask 0) included: they
  are steps of the recurrence with their own value and no reward of their own; the loss mask
  only decides which tokens the policy and value losses train on;
- the episode ends after the last response token: V(s_L) = 0.

    δ_t = r_t + γ · V_{t+1} − V_t          A_t = δ_t + γλ · A_{t+1}          G_t = A_t + V_t

Returns G (the critic's targets) are taken before any advantage whitening.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from policies.advantages import masked_whiten


class GaeOutput(NamedTuple):
    advantages: torch.Tensor  # [N, T], zero on padding (and on loss-masked tokens)
    returns: torch.Tensor  # [N, T], zero on padding


def response_mask(response_lengths: torch.Tensor, width: int) -> torch.Tensor:
    """[N, T] float mask: 1 where position t < response_length of the row."""
    positions = torch.arange(width, device=response_lengths.device)
    return (positions[None, :] < response_lengths[:, None]).float()


def ppo_token_rewards(
    rewards: torch.Tensor,
    response_lengths: torch.Tensor,
    width: int,
    kl: torch.Tensor | None = None,
    kl_coef: float = 0.0,
) -> torch.Tensor:
    """Per-token rewards [N, T]: −kl_coef · kl_t on response tokens, plus R on the last one.

    ``kl`` is [N, T] (already zero where the caller wants no penalty, e.g. tool output). A row
    with an empty response gets no reward (there is no token to put it on).
    """
    if rewards.dim() != 1 or response_lengths.shape != rewards.shape:
        raise ValueError(
            f"rewards and response_lengths must both be 1-D of equal length, got "
            f"{tuple(rewards.shape)} and {tuple(response_lengths.shape)}"
        )
    lengths = response_lengths.long()
    in_response = response_mask(lengths, width)
    token_rewards = torch.zeros(rewards.shape[0], width, dtype=torch.float32, device=rewards.device)
    if kl is not None and kl_coef != 0.0:
        token_rewards = token_rewards - kl_coef * kl.float() * in_response
    rows = torch.nonzero(lengths > 0).flatten()
    token_rewards[rows, lengths[rows] - 1] += rewards.float()[rows]
    return token_rewards


def gae(
    token_rewards: torch.Tensor,
    values: torch.Tensor,
    response_lengths: torch.Tensor,
    gamma: float,
    lambd: float,
) -> GaeOutput:
    """GAE advantages and returns [N, T]; values and rewards past a row's length are ignored."""
    if token_rewards.shape != values.shape or token_rewards.dim() != 2:
        raise ValueError(
            f"token_rewards and values must both be [N, T], got {tuple(token_rewards.shape)} and "
            f"{tuple(values.shape)}"
        )
    if not 0.0 <= gamma <= 1.0 or not 0.0 <= lambd <= 1.0:
        raise ValueError(f"gamma and lambd must be in [0, 1], got gamma={gamma} lambd={lambd}")
    n, t = values.shape
    in_response = response_mask(response_lengths.long(), t)
    values = values.float() * in_response  # V = 0 past the end: the terminal state is worth nothing
    rewards = token_rewards.float() * in_response
    advantages = torch.zeros_like(values)
    running = torch.zeros(n, dtype=torch.float32, device=values.device)
    for step in range(t - 1, -1, -1):
        next_value = values[:, step + 1] if step + 1 < t else torch.zeros_like(running)
        delta = rewards[:, step] + gamma * next_value - values[:, step]
        # Past a row's end δ = 0 (no reward, zero values), so its recurrence starts at its last token.
        running = delta + gamma * lambd * running
        advantages[:, step] = running
    returns = (advantages + values) * in_response
    return GaeOutput(advantages, returns)


def ppo_advantages(
    rewards: torch.Tensor,
    values: torch.Tensor,
    response_lengths: torch.Tensor,
    loss_mask: torch.Tensor,
    *,
    gamma: float = 1.0,
    lambd: float = 1.0,
    kl: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    normalize: bool = False,
) -> GaeOutput:
    """slime's ``--advantage-estimator ppo``: rewards -> GAE advantages (zero on loss-masked
    tokens; whitened over the trainable tokens with ``normalize``) and the critic's returns."""
    if loss_mask.shape != values.shape:
        raise ValueError(f"loss_mask {tuple(loss_mask.shape)} and values {tuple(values.shape)} differ")
    token_rewards = ppo_token_rewards(rewards, response_lengths, values.shape[1], kl, kl_coef)
    out = gae(token_rewards, values, response_lengths, gamma, lambd)
    mask = loss_mask.float()
    advantages = masked_whiten(out.advantages, mask) if normalize else out.advantages * mask
    return GaeOutput(advantages, out.returns)
