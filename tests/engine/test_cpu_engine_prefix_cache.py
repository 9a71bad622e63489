"""The CPU engine's prefix cache on its own: matching, superseding, LRU eviction."""

from __future__ import annotations

import torch

from actors.engine.cpu.prefix_cache import PrefixCache


def kv_for(tokens: list[int], layers: int = 2) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """A fake cache whose key at position i holds tokens[i], so slices can be checked."""
    keys = torch.tensor(tokens, dtype=torch.float32).view(1, 1, -1, 1)
    return [(keys.clone(), keys.clone()) for _ in range(layers)]


def test_match_returns_the_longest_shared_prefix_and_its_kv():
    cache = PrefixCache(max_tokens=100)
    cache.insert([1, 2, 3, 4], kv_for([1, 2, 3, 4]))
    cache.insert([1, 2, 9], kv_for([1, 2, 9]))
    length, kv = cache.match([1, 2, 3, 7, 8])
    assert length == 3
    assert kv[0][0].flatten().tolist() == [1, 2, 3]


def test_match_always_leaves_the_last_token_to_run():
    cache = PrefixCache(max_tokens=100)
    cache.insert([1, 2, 3], kv_for([1, 2, 3]))
    assert cache.match([1, 2, 3])[0] == 2


def test_no_shared_prefix_is_a_miss():
    cache = PrefixCache(max_tokens=100)
    cache.insert([1, 2, 3], kv_for([1, 2, 3]))
    assert cache.match([5, 6]) == (0, None)


def test_an_extending_sequence_replaces_its_prefix_entry():
    cache = PrefixCache(max_tokens=100)
    cache.insert([1, 2], kv_for([1, 2]))
    cache.insert([1, 2, 3, 4], kv_for([1, 2, 3, 4]))
    assert len(cache) == 1 and cache.total_tokens == 4


def test_a_sequence_already_covered_is_not_stored_twice():
    cache = PrefixCache(max_tokens=100)
    cache.insert([1, 2, 3, 4], kv_for([1, 2, 3, 4]))
    cache.insert([1, 2], kv_for([1, 2]))
    assert len(cache) == 1 and cache.total_tokens == 4


def test_least_recently_used_entry_is_evicted_past_the_bound():
    cache = PrefixCache(max_tokens=6)
    cache.insert([1, 1, 1], kv_for([1, 1, 1]))
    cache.insert([2, 2, 2], kv_for([2, 2, 2]))
    cache.match([1, 1, 1, 5])  # touch the older entry
    cache.insert([3, 3, 3], kv_for([3, 3, 3]))
    assert cache.match([2, 2, 2, 5])[0] == 0
    assert cache.match([1, 1, 1, 5])[0] == 3
    assert cache.total_tokens == 6


def test_a_sequence_longer_than_the_bound_is_not_cached():
    cache = PrefixCache(max_tokens=3)
    cache.insert([1, 2, 3, 4], kv_for([1, 2, 3, 4]))
    assert len(cache) == 0


def test_clear_drops_every_entry():
    cache = PrefixCache(max_tokens=100)
    cache.insert([1, 2], kv_for([1, 2]))
    cache.insert([3, 4], kv_for([3, 4]))
    assert cache.clear() == 2
    assert cache.match([1, 2, 3]) == (0, None) and cache.total_tokens == 0
