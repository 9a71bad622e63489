"""Text stop strings over generated token ids: where to cut a completion at a stop string.

Engines only know stop token ids; a text ``stop`` is matched here, on the decoded text, by the
router's HTTP front and by the rollout's own turns alike. Text processing only: it knows nothing
of the router, the rollout or RL.

``find_stop`` is the definition (it decodes the whole output); ``StopSearch`` gives the same
answer chunk after chunk of one completion while decoding only the new tokens and searching only
the text they can have changed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from slime_async.incremental_text import IncrementalText

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


class StopSearch:
    """``find_stop`` for one completion as it grows: ``feed(ids, first)`` after each chunk.

    A stop string in the text of ``ids[:k]`` that was in no shorter prefix must end in the text
    the tokens after the settled point wrote, so only the last ``len(stop) - 1`` settled
    characters and what follows them are searched.
    """

    def __init__(self, decode: DecodeFn, stops: Sequence[str]):
        self.stops = tuple(stop for stop in stops if stop)
        self.longest = max((len(stop) for stop in self.stops), default=0)
        self.text = IncrementalText(decode)

    def feed(self, ids: list[int], first: int) -> tuple[int, str] | None:
        """``find_stop(ids, decode, stops, first)``, given that the ids are those of earlier
        calls plus new ones and that no earlier call found a stop."""
        if not self.stops or len(ids) <= first:
            return None
        text = self.text.text(ids)
        if self._hit(text) is None:
            self.text.settle(ids, len(ids), text)
            return None
        for k in range(max(first, self.text.settled) + 1, len(ids) + 1):
            text = self.text.text(ids, k)
            stop = self._hit(text)
            if stop is not None:
                return k, stop
        return None  # unreachable for prefix-stable decoding: the whole text held a stop

    def _hit(self, text: str) -> str | None:
        """The stop string that occurs first in the searchable part of ``text``, or None."""
        start = max(0, len(self.text.settled_text) - self.longest + 1)
        hits = [(position, stop) for stop in self.stops if (position := text.find(stop, start)) >= 0]
        return min(hits)[1] if hits else None
