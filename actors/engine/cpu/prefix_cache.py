"""Prefix cache of the CPU engine: KV caches of recent sequences, reused by later requests.

A multi-turn rollout sends turn k+1 as turn k's prompt + response + new tokens; GRPO sends
the same prompt n times. Both start with tokens whose KV an earlier sequence computed, so
the scheduler looks the longest shared prefix up here before a prefill and only runs the
rest. Entries are evicted least-recently-used when their total length passes a bound.

This is a flat list, not SGLang's radix tree: with a few hundred short sequences on a CPU
the linear scan costs far less than the forward passes it saves.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from dataclasses import dataclass

from actors.engine.cpu.model_runner import SequenceKV, kv_length, slice_kv


@dataclass
class _Entry:
    tokens: tuple[int, ...]  # exactly the tokens `kv` covers
    kv: SequenceKV


def _shared_prefix(a: tuple[int, ...], b: list[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


class PrefixCache:
    """LRU set of (tokens, KV) entries bounded by their total token count."""

    def __init__(self, max_tokens: int) -> None:
        self.max_tokens = max_tokens
        self._entries: OrderedDict[int, _Entry] = OrderedDict()  # oldest first
        self._ids = itertools.count()
        self.total_tokens = 0

    def __len__(self) -> int:
        return len(self._entries)

    def match(self, token_ids: list[int]) -> tuple[int, SequenceKV | None]:
        """Longest cached prefix of `token_ids`, leaving at least one token to run.

        The last token is never served from cache because its forward pass is what yields
        the logits for the next token.
        """
        limit = len(token_ids) - 1
        best_key, best_len = None, 0
        for key, entry in self._entries.items():
            n = min(_shared_prefix(entry.tokens, token_ids), limit)
            if n > best_len:
                best_key, best_len = key, n
        if best_key is None:
            return 0, None
        self._entries.move_to_end(best_key)
        return best_len, slice_kv(self._entries[best_key].kv, best_len)

    def insert(self, tokens: list[int], kv: SequenceKV) -> None:
        """Remember `kv`, which covers exactly `tokens`; drop entries it makes redundant."""
        if kv_length(kv) != len(tokens):
            raise ValueError(f"KV covers {kv_length(kv)} tokens but {len(tokens)} were given")
        if not tokens or len(tokens) > self.max_tokens:
            return
        key_tokens = tuple(tokens)
        for key, entry in list(self._entries.items()):
            shared = _shared_prefix(entry.tokens, tokens)
            if shared == len(tokens):  # an existing entry already covers all of these
                self._entries.move_to_end(key)
                return
            if shared == len(entry.tokens):  # the new entry extends this one
                self._remove(key)
        self._entries[next(self._ids)] = _Entry(key_tokens, kv)
        self.total_tokens += len(key_tokens)
        while self.total_tokens > self.max_tokens:
            self._remove(next(iter(self._entries)))

    def clear(self) -> int:
        """Drop everything; return how many entries were dropped."""
        dropped = len(self._entries)
        self._entries.clear()
        self.total_tokens = 0
        return dropped

    def _remove(self, key: int) -> None:
        self.total_tokens -= len(self._entries.pop(key).tokens)
