"""Trainer side of SGLang's ``update_weights_from_distributed``: rank 0 broadcasts HF tensors.

Protocol (the supervisor drives both sides):
0. ``weight_store_port()`` on rank 0: the port of the store it hosts for every weight-update
   group, bound before it is reported (no port race);
1. ``weight_metadata()`` on every rank -> rank 0 answers the buckets' (name, dtype, shape);
2. ``init_weight_group(spec)`` on the trainer while every engine is asked to
   ``/init_weights_update_group`` (trainer rank 0 is group rank 0, engines 1..N); the group is
   kept for the syncs that follow until the supervisor destroys it;
3. ``broadcast_weights`` on the trainer while every engine is POSTed
   ``/update_weights_from_distributed`` once per bucket, in order, with that bucket's metadata:
   one broadcast per bucket (a flattened bucket, ``slime_async.weights.flat_bucket``) or, the old way,
   one per tensor.

Gathering full tensors across TP (and PP stages) is collective, so every rank of DP replica 0
iterates the buckets; only global rank 0 broadcasts. Other DP replicas hold the same weights
and skip.
"""

from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist
from megatron.core import parallel_state

from actors.megatron.bridge import iter_hf_weight_buckets
from slime_async.weights.protocol import TensorMeta, WeightGroupSpec
from slime_async.weights.flat_bucket import flatten
from slime_async.weights.process_group import (DEFAULT_TIMEOUT, destroy_custom_process_group, init_custom_process_group,
                                      listening_store)


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
        self.store: dist.TCPStore | None = None  # rank 0: where every weight-update group meets

    def store_port(self) -> int | None:
        """Rank 0: the port of its weight-update store, bound at the first call and held until
        the process ends (others None). The host given is only the client side's: the store's
        server listens on every interface, so engines on other nodes reach it at the node's IP."""
        if dist.get_rank() != 0:
            return None
        if self.store is None:
            self.store = listening_store("127.0.0.1")
        return self.store.port

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
        # The group meets on rank 0's own store when the spec names its port (weight_store_port).
        store = self.store if self.store is not None and spec.master_port == self.store.port else None
        timeout = timedelta(seconds=spec.timeout) if spec.timeout is not None else DEFAULT_TIMEOUT
        self.groups[spec.group_name] = init_custom_process_group(
            spec.backend, spec.init_method, spec.world_size, 0, spec.group_name, timeout=timeout, store=store
        )

    def broadcast(self, group_name: str, flattened: bool = True) -> int:
        """Broadcast every bucket in metadata order; returns tensors sent.

        Each engine receives one bucket per ``/update_weights_from_distributed`` call, so the
        supervisor POSTs the buckets one after another while this runs; a broadcast waits
        for the receivers, so the two sides stay in step. ``flattened``: one broadcast per
        bucket, sent asynchronously while the next bucket is gathered, cast and flattened (at
        most two flat buckets exist at once: the one on the wire and the next); else one
        blocking broadcast per tensor (the run always sends flattened buckets; the per-tensor path is
        reached only by ``benchmarks/gpu/weight_sync.py``, which compares the two). A broadcast that
        fails (an engine died, or the group's timeout passed) destroys the group here: its peers are
        out of step, and the next sync builds a new one under a new name.
        """
        if not takes_part():
            return 0
        group = self.groups.get(group_name) if dist.get_rank() == 0 else None
        failure: Exception | None = None
        if dist.get_rank() == 0 and group is None:
            failure = ValueError(f"no weight update group {group_name!r}: call init_weight_group first")
        sent = 0
        on_the_wire: tuple[dist.Work, torch.Tensor] | None = None  # the work and the buffer it reads
        # The generator's gathers for bucket k+1 run while bucket k is on the wire.
        for bucket in iter_hf_weight_buckets(self.model, self.bucket_bytes, dtype=self.dtype):
            if group is None or failure is not None:
                # A TP peer or a later stage of rank 0 only takes part in the gathers; so does
                # rank 0 after a failed broadcast, or its peers would wait in a gather forever.
                continue
            try:
                if not flattened:
                    for _, tensor in bucket:
                        dist.broadcast(tensor.contiguous(), src=0, group=group)
                    sent += len(bucket)
                    continue
                flat = flatten([tensor for _, tensor in bucket])
                sent += len(bucket)
                del bucket  # the gathered tensors: only their flat copy stays
                if on_the_wire is not None:
                    on_the_wire[0].wait()
                on_the_wire = (dist.broadcast(flat, src=0, group=group, async_op=True), flat)
            except Exception as error:  # noqa: BLE001 - raised below, once the gathers are done
                failure = error
        try:
            if on_the_wire is not None and failure is None:
                on_the_wire[0].wait()
        except Exception as error:  # noqa: BLE001 - raised below
            failure = error
        if failure is not None:
            self.destroy_group(group_name)
            raise failure
        return sent

    def destroy_group(self, group_name: str) -> None:
        group = self.groups.pop(group_name, None)
        if group is not None:
            destroy_custom_process_group(group)
