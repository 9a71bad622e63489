"""Micro-batches aligned over the ranks that dispatch tokens to experts together (MoE, EP / expert-TP > 1).

megatron-core's MoE layers run collectives over the expert tensor-and-model-parallel group in
every forward and backward: the allgather dispatcher (the one that runs on CPU) all-gathers each
rank's ``[tokens, hidden]`` and reduce-scatters the experts' output, so every rank of that group
must run the same number of micro-batches, each of the same token count; the alltoall and flex
dispatchers (CUDA) exchange variable token counts, so only the number must agree. Data-parallel
ranks cut their own shards into micro-batches by tokens, so the counts and shapes are agreed
here (an all-reduce max) before Megatron's schedule runs: a rank short of micro-batches runs
zero-loss copies of one of its samples, and a smaller micro-batch is padded with pad tokens
that ``padding_mask`` keeps out of the router's aux loss.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch
import torch.distributed as dist
from megatron.core import parallel_state

from slime_async.batch import Batch

Shape = tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class ExpertAlignment:
    """How this rank's micro-batches must agree with the other ranks of its dispatch group."""

    group: dist.ProcessGroup | None  # None: a dense model, or every expert on every rank
    equal_shapes: bool = False  # the allgather dispatcher: equal token counts per micro-batch too
    device: torch.device = torch.device("cpu")  # where the group's collectives take tensors (NCCL: cuda)

    @classmethod
    def of(cls, model_config, device: torch.device) -> ExpertAlignment:
        """The alignment ``model_config`` (the model's TransformerConfig) needs on this rank."""
        if not getattr(model_config, "num_moe_experts", None):
            return cls(None)
        group = parallel_state.get_expert_tensor_and_model_parallel_group()
        if group is None or dist.get_world_size(group) == 1:
            return cls(None)
        return cls(group, model_config.moe_token_dispatcher_type == "allgather", device)

    def count(self, local: int) -> int:
        """The number of micro-batches every rank of the group runs (the largest local count)."""
        if self.group is None:
            return local
        value = torch.tensor([local], dtype=torch.long, device=self.device)
        dist.all_reduce(value, op=dist.ReduceOp.MAX, group=self.group)
        return int(value.item())

    def shapes(self, local: Sequence[Shape], count: int) -> list[Shape] | None:
        """Each micro-batch slot's shape on every rank (the elementwise max over the group's
        ``local`` shapes; a slot a rank lacks counts as zeros), or None when shapes may differ."""
        if self.group is None or not self.equal_shapes:
            return None
        width = len(local[0]) if local else 2
        table = torch.zeros(count, width, dtype=torch.long, device=self.device)
        for slot, shape in enumerate(local):
            table[slot] = torch.tensor(shape, dtype=torch.long, device=self.device)
        dist.all_reduce(table, op=dist.ReduceOp.MAX, group=self.group)
        return [tuple(int(x) for x in row) for row in table.tolist()]


def zero_loss_copy(batch: Batch) -> Batch:
    """The first sample of ``batch`` with its loss mask zeroed: a micro-batch that runs the same
    forward and backward (and so the same expert collectives) but adds nothing to loss or gradient."""
    copy = batch.select([0])
    return dataclasses.replace(copy, loss_masks=[[0] * n for n in copy.response_lengths])
