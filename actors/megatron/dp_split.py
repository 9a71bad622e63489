"""Pure functions that place samples: across data-parallel ranks, then into micro-batches.

Both balance by tokens, not by sample count: a rank's step time is its forward/backward
work, which grows with the tokens it holds, and the slowest DP rank sets the step time.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence


def split_across_dp(lengths: Sequence[int], dp_size: int) -> list[list[int]]:
    """Indices of ``lengths`` for each of ``dp_size`` ranks, balanced by total tokens.

    Greedy longest-first (LPT): samples in decreasing length go to the rank with the fewest
    tokens so far (ties: fewer samples, then lower rank), which is within 4/3 of the optimal
    makespan. Every rank gets at least one sample, so every rank runs the same collectives.
    Indices inside a bin are ascending, so the result does not depend on heap internals.
    """
    if dp_size < 1:
        raise ValueError(f"dp_size must be >= 1, got {dp_size}")
    if len(lengths) < dp_size:
        raise ValueError(
            f"a batch of {len(lengths)} samples cannot feed {dp_size} data-parallel ranks; "
            "raise the global batch size or lower the DP size"
        )
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    heap = [(0, 0, rank) for rank in range(dp_size)]  # (tokens, samples, rank)
    bins: list[list[int]] = [[] for _ in range(dp_size)]
    for i in order:
        tokens, count, rank = heapq.heappop(heap)
        bins[rank].append(i)
        heapq.heappush(heap, (tokens + lengths[i], count + 1, rank))
    return [sorted(b) for b in bins]


def split_into_micro_batches(
    lengths: Sequence[int],
    max_tokens: int | None = None,
    micro_batch_size: int | None = None,
) -> list[list[int]]:
    """Micro-batches of indices for one rank, by a token budget or a fixed sample count.

    With ``max_tokens`` (slime's ``--max-tokens-per-gpu``) the budget is the *padded* size
    (samples × longest sample), since micro-batches are padded to their longest sample:
    samples are taken longest first, so padding inside a micro-batch stays small. A sample
    longer than the budget forms a micro-batch of its own. With ``micro_batch_size`` the
    samples are chunked in order. Exactly one of the two must be given.
    """
    if (max_tokens is None) == (micro_batch_size is None):
        raise ValueError("give exactly one of max_tokens_per_gpu and micro_batch_size")
    if micro_batch_size is not None:
        if micro_batch_size < 1:
            raise ValueError(f"micro_batch_size must be >= 1, got {micro_batch_size}")
        idx = list(range(len(lengths)))
        return [idx[i : i + micro_batch_size] for i in range(0, len(idx), micro_batch_size)]
    assert max_tokens is not None
    if max_tokens < 1:
        raise ValueError(f"max_tokens_per_gpu must be >= 1, got {max_tokens}")
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    batches: list[list[int]] = []
    current: list[int] = []
    longest = 0
    for i in order:
        # In decreasing order the first sample of a micro-batch is its longest.
        if current and (len(current) + 1) * longest > max_tokens:
            batches.append(current)
            current = []
        if not current:
            longest = lengths[i]
        current.append(i)
    if current:
        batches.append(current)
    return batches


def spread_micro_batches(groups: Sequence[Sequence[int]], lengths: Sequence[int], count: int) -> list[list[int]]:
    """``groups`` split further until there are ``count`` of them, or every one holds one sample.

    Ranks that dispatch tokens to experts collectively must run the same number of micro-batches
    (slime cuts every rank's samples into the largest count any rank needs). Splitting keeps
    every micro-batch within the token budget it was cut for: the costliest one (samples x
    longest, the padded size) with two or more samples is halved, its longer half first, until
    the count is reached. Fewer than ``count`` come back only when the rank holds fewer samples.
    """
    out = [list(g) for g in groups]
    while len(out) < count:
        splittable = [k for k, g in enumerate(out) if len(g) > 1]
        if not splittable:
            break
        k = max(splittable, key=lambda j: (len(out[j]) * max(lengths[i] for i in out[j]), -j))
        longest_first = sorted(out[k], key=lambda i: (-lengths[i], i))
        half = (len(longest_first) + 1) // 2
        out[k: k + 1] = [longest_first[:half], longest_first[half:]]
    return out


def split_into_global_batches(num_samples: int, global_batch_size: int | None) -> list[list[int]]:
    """Consecutive chunks of ``global_batch_size`` sample indices, one per optimizer step.

    In batch order, as slime splits a rollout into its training steps (no shuffle); None means
    the whole batch is one step. The batch must split evenly: the run config checks this at
    start, so a mismatch here is a caller's bug and names the flag.
    """
    if global_batch_size is None:
        return [list(range(num_samples))]
    if global_batch_size < 1 or num_samples % global_batch_size != 0 or num_samples == 0:
        raise ValueError(f"a train_step batch of {num_samples} samples does not split into global batches of "
                         f"--global-batch-size {global_batch_size}")
    return [list(range(start, start + global_batch_size)) for start in range(0, num_samples, global_batch_size)]
