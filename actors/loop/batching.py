"""From buffered groups to a trainer batch: advantages, off-policy masks, staleness metrics."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from actors.loop.opd import add_opd_term
from policies.advantages import compute_advantages
from policies.gae import ppo_advantages
from policies.kl import kl_estimate
from policies.algorithm import AlgorithmConfig
from policies.requirements import needs_old_for_advantages, needs_reference
from policies.staleness import offpolicy_token_mask, staleness
from slime_async.actor import ActorRef
from slime_async.batch import Batch, batch_from_samples
from slime_async.sample import Sample


def _pad(rows: Sequence[Sequence[float]], width: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    out = torch.zeros(len(rows), width, dtype=dtype)
    for i, row in enumerate(rows):
        out[i, : len(row)] = torch.tensor(row, dtype=dtype)
    return out


def build_train_batch(
    groups: Sequence[Sequence[Sample]],
    spec: AlgorithmConfig,
    *,
    train_version: int,
    temperature: float,
    max_staleness: int | None = None,
    mask_offpolicy: bool = False,
    ref_logprobs: Sequence[Sequence[float]] | None = None,
    old_logprobs: Sequence[Sequence[float]] | None = None,
    values: Sequence[Sequence[float]] | None = None,
    lambd: float = 1.0,
    teacher_logprobs: Sequence[Sequence[float]] | None = None,
) -> tuple[Batch, dict[str, float]]:
    """The trainer batch for ``groups`` and the ``rollout/staleness_*`` metrics.

    With ``mask_offpolicy`` (``--mask-offpolicy-in-partial-rollout``), tokens generated more
    than ``max_staleness`` versions before ``train_version`` get loss_mask 0 — the older part of
    a resumed partial rollout. ``old_logprobs`` (π_old, the trainer's recompute) go into the
    batch; the REINFORCE++ KL penalty is ``--kl-loss-type`` of π_old (μ with
    ``--use-rollout-logprobs``) against π_ref, as in slime. With --use-opd the reverse KL to the
    teacher (``teacher_logprobs``, or each sample's own from the teacher engine) is subtracted
    from the advantages last (actors/loop/opd.py).
    """
    samples = [sample for group in groups for sample in group]
    width = max((s.response_length for s in samples), default=0)
    loss_mask = _pad([s.loss_mask for s in samples], width)
    masked: dict[str, float] = {}
    if mask_offpolicy and max_staleness is not None:
        versions = _pad([s.token_versions for s in samples], width, torch.long)
        generated = loss_mask
        loss_mask = loss_mask * offpolicy_token_mask(versions, train_version, max_staleness).float()
        masked = masked_stale_metrics(generated, loss_mask)
    rewards = torch.tensor([float(s.reward or 0.0) for s in samples])
    group_ids = torch.tensor([s.group_index for s in samples])
    kl = None
    if ref_logprobs is not None and spec.kl_coef > 0:
        policy = _student_logprobs(samples, spec, old_logprobs, width, "the --kl-coef penalty")
        kl = kl_estimate(policy, _pad(ref_logprobs, width), spec.kl_loss_type)
    returns = None
    if spec.advantage_estimator == "ppo":
        if values is None:
            raise ValueError("--advantage-estimator ppo needs the critic's values of the batch")
        # Tool output was not sampled by the policy: no KL cost there (slime scores it anyway).
        advantages, returns = ppo_advantages(
            rewards, _pad(values, width), torch.tensor([s.response_length for s in samples]), loss_mask,
            gamma=spec.gamma, lambd=lambd, kl=kl * loss_mask if kl is not None else None, kl_coef=spec.kl_coef,
            normalize=spec.normalize_advantages)
    else:
        advantages = compute_advantages(spec.advantage_estimator, rewards, group_ids, loss_mask, kl=kl,
                                        kl_coef=spec.kl_coef, gamma=spec.gamma, normalize=spec.normalize_advantages)
    opd: dict[str, float] = {}
    if spec.use_opd:
        student = _student_logprobs(samples, spec, old_logprobs, width, "on-policy distillation (--use-opd)")
        advantages, opd = add_opd_term(advantages, samples, loss_mask, student, teacher_logprobs, spec.opd_kl_coef)
    batch = batch_from_samples(
        samples,
        advantages=[advantages[i, : s.response_length].tolist() for i, s in enumerate(samples)],
        ref_logprobs=ref_logprobs,
        old_logprobs=old_logprobs,
        temperature=temperature,
        routed_experts=True,  # the trainer replays them with --use-rollout-routing-replay
    )
    # The off-policy mask goes into the batch only: the samples stay as generated (a rollout dump
    # written after this holds what the engines returned; --debug-train-only recomputes the mask).
    batch.loss_masks = [[int(m) for m in loss_mask[i, : s.response_length].tolist()] for i, s in enumerate(samples)]
    if returns is not None:
        batch.values = [list(map(float, row)) for row in values]
        batch.returns = [returns[i, : s.response_length].tolist() for i, s in enumerate(samples)]
    batch.check()
    metrics = staleness_metrics(samples, train_version, batch.loss_masks) | masked | trajectory_metrics(samples)
    return batch, metrics | opd


def _student_logprobs(samples: Sequence[Sample], spec: AlgorithmConfig, old_logprobs: Sequence[Sequence[float]] | None,
                      width: int, what: str) -> torch.Tensor:
    """The policy's logprobs an advantage term compares: π_old, or μ with --use-rollout-logprobs."""
    if spec.use_rollout_logprobs:
        return _pad([s.rollout_logprobs for s in samples], width)
    if old_logprobs is None:
        raise ValueError(f"{what} needs the trainer's π_old logprobs (or --use-rollout-logprobs)")
    return _pad(old_logprobs, width)


async def trainer_logprobs(trainer: ActorRef, groups: Sequence[Sequence[Sample]], temperature: float,
                           model: str) -> list[list[float]]:
    """The logprob of every response token under ``model`` ("ref": the frozen reference, "actor":
    the current weights, i.e. π_old), in sample order."""
    samples = [sample for group in groups for sample in group]
    batch = batch_from_samples(samples, temperature=temperature, routed_experts=model == "actor")
    rows = await trainer.ask("compute_logprobs", batch, model=model, timeout=None)
    return [list(row.logprobs) for row in rows]


async def advantage_logprobs(trainer: ActorRef, groups: Sequence[Sequence[Sample]], spec: AlgorithmConfig,
                             temperature: float) -> tuple[list[list[float]] | None, list[list[float]] | None]:
    """(π_ref, π_old) logprobs that the loss and the advantages need before training (None if not)."""
    ref = await trainer_logprobs(trainer, groups, temperature, "ref") if needs_reference(spec) else None
    old = (await trainer_logprobs(trainer, groups, temperature, "actor")
           if needs_old_for_advantages(spec) else None)
    return ref, old


def masked_stale_metrics(generated: torch.Tensor, trained: torch.Tensor) -> dict[str, float]:
    """What --mask-offpolicy-in-partial-rollout took out of this batch: ``rollout/masked_stale_tokens``
    (generated tokens whose loss it zeroed) and ``rollout/masked_stale_samples`` (samples left with
    no trained token: as good as dropped, though their reward still counts in their group's baseline)."""
    had = generated.sum(dim=1) > 0
    left = trained.sum(dim=1) > 0
    return {"rollout/masked_stale_tokens": float((generated - trained).sum()),
            "rollout/masked_stale_samples": float((had & ~left).sum())}


def trajectory_metrics(samples: Sequence[Sample]) -> dict[str, float]:
    """``rollout/trajectory_splits``: captured trajectories trained as more than one sample (a turn
    whose prompt did not extend the turn before), counted as the extra pieces in this batch."""
    captured = [s for s in samples if "trajectory_parts" in s.metadata]
    if not captured:
        return {}
    return {"rollout/trajectory_splits": float(sum(s.metadata.get("trajectory_part", 0) > 0 for s in captured))}


def staleness_metrics(samples: Sequence[Sample], train_version: int,
                      loss_masks: Sequence[Sequence[int]]) -> dict[str, float]:
    """``rollout/staleness_*`` of each sample's oldest trained token and the fraction of trained
    tokens generated before ``train_version``; trained = ``loss_masks`` (the batch's, after the
    off-policy mask)."""
    oldest = (min((v for v, m in zip(s.token_versions, mask) if m), default=None)
              for s, mask in zip(samples, loss_masks))
    values = [staleness(train_version, v) for v in oldest if v is not None]
    if not values:
        return {}
    return {
        "rollout/staleness_mean": sum(values) / len(values),
        "rollout/staleness_max": float(max(values)),
        "rollout/offpolicy_token_frac": _offpolicy_fraction(samples, loss_masks, train_version),
    }


def _offpolicy_fraction(samples: Sequence[Sample], loss_masks: Sequence[Sequence[int]], train_version: int) -> float:
    total = stale = 0
    for sample, loss_mask in zip(samples, loss_masks):
        for version, mask in zip(sample.token_versions, loss_mask):
            if mask:
                total += 1
                stale += version < train_version
    return stale / total if total else 0.0
