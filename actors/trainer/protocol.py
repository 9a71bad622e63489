"""Types that cross the RPC boundary between the supervisor and the policy's ranks: logprobs (what
every Megatron rank answers is in `actors.megatron.protocol`, the weight sync's in
`slime_async.weights.protocol`).

Kept free of Megatron imports: the supervisor unpickles these without loading megatron-core.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class SampleLogprobs:
    """Per response token of one sample: log p at the batch temperature, and entropy."""

    logprobs: list[float]
    entropy: list[float]
