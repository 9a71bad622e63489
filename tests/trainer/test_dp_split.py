"""Placement of samples across DP ranks and into micro-batches (pure functions)."""

import pytest

from actors.megatron.dp_split import split_across_dp, split_into_micro_batches, spread_micro_batches


def test_every_sample_is_placed_exactly_once():
    lengths = [5, 9, 1, 7, 3, 3, 8]
    bins = split_across_dp(lengths, 3)
    assert sorted(i for b in bins for i in b) == list(range(len(lengths)))


def test_longest_first_balances_tokens_hand_computed():
    # The lighter bin takes each next item: 8->A, 7->B, 6->B (13), 5->A (13), and 4 breaks
    # the 13/13 tie (equal sample counts too) toward rank 0: A=17, B=13.
    bins = split_across_dp([8, 7, 6, 5, 4], 2)
    assert bins == [[0, 3, 4], [1, 2]]
    assert [sum([8, 7, 6, 5, 4][i] for i in b) for b in bins] == [17, 13]


def test_balanced_by_tokens_not_count():
    # One long sample against many short ones: the long one gets a bin to itself.
    bins = split_across_dp([100, 10, 10, 10, 10, 10], 2)
    assert bins == [[0], [1, 2, 3, 4, 5]]


def test_fewer_samples_than_ranks_is_an_error():
    with pytest.raises(ValueError, match="cannot feed 4 data-parallel ranks"):
        split_across_dp([3, 4], 4)


def test_micro_batches_respect_padded_token_budget():
    lengths = [10, 4, 6, 3, 9]
    batches = split_into_micro_batches(lengths, max_tokens=20)
    # Longest first: [10, 9] costs 2x10=20; then [6, 4, 3] costs 3x6=18.
    assert batches == [[0, 4], [2, 1, 3]]
    for b in batches:
        assert len(b) * max(lengths[i] for i in b) <= 20


def test_sample_longer_than_budget_gets_its_own_micro_batch():
    assert split_into_micro_batches([50, 5, 5], max_tokens=16) == [[0], [1, 2]]


def test_fixed_micro_batch_size_chunks_in_order():
    assert split_into_micro_batches([1, 2, 3, 4, 5], micro_batch_size=2) == [[0, 1], [2, 3], [4]]


def test_exactly_one_micro_batching_rule():
    with pytest.raises(ValueError, match="exactly one"):
        split_into_micro_batches([1], max_tokens=4, micro_batch_size=1)
    with pytest.raises(ValueError, match="exactly one"):
        split_into_micro_batches([1])


def test_spreading_halves_the_costliest_micro_batch_until_the_count_is_reached():
    lengths = [4, 4, 4, 4, 4, 9]
    # [[5], [0, 1, 2, 3, 4]] costs 9 and 5x4=20: the second is halved (3 and 2 samples), then
    # the 3-sample half (12 tokens) again -> 4 micro-batches.
    assert spread_micro_batches([[5], [0, 1, 2, 3, 4]], lengths, 4) == [[5], [0, 1], [2], [3, 4]]


def test_spreading_stops_at_one_sample_per_micro_batch():
    assert spread_micro_batches([[0, 1]], [3, 5], 4) == [[1], [0]]


def test_spreading_to_the_same_count_changes_nothing():
    assert spread_micro_batches([[2, 0], [1]], [6, 3, 7], 2) == [[2, 0], [1]]
