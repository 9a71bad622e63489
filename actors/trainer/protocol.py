"""Types that cross the RPC boundary between the supervisor and the policy's ranks: logprobs and
the weight broadcast (what every Megatron rank answers is in `actors.megatron.protocol`).

Kept free of Megatron imports: the supervisor unpickles these without loading megatron-core.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class SampleLogprobs:
    """Per response token of one sample: log p at the batch temperature, and entropy."""

    logprobs: list[float]
    entropy: list[float]


@dataclass(frozen=True)
class WeightGroupSpec:
    """Where the weight broadcast group meets; the same values go to every engine's init call."""

    master_address: str
    master_port: int
    world_size: int  # 1 (trainer rank 0) + total engine ranks
    group_name: str = "weight_update_group"
    backend: str = "gloo"
    # Seconds a collective of this group may wait (None: slime_async.weight_group.DEFAULT_TIMEOUT):
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
