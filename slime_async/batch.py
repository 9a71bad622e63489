"""`Batch`: what the supervisor sends the trainer ranks for one operation.

Plain per-sample Python lists (not padded tensors) so a DP shard is a cheap `select`, the RPC
payload is small, and each rank pads only its own micro-batches. Every per-token list is
response-aligned: entry t belongs to response token t (``tokens[prompt_len + t]``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np

from slime_async.sample import Sample


@dataclass
class Batch:
    tokens: list[list[int]]  # prompt + response ids per sample
    response_lengths: list[int]
    loss_masks: list[list[int]]  # per response token; 0 on tool output / padding
    advantages: list[list[float]] | None = None  # per response token
    rollout_logprobs: list[list[float]] | None = None  # μ from the engine
    ref_logprobs: list[list[float]] | None = None  # π_ref, when the KL loss is on
    old_logprobs: list[list[float]] | None = None  # π_old recompute (off-policy corrections)
    values: list[list[float]] | None = None  # the critic's values before its update (PPO with a critic)
    returns: list[list[float]] | None = None  # GAE returns: the critic's targets
    temperature: float = 1.0  # rollout temperature: logprobs are of logits / temperature
    sample_ids: list[tuple[int, int]] = field(default_factory=list)  # (group_index, index)
    # R3 (--use-rollout-routing-replay): per sample the engine's experts, an int array
    # [len(tokens) - 1, MoE layers, top-k], or None (the trainer routes that sample itself).
    routed_experts: list[Any] | None = None

    def __post_init__(self) -> None:
        self.check()

    def __len__(self) -> int:
        return len(self.tokens)

    def check(self) -> None:
        """Raise ValueError naming the first field whose shape disagrees with the tokens."""
        n = len(self.tokens)
        if len(self.response_lengths) != n:
            raise ValueError(f"batch has {n} samples but {len(self.response_lengths)} response_lengths")
        if self.temperature <= 0:
            raise ValueError(f"batch temperature must be > 0, got {self.temperature}")
        for i, (toks, rlen) in enumerate(zip(self.tokens, self.response_lengths)):
            # The first token has no preceding logit to score it: a prompt token is required.
            if not 0 <= rlen < len(toks):
                raise ValueError(
                    f"sample {i}: response_length {rlen} with {len(toks)} tokens "
                    "(need 0 <= response_length < tokens)"
                )
        for name in ("loss_masks", "advantages", "rollout_logprobs", "ref_logprobs", "old_logprobs", "values", "returns"):
            values = getattr(self, name)
            if values is None:
                continue
            if len(values) != n:
                raise ValueError(f"batch field {name} has {len(values)} rows for {n} samples")
            for i, (row, rlen) in enumerate(zip(values, self.response_lengths)):
                if len(row) != rlen:
                    raise ValueError(f"sample {i}: {name} has {len(row)} entries for response_length {rlen}")

        if self.routed_experts is not None:
            if len(self.routed_experts) != n:
                raise ValueError(f"batch field routed_experts has {len(self.routed_experts)} rows for {n} samples")
            for i, (experts, toks) in enumerate(zip(self.routed_experts, self.tokens)):
                shape = np.shape(experts) if experts is not None else None
                if shape is not None and (len(shape) != 3 or shape[0] != len(toks) - 1):
                    raise ValueError(f"sample {self._name(i)}: rollout_routed_experts has shape {shape} for "
                                     f"{len(toks)} tokens (need [{len(toks) - 1}, MoE layers, top-k])")

    def _name(self, i: int) -> str:
        """Sample ``i`` as a user finds it: its (group_index, index) where known."""
        return f"{i} {self.sample_ids[i]}" if i < len(self.sample_ids) else str(i)

    @property
    def lengths(self) -> list[int]:
        """Total tokens (prompt + response) per sample: the cost of a sample in a forward pass."""
        return [len(t) for t in self.tokens]

    def select(self, indices: Sequence[int]) -> Batch:
        """The samples at ``indices`` (in that order) as a new batch."""
        picked = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, list):
                picked[f.name] = [value[i] for i in indices] if value or f.name != "sample_ids" else []
            else:
                picked[f.name] = value
        return Batch(**picked)

    def normalizer(self, loss_agg: str, max_response_len: int | None = None) -> float:
        """The global denominator `policies.losses.aggregate` expects for ``loss_agg``.

        Computed once on the whole global batch (before the DP split), so summing the
        micro-batch losses of every rank gives the full-batch loss.
        """
        if loss_agg == "token_mean":
            return float(sum(sum(1 for m in row if m) for row in self.loss_masks))
        if loss_agg == "seq_mean_token_mean":
            return float(len(self))
        if loss_agg == "seq_mean_token_sum_norm":
            if max_response_len is None:
                raise ValueError("loss_agg seq_mean_token_sum_norm needs max_response_len (e.g. rollout_max_response_len)")
            return float(max_response_len * len(self))
        raise ValueError(f"unknown loss_agg {loss_agg!r}")


def batch_from_samples(
    samples: Sequence[Sample],
    *,
    advantages: Sequence[Sequence[float]] | None = None,
    ref_logprobs: Sequence[Sequence[float]] | None = None,
    old_logprobs: Sequence[Sequence[float]] | None = None,
    temperature: float = 1.0,
    routed_experts: bool = False,
) -> Batch:
    """Build a trainer batch from rollout samples (token in, token out: no re-tokenisation).

    ``advantages`` / ``ref_logprobs`` / ``old_logprobs`` are per response token, in sample order (the advantage
    estimator and the reference model run before this). Rollout logprobs come from the samples
    when every sample has them. With ``routed_experts`` (R3) each sample's ``rollout_routed_experts``
    go along (a sample without them is routed by the trainer itself).
    """
    for sample in samples:
        sample.check()
    n = len(samples)
    for name, rows in (("advantages", advantages), ("ref_logprobs", ref_logprobs), ("old_logprobs", old_logprobs)):
        if rows is not None and len(rows) != n:
            raise ValueError(f"{name} has {len(rows)} rows for {n} samples")
    has_rollout = n > 0 and all(len(s.rollout_logprobs) == s.response_length for s in samples)
    return Batch(
        tokens=[list(s.tokens) for s in samples],
        response_lengths=[s.response_length for s in samples],
        loss_masks=[list(s.loss_mask) for s in samples],
        advantages=[[float(a) for a in row] for row in advantages] if advantages is not None else None,
        rollout_logprobs=[list(s.rollout_logprobs) for s in samples] if has_rollout else None,
        ref_logprobs=[[float(x) for x in row] for row in ref_logprobs] if ref_logprobs is not None else None,
        old_logprobs=[[float(x) for x in row] for row in old_logprobs] if old_logprobs is not None else None,
        temperature=temperature,
        sample_ids=[(s.group_index, s.index) for s in samples],
        routed_experts=_routed_experts(samples) if routed_experts else None,
    )


def _routed_experts(samples: Sequence[Sample]) -> list[Any] | None:
    """Each sample's engine experts as an int32 array (None where it has none); None if no sample has any."""
    rows = [getattr(s, "rollout_routed_experts", None) for s in samples]
    if all(row is None for row in rows):
        return None
    return [None if row is None else np.asarray(row, dtype=np.int32) for row in rows]
