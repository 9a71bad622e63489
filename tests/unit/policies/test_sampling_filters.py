"""Dynamic-sampling group filters."""

from policies.sampling_filters import BUILTIN_FILTERS, keep_nonuniform_rewards


def test_group_with_differing_rewards_is_kept():
    assert keep_nonuniform_rewards([1.0, 0.0, 1.0])


def test_group_whose_rewards_all_agree_is_dropped():
    assert not keep_nonuniform_rewards([1.0, 1.0, 1.0])


def test_rewards_differing_by_float_noise_count_as_equal():
    assert not keep_nonuniform_rewards([0.3, 0.1 + 0.2])


def test_empty_and_single_response_groups_are_dropped():
    assert not keep_nonuniform_rewards([])
    assert not keep_nonuniform_rewards([1.0])


def test_registry_names_the_filter():
    assert BUILTIN_FILTERS["nonuniform"] is keep_nonuniform_rewards
