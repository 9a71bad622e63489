"""Trainer side of SGLang's ``update_weights_from_distributed``: rank 0 broadcasts HF tensors.

Protocol (the supervisor drives both sides):
1. ``weight_metadata()`` on every rank -> rank 0 answers the buckets' (name, dtype, shape);
2. ``init_weight_group(spec)`` on the trainer while every engine is asked to
   ``/init_weights_update_group`` (trainer rank 0 is group rank 0, engines 1..N);
3. ``broadcast_weights`` on the trainer while every engine is POSTed
   ``/update_weights_from_distributed`` once per bucket, in order, with that bucket's metadata.

Gathering full tensors across TP (and PP stages) is collective, so every rank of DP replica 0
iterates the buckets; only global rank 0 broadcasts. Other DP replicas hold the same weights
and skip.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from megatron.core import parallel_state

from actors.trainer.bridge import iter_hf_weight_buckets
from actors.trainer.protocol import TensorMeta, WeightGroupSpec
from slime_async.weight_group import destroy_custom_process_group, init_custom_process_group


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def takes_part() -> bool:
    """Whether this rank gathers for global rank 0: a rank of DP replica 0 (its TP peers gather
    each stage's tensors, its later pipeline stages send theirs to the first)."""
    return parallel_state.get_data_parallel_rank() == 0


class WeightBroadcaster:
    """Holds the custom process groups of one trainer rank (only rank 0 ever has any)."""

    def __init__(self, model: torch.nn.Module, bucket_bytes: int, dtype: torch.dtype | None = None):
        self.model = model
        self.bucket_bytes = bucket_bytes
        self.dtype = dtype
        self.groups: dict[str, dist.ProcessGroup] = {}

    def metadata(self) -> list[list[TensorMeta]] | None:
        """Bucket layout of the next broadcast (rank 0 answers; others None)."""
        if not takes_part():
            return None
        buckets = [
            [TensorMeta(name, dtype_name(t.dtype), tuple(t.shape)) for name, t in bucket]
            for bucket in iter_hf_weight_buckets(self.model, self.bucket_bytes, dtype=self.dtype)
        ]
        return buckets if dist.get_rank() == 0 else None

    def init_group(self, spec: WeightGroupSpec) -> None:
        if dist.get_rank() != 0:
            return
        if spec.group_name in self.groups:
            raise ValueError(f"weight update group {spec.group_name!r} already exists on trainer rank 0")
        self.groups[spec.group_name] = init_custom_process_group(
            spec.backend, spec.init_method, spec.world_size, 0, spec.group_name
        )

    def broadcast(self, group_name: str) -> int:
        """Broadcast every bucket, tensor by tensor, in metadata order; returns tensors sent.

        Each engine receives one bucket per ``/update_weights_from_distributed`` call, so the
        supervisor POSTs the buckets one after another while this runs; a broadcast waits
        for the receivers, so the two sides stay in step.
        """
        if not takes_part():
            return 0
        group = self.groups.get(group_name) if dist.get_rank() == 0 else None
        if dist.get_rank() == 0 and group is None:
            raise ValueError(f"no weight update group {group_name!r}: call init_weight_group first")
        sent = 0
        for bucket in iter_hf_weight_buckets(self.model, self.bucket_bytes, dtype=self.dtype):
            if group is None:
                continue  # a TP peer or a later stage of rank 0: it only takes part in the gathers
            for _, tensor in bucket:
                dist.broadcast(tensor.contiguous(), src=0, group=group)
                sent += 1
        return sent

    def destroy_group(self, group_name: str) -> None:
        group = self.groups.pop(group_name, None)
        if group is not None:
            destroy_custom_process_group(group)
