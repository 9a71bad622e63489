"""``slime.rollout.filter_hub.dynamic_sampling_filters``: slime's built-in group filters."""

from __future__ import annotations

import statistics
from typing import Any

from slime_async.compat.slime.rollout.filter_hub.base_types import DynamicFilterOutput
from slime_async.sample import Sample

__all__ = ["check_reward_nonzero_std", "check_reward_nonzero_std_with_fallback"]


def check_reward_nonzero_std(args: Any, samples: list[Sample], **kwargs: Any) -> DynamicFilterOutput:
    """Keep a group whose rewards are not all equal (std > 1e-6, sample std as torch's)."""
    rewards = [float(sample.get_reward_value(args)) for sample in samples]
    keep = len(rewards) > 1 and statistics.stdev(rewards) > 1e-6
    return DynamicFilterOutput(keep=keep, reason=None if keep else f"zero_std_{round(rewards[0], 1) if rewards else 0}")


def check_reward_nonzero_std_with_fallback(args: Any, samples: list[Sample], **kwargs: Any) -> DynamicFilterOutput:
    output = check_reward_nonzero_std(args, samples, **kwargs)
    output.keep_when_insufficient = True
    return output
