"""What the weight sync (actors/weight_sync/) and the trainer ranks (actors/trainer/) exchange.

The trainer's half of a weight sync answers these messages on its actor (``TrainerActor``):

| message | answer |
|---|---|
| ``export_hf(path)`` | writes the policy as an HF checkpoint dir (disk and delta transports) |
| ``weight_master()`` | ``(address, port)`` of the store trainer rank 0 hosts for update groups |
| ``init_weight_group(WeightGroupSpec)`` / ``destroy_weight_group(name)`` | rank 0 joins / leaves a group |
| ``weight_metadata()`` | the buckets to broadcast: ``list[list[TensorMeta]]`` |
| ``broadcast_weights(name, flattened)`` | rank 0 broadcasts every bucket; the number of tensors |
| ``rank_info()`` | the ranks (``RankInfo``): which device each is on |
| ``next_tensor_bucket(serving)`` / ``end_tensor_export()`` | IPC handles of the next bucket per serving rank, ``None`` at the end |
| ``offload(parts)`` / ``onload()`` / ``memory_peak()`` | colocation: the trainer's state leaves / retakes the devices |

Kept free of Megatron (and of any component): both sides import it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class WeightGroupSpec:
    """Where the weight broadcast group meets; the same values go to every engine's init call."""

    master_address: str
    master_port: int
    world_size: int  # 1 (trainer rank 0) + total engine ranks
    group_name: str = "weight_update_group"
    backend: str = "gloo"
    # Seconds a collective of this group may wait (None: slime_async.weights.process_group.DEFAULT_TIMEOUT):
    # the weight-update timeout, so a broadcast whose peers are gone (a failed sync) ends by then.
    timeout: float | None = None

    @property
    def init_method(self) -> str:
        return f"tcp://{self.master_address}:{self.master_port}"


@dataclass(frozen=True)
class TensorMeta:
    name: str
    dtype: str  # torch dtype name without "torch." (SGLang's convention: "bfloat16")
    shape: tuple[int, ...]
