"""Generate hooks with a forced long tail, for benchmarks/gpu/async_vs_sync.py.

A workload forces a fixed share of samples to a long length (ignore_eos) and caps the rest
at a short one; which samples are long is fixed by (group, index), so every mode of a
comparison generates the same lengths. ``--rollout-max-response-len`` must be at least the
long length (the trainer pads to it).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from slime_async.sample import Status


@dataclass(frozen=True)
class Workload:
    long_fraction: float
    long_tokens: int
    short_tokens: int

    def budget(self, group_index: int, index: int) -> tuple[int, bool]:
        """(max new tokens, forced to that length?) of one sample."""
        if random.Random(group_index * 7919 + index).random() < self.long_fraction:
            return self.long_tokens, True
        return self.short_tokens, False


WORKLOADS = {
    # issue #17's: 10% of samples at 2,048 tokens, the rest at most 128
    "longtail": Workload(0.10, 2048, 128),
    # a longer tail whose overlap bound is higher: 2% at 8,192
    "longer-tail": Workload(0.02, 8192, 128),
    # the CPU smoke of the script: tiny model, a few tokens
    "tiny": Workload(0.125, 48, 6),
}


async def _generate(workload: Workload, ctx, sample, sampling_params):
    tokens, forced = workload.budget(sample.group_index, sample.index)
    params = {**sampling_params, "max_new_tokens": tokens}
    if forced:
        params["ignore_eos"] = True
    finish = await ctx.generate_turn(sample, params)
    sample.status = Status.COMPLETED if finish == "stop" else Status.TRUNCATED
    return sample


async def generate_longtail(ctx, sample, sampling_params):
    return await _generate(WORKLOADS["longtail"], ctx, sample, sampling_params)


async def generate_longer_tail(ctx, sample, sampling_params):
    return await _generate(WORKLOADS["longer-tail"], ctx, sample, sampling_params)


async def generate_tiny(ctx, sample, sampling_params):
    return await _generate(WORKLOADS["tiny"], ctx, sample, sampling_params)


HOOKS = {"longtail": "generate_longtail", "longer-tail": "generate_longer_tail", "tiny": "generate_tiny"}
