"""Staleness admission rule and token masking."""

import random
from collections import deque

import pytest
import torch

from policies.staleness import (
    is_too_stale,
    max_admissible_groups,
    may_admit,
    offpolicy_token_mask,
    oldest_first,
    staleness,
)


def test_max_admissible_groups_is_version_plus_k_plus_one_steps_of_groups():
    # (2 + 1 + 1) · 4 = 16
    assert max_admissible_groups(version=2, max_staleness=1, groups_per_step=4) == 16


def test_may_admit_while_consumed_plus_pending_is_below_the_limit():
    # version 2, k 1, G 4 -> limit 16: 8 consumed + 7 pending = 15 < 16 admits, 16 does not
    assert may_admit(2, 1, 4, consumed_groups=8, pending_groups=7)
    assert not may_admit(2, 1, 4, consumed_groups=8, pending_groups=8)


def test_zero_staleness_admits_exactly_one_step_of_groups_per_version():
    # k 0 at version 0: limit 1 · 4 = 4 -> synchronous RL
    assert may_admit(0, 0, 4, consumed_groups=0, pending_groups=3)
    assert not may_admit(0, 0, 4, consumed_groups=0, pending_groups=4)


def test_invalid_arguments_are_rejected_by_name():
    with pytest.raises(ValueError, match="max_staleness"):
        max_admissible_groups(0, -1, 4)
    with pytest.raises(ValueError, match="groups_per_step"):
        max_admissible_groups(0, 1, 0)


def _simulate(max_staleness, groups_per_step, drop_probability, steps=30):
    """Greedy producer + FIFO trainer; returns the staleness of every trained group.

    Each round the producer admits all it may, then some pending groups fail or are filtered
    out (they leave without being consumed); a training step runs, and bumps the version,
    only when a full step of groups is ready.
    """
    rng = random.Random(0)
    fifo: deque[int] = deque()  # admission version of each pending group
    consumed = 0
    version = 0
    observed = []
    while version < steps:
        while may_admit(version, max_staleness, groups_per_step, consumed, len(fifo)):
            fifo.append(version)
        fifo = deque(v for v in fifo if rng.random() >= drop_probability)
        if len(fifo) >= groups_per_step:
            observed.extend(staleness(version, fifo.popleft()) for _ in range(groups_per_step))
            consumed += groups_per_step
            version += 1
    return observed


@pytest.mark.parametrize("max_staleness", [0, 1, 3])
def test_greedy_admission_never_trains_a_group_older_than_the_bound(max_staleness):
    observed = _simulate(max_staleness, groups_per_step=4, drop_probability=0.0)
    assert max(observed) == max_staleness  # the bound holds and is reached (not over-conservative)


def test_dropped_groups_free_their_slot_without_breaking_the_bound():
    observed = _simulate(max_staleness=2, groups_per_step=4, drop_probability=0.2)
    assert observed and max(observed) <= 2


def test_staleness_is_train_version_minus_oldest_token_version():
    assert staleness(train_version=7, oldest_token_version=4) == 3


def test_is_too_stale_only_beyond_the_bound():
    assert not is_too_stale(7, 5, max_staleness=2)
    assert is_too_stale(7, 4, max_staleness=2)


def test_no_bound_means_never_too_stale():
    assert not is_too_stale(100, 0, max_staleness=None)


def test_offpolicy_token_mask_zeroes_tokens_older_than_the_bound():
    # train version 5, k 1: versions 3 (stale by 2) masked, 4 and 5 kept
    mask = offpolicy_token_mask(torch.tensor([[3, 3, 4, 5]]), train_version=5, max_staleness=1)
    torch.testing.assert_close(mask, torch.tensor([[0.0, 0.0, 1.0, 1.0]]))


def test_oldest_first_picks_the_oldest_versions_and_breaks_ties_by_arrival():
    # versions by arrival: 3 1 2 1 0 -> oldest two are index 4 (v0) and index 1 (v1, before index 3).
    assert oldest_first([3, 1, 2, 1, 0], 2) == [1, 4]
    assert oldest_first([3, 1, 2, 1, 0], 3) == [1, 3, 4]
    assert oldest_first([5, 5, 5], 2) == [0, 1]  # one version: plain FIFO
    assert oldest_first([1, 0], 5) == [0, 1]
