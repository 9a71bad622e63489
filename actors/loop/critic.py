"""The loop's side of PPO with a critic: values before the advantages, the critic's step after.

Per rollout (slime's order): the critic predicts V for every response token; GAE turns rewards
and V into advantages and returns (`actors.loop.batching`, `policies.gae`); then the policy and
the critic train concurrently, each in its own torchrun group. The first
--num-critic-only-steps rollouts train the critic alone.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from policies.algorithm import AlgorithmConfig
from policies.value_loss import explained_variance, masked_mean
from slime_async.actor import ActorRef
from slime_async.batch import Batch, batch_from_samples
from actors.loop.run_config import RunConfig
from slime_async.sample import Sample


def uses_critic(spec: AlgorithmConfig) -> bool:
    return spec.loss_type == "policy_loss" and spec.advantage_estimator == "ppo"


def trains_policy(config: RunConfig, step: int) -> bool:
    """Whether the rollout after ``step`` trained steps updates the policy (not a critic warm-up one)."""
    return not uses_critic(config.algorithm) or step >= config.critic.num_critic_only_steps


async def critic_values(trainer: ActorRef, groups: Sequence[Sequence[Sample]], temperature: float) -> list[list[float]]:
    """The critic's value of every response token, in sample order."""
    samples = [sample for group in groups for sample in group]
    return await trainer.ask("compute_values", batch_from_samples(samples, temperature=temperature), timeout=None)


async def train_critic(trainer: ActorRef, batch: Batch, config: RunConfig) -> dict[str, float]:
    """The critic's update on ``batch`` (no-op without returns) and its ``critic/*`` metrics.

    explained_variance and values_mean are of the values the critic predicted for this rollout,
    before its update (the ones GAE used), over the trainable tokens.
    """
    if batch.returns is None or batch.values is None:
        return {}
    step = await trainer.ask("train_critic", batch, config.critic.value_clip, config.algorithm.loss_agg,
                             max_response_len=config.rollout.rollout_max_response_len, timeout=None)
    metrics = {f"critic/{key}": value for key, value in step.items()}
    values, returns, mask = (_padded(rows, batch.response_lengths) for rows in (batch.values, batch.returns,
                                                                                 batch.loss_masks))
    for key, value in (("explained_variance", explained_variance(values, returns, mask)),
                       ("values_mean", masked_mean(values, mask)), ("returns_mean", masked_mean(returns, mask))):
        if value is not None:
            metrics[f"critic/{key}"] = value
    return metrics


def _padded(rows: Sequence[Sequence[float]], lengths: Sequence[int]) -> torch.Tensor:
    out = torch.zeros(len(rows), max(lengths, default=0))
    for i, row in enumerate(rows):
        out[i, : len(row)] = torch.tensor([float(x) for x in row])
    return out
