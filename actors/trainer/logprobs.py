"""Per-token log-probabilities and entropy from vocab-parallel logits (inside a TP group).

The output layer is column-parallel (``parallel_output=True``): each TP rank holds logits for
a contiguous slice of the (padded) vocabulary. Gathering the full ``[B, T, V]`` logits on
every rank would cost TP times the memory, so the softmax statistics are reduced across the
TP group instead. Sums go through Megatron's ``reduce_from_tensor_model_parallel_region``
(forward all-reduce, backward identity), which is the correct gradient only when everything
downstream of the sum is computed from replicated values (see the entropy below).

Semantics match SGLang's logprobs: log-softmax of ``logits / temperature`` at the given token.
Vocabulary rows at or beyond the HF vocab size are padding (TP divisibility) and are masked out.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from megatron.core import parallel_state
from megatron.core.tensor_parallel.mappings import reduce_from_tensor_model_parallel_region


def vocab_parallel_logprobs(
    logits: torch.Tensor,
    targets: torch.Tensor,
    *,
    hf_vocab_size: int,
    temperature: float = 1.0,
    with_entropy: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log p(target) and entropy for ``logits`` ``[..., V_local]`` of this TP rank's vocab slice.

    ``targets`` ``[...]`` are global token ids. Returns tensors shaped like ``targets`` (fp32),
    differentiable with respect to ``logits``.
    """
    tp_rank = parallel_state.get_tensor_model_parallel_rank()
    v_local = logits.size(-1)
    start = tp_rank * v_local
    logits = logits.float() / temperature
    vocab_ids = torch.arange(start, start + v_local, device=logits.device)
    if start + v_local > hf_vocab_size:
        logits = logits.masked_fill(vocab_ids >= hf_vocab_size, float("-inf"))

    # The max is only a numerical shift: no gradient flows through it.
    shift = logits.detach().max(dim=-1, keepdim=True).values
    if parallel_state.get_tensor_model_parallel_world_size() > 1:
        dist.all_reduce(shift, op=dist.ReduceOp.MAX, group=parallel_state.get_tensor_model_parallel_group())
    shifted = logits - shift
    sum_exp = reduce_from_tensor_model_parallel_region(shifted.exp().sum(dim=-1))
    log_z = sum_exp.log()

    local = (targets >= start) & (targets < start + v_local)
    index = (targets - start).clamp(0, v_local - 1).unsqueeze(-1)
    picked = shifted.gather(-1, index).squeeze(-1)
    picked = torch.where(local, picked, torch.zeros_like(picked))
    logprobs = reduce_from_tensor_model_parallel_region(picked) - log_z

    entropy = None
    if with_entropy:
        # H = log Z - (Σ e^s · s) / Z. Both sums are reduced *before* they meet, so every term
        # downstream of a reduction is computed from replicated values and gets the same
        # gradient on every TP rank (which the identity backward of the reduction requires).
        # Folding log Z into the local sum, as in Σ p · log p, would not: each rank would
        # only see its own slice's share of d/d(log Z).
        finite = torch.where(torch.isfinite(shifted), shifted, torch.zeros_like(shifted))
        weighted = reduce_from_tensor_model_parallel_region((shifted.exp() * finite).sum(dim=-1))
        entropy = log_z - weighted / sum_exp
    return logprobs, entropy
