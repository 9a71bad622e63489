"""Staleness admission rule and token masking."""

import random
from collections import deque

import pytest
import torch

from policies.staleness import (
    deadline,
    is_too_stale,
    max_admissible_groups,
    may_admit,
    must_wait_for_stragglers,
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


# ----- stragglers: deadlines and the wait rule ------------------------------------------------------
def test_deadline_is_the_version_plus_k():
    # a group admitted at version 3 under k = 2 may be trained at version 5 at the latest
    assert deadline(3, 2) == 5


def wait(buffered, in_flight, train_version=5, n_groups=2, groups_per_version=2, taken=0):
    return must_wait_for_stragglers(buffered, in_flight, train_version, n_groups, groups_per_version, taken)


def test_a_step_waits_for_a_group_whose_deadline_it_is_rather_than_train_later_ones():
    # t = 5, G = n = 2: the step would take [6, 7]; the in-flight group due at 5 is left, and no later
    # step may train it: room(5) = 0 < 1, and the step takes a group due after 5 -> wait
    assert wait(buffered=[6, 7], in_flight=[5])


def test_a_straggler_with_slack_does_not_hold_the_step():
    # the in-flight group is due at 6: room(6) = (6 - 5) * 2 = 2 >= 1, the next step can take it
    assert not wait(buffered=[6, 7], in_flight=[6])


def test_a_step_waits_when_the_groups_due_next_would_overflow_the_next_step():
    # the step would take [7, 7]; three groups due at 6 are in flight but room(6) = 2 -> wait
    assert wait(buffered=[7, 7], in_flight=[6, 6, 6])


def test_a_step_full_of_groups_as_urgent_as_the_stragglers_goes_ahead():
    # three buffered groups due at 6, two more in flight: the step takes two due at 6, room(6) = 2 < 3
    # left due at 6, but waiting cannot help: nothing the step takes is due later than they are
    assert not wait(buffered=[6, 6, 6], in_flight=[6, 6])


def test_a_straggler_already_past_its_deadline_is_not_waited_for():
    # due at 4, the step is at 5: it is too stale whatever happens
    assert not wait(buffered=[6, 7], in_flight=[4])


def test_later_steps_of_the_same_version_make_room_for_its_stragglers():
    # G = 4, n = 2 (two steps per version): after this first step 4 - 0 - 2 = 2 more groups may
    # still be trained at version 5, so the two in flight due at 5 can wait for the next step
    assert not wait(buffered=[6, 6], in_flight=[5, 5], n_groups=2, groups_per_version=4, taken=0)


def test_the_last_step_of_a_version_waits_for_its_stragglers():
    # the same, but two groups were taken at version 5 already: 4 - 2 - 2 = 0 left -> wait
    assert wait(buffered=[6, 6], in_flight=[5, 5], n_groups=2, groups_per_version=4, taken=2)


def test_stragglers_due_before_the_latest_group_taken_are_counted_by_deadline():
    # the step takes [5, 9]: the three in flight due at 6 exceed room(6) = 2 -> wait; two would fit
    assert wait(buffered=[5, 9], in_flight=[6, 6, 6])
    assert not wait(buffered=[5, 9], in_flight=[6, 6])


def test_stragglers_due_with_the_latest_group_taken_do_not_hold_the_step():
    # the step takes [5, 6]; three due at 6 in flight would overflow room(6) = 2, but a group due
    # at 6 is no more urgent than the one the step takes: waiting would not save any of them
    assert not wait(buffered=[5, 6, 9], in_flight=[6, 6, 6])


def test_the_wait_rule_decides_nothing_before_the_step_could_be_served():
    assert not wait(buffered=[7], in_flight=[5])  # one buffered group for a step of two


def test_the_wait_rule_rejects_an_empty_step():
    with pytest.raises(ValueError, match="n_groups"):
        wait(buffered=[], in_flight=[], n_groups=0)


def _simulate_stragglers(policy: str, steps: int = 40, seed: int = 0) -> tuple[int, int]:
    """Admission as the buffer does it, one straggler in every group of four that takes a random
    2-4 steps while the rest take none; a step takes the G buffered groups of earliest deadline,
    waiting when `must_wait_for_stragglers` says so (policy "wait"). Returns (trained, dropped)."""
    rng = random.Random(seed)
    k, g = 1, 4
    in_flight: list[tuple[int, int]] = []  # (admission version, steps it still needs)
    buffered: list[int] = []  # deadlines
    version = consumed = trained = dropped = 0
    for _ in range(steps * 10):
        while may_admit(version, k, g, consumed, len(in_flight) + len(buffered)):
            in_flight.append((version, rng.choice([2, 3, 4]) if (len(in_flight) + consumed) % 4 == 0 else 0))
        buffered += [deadline(a, k) for a, left in in_flight if left == 0]
        in_flight = [(a, left) for a, left in in_flight if left > 0]
        dropped += sum(d < version for d in buffered)
        buffered = [d for d in buffered if d >= version]
        holds = policy == "wait" and must_wait_for_stragglers(buffered, [deadline(a, k) for a, _ in in_flight],
                                                              version, g, g)
        if len(buffered) >= g and not holds:
            buffered.sort()
            assert all(version <= d for d in buffered[:g])  # within the bound
            buffered = buffered[g:]
            consumed += g
            trained += g
            version += 1
        in_flight = [(a, left - 1) for a, left in in_flight]  # time passes: stragglers progress
        if version >= steps:
            break
    return trained, dropped


def test_waiting_for_stragglers_drops_nothing_where_going_ahead_drops_them():
    # k = 1: a straggler that needs 3 or 4 steps misses its deadline when the steps go ahead
    trained_drop, dropped_drop = _simulate_stragglers("drop")
    trained_wait, dropped_wait = _simulate_stragglers("wait")
    assert dropped_drop > 0
    assert (trained_wait, dropped_wait) == (trained_drop, 0)
