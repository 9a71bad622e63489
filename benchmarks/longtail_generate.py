"""A generate hook with a long-tailed response length, for benchmarks/async_vs_sync.py.

About one sample in seven runs to 96 tokens ignoring EOS; the rest stop normally within the
configured budget. Deterministic per (group, index), so every mode sees the same lengths.
"""

import random

from slime_async.sample import Status


async def generate(ctx, sample, sampling_params):
    params = dict(sampling_params)
    if random.Random(sample.group_index * 7919 + sample.index).random() < 0.15:
        params.update(max_new_tokens=96, ignore_eos=True)
    finish = await ctx.generate_turn(sample, params)
    sample.status = Status.COMPLETED if finish == "stop" else Status.TRUNCATED
    return sample
