"""Text stop strings over generated token ids: where to cut a completion at a stop string.

Engines only know stop token ids; a text ``stop`` is matched here, on the decoded text, by the
router's HTTP front and by the rollout's own turns alike. Text processing only: it knows nothing
of the router, the rollout or RL.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

DecodeFn = Callable[[list[int]], str]


def find_stop(ids: list[int], decode: DecodeFn, stops: Sequence[str], first: int = 0) -> tuple[int, str] | None:
    """``(k, stop)`` for the shortest ``ids[:k]`` (``k > first``) whose text contains a stop string.

    Token ``k - 1`` completes the stop string: it is kept (it was generated and sampled with
    its logprob), everything after it is dropped. Tokens before ``first`` held no stop string.
    """
    if not any(stop in decode(ids) for stop in stops):
        return None
    for k in range(first + 1, len(ids) + 1):
        text = decode(ids[:k])
        hits = [(text.find(stop), stop) for stop in stops if stop in text]
        if hits:
            return k, min(hits)[1]
    return None
