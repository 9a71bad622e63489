"""Dynamic-sampling filters: keep a finished group of responses for training, or drop it.

A filter takes the rewards of one group (all responses to one prompt) and returns True to keep.
"""

from __future__ import annotations

from collections.abc import Callable

GroupFilter = Callable[[list[float]], bool]

# Rewards closer than this count as equal (float rewards from averaged sub-scores jitter).
REWARD_TIE_TOLERANCE = 1e-6


def keep_nonuniform_rewards(rewards: list[float]) -> bool:
    """Keep a group only if its rewards are not all equal (DAPO dynamic sampling).

    With group-relative advantages an all-equal group has A = 0 everywhere and contributes no
    gradient, only noise in the token count. An empty or single-response group is dropped.
    """
    if len(rewards) < 2:
        return False
    return max(rewards) - min(rewards) > REWARD_TIE_TOLERANCE


BUILTIN_FILTERS: dict[str, GroupFilter] = {"nonuniform": keep_nonuniform_rewards}
