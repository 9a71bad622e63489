"""On-policy distillation in the loop: the teacher's logprobs of a batch and the advantage term.

Where the teacher's logprobs come from depends on --opd-type: ``sglang`` — the rollout had a
teacher engine score every sample once it was final (``Sample.teacher_logprobs``); ``megatron``
— the trainer ranks forward the frozen teacher (--opd-teacher-load) now. Either way the term is
``policies.opd.apply_opd`` on top of whatever the estimator produced, with the student's
logprobs being π_old (the trainer's recompute before the update, as slime does) or μ with
--use-rollout-logprobs.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from policies.algorithm import AlgorithmConfig
from policies.opd import apply_opd, opd_metrics, teacher_temperature
from policies.requirements import needs_trainer_teacher
from slime_async.actor import ActorRef
from slime_async.batch import batch_from_samples
from slime_async.sample import Sample


async def trainer_teacher_logprobs(trainer: ActorRef | None, groups: Sequence[Sequence[Sample]],
                                   spec: AlgorithmConfig, temperature: float) -> list[list[float]] | None:
    """The frozen Megatron teacher's logprobs of every response token (--opd-type megatron), in
    sample order, at the temperature of the student's (``temperature``, the rollout's logprob
    temperature; policies.opd.teacher_temperature); None for any other placement."""
    if trainer is None or not needs_trainer_teacher(spec):
        return None
    samples = [sample for group in groups for sample in group]
    batch = batch_from_samples(samples, temperature=teacher_temperature(temperature))
    rows = await trainer.ask("compute_logprobs", batch, model="teacher", timeout=None)
    return [list(row.logprobs) for row in rows]


def add_opd_term(advantages: torch.Tensor, samples: Sequence[Sample], loss_mask: torch.Tensor,
                 student: torch.Tensor, teacher_rows: Sequence[Sequence[float] | None] | None,
                 coef: float) -> tuple[torch.Tensor, dict[str, float]]:
    """``advantages − coef · (student − teacher)`` on scored model tokens, and the OPD metrics.

    ``teacher_rows``: one row per sample (the trainer's), or None to read each sample's own
    ``teacher_logprobs`` (the engine teacher's; None where the teacher could not score it: those
    samples keep their advantages and count as unscored in ``train/opd_scored_fraction``).
    """
    width = advantages.shape[1]
    teacher = torch.zeros_like(advantages)
    scored = torch.zeros_like(advantages)
    for i, sample in enumerate(samples):
        row = teacher_rows[i] if teacher_rows is not None else sample.teacher_logprobs
        if row is None:
            continue
        if len(row) != sample.response_length:
            raise ValueError(f"opd: sample {sample.group_index}/{sample.index} has {len(row)} teacher logprobs for "
                             f"{sample.response_length} response tokens")
        n = min(len(row), width)
        teacher[i, :n] = torch.tensor(row[:n], dtype=teacher.dtype)
        scored[i, :n] = 1.0
    mask = loss_mask * scored
    adjusted, reverse_kl = apply_opd(advantages, student, teacher, mask, coef)
    return adjusted, opd_metrics(reverse_kl, loss_mask, scored)
