"""What the trainer does differently under sequence parallelism (``--sequence-parallel``, automatic for
an MoE model at TP > 1).

Under SP megatron-core runs the embedding output, the norms, the residual stream and the MoE router
on each tensor-parallel rank's slice of the sequence (``[S / TP, B, H]``; the first dimension of a
packed ``[total, 1, H]`` row), gathering the whole sequence only inside attention and the MLPs and
in the output layer (whose logits are whole again). Three things follow for the trainer:

- the model input's sequence (the padded length, or the packed row's total) is a multiple of TP
  (`sequence_multiple`): megatron-core splits it evenly;
- a head that replaces the output layer (the chunked logprob head, the critic's value head) gathers
  the sequence itself (`whole_sequence`);
- per-token side inputs of the routers (R3's replayed experts) are cut to this rank's slice
  (`local_rows`).
"""

from __future__ import annotations

import torch
from megatron.core import parallel_state
from megatron.core.tensor_parallel.mappings import gather_from_sequence_parallel_region


def sequence_multiple(config) -> int:
    """What the model input's sequence length must be a multiple of: TP under SP, else 1."""
    return config.tensor_model_parallel_size if getattr(config, "sequence_parallel", False) else 1


def round_up_shape(shape: tuple[int, ...], multiple: int) -> tuple[int, ...]:
    """A `micro_batch_shape` (``(total,)`` packed, ``(rows, longest)`` padded) whose sequence (its
    last entry) is rounded up to ``multiple``: the extra positions are pad tokens."""
    return (*shape[:-1], -(-shape[-1] // multiple) * multiple)


def whole_sequence(hidden_states: torch.Tensor) -> torch.Tensor:
    """This rank's ``[S / TP, ...]`` slice -> the whole ``[S, ...]`` sequence on every TP rank.

    For a head computed the same on every TP rank (replicated weights, or a vocab-parallel head
    whose hidden-state gradient is already all-reduced over TP): the backward keeps this rank's
    slice of that (replicated) gradient, as megatron-core does for duplicated computation.
    """
    return gather_from_sequence_parallel_region(hidden_states, tensor_parallel_output_grad=False)


def local_rows(rows: torch.Tensor) -> torch.Tensor:
    """This TP rank's slice of per-token rows in the model's token order (sequence first: ``S * B``
    rows of a padded micro-batch, ``total`` of a packed one), as the SP router sees them."""
    tp = parallel_state.get_tensor_model_parallel_world_size()
    if rows.size(0) % tp:
        raise ValueError(f"sequence parallelism: {rows.size(0)} token rows do not split over {tp} TP ranks")
    return rows.chunk(tp)[parallel_state.get_tensor_model_parallel_rank()]
