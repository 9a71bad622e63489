"""What the front adds around the generation loop: the answer's text and streamed text deltas.

The loop itself (budget, text stops, chunking, resume after aborts, per-token versions) is
`slime_async.generation`, shared with the rollout's ``generate_turn``; its names are re-exported
here for the front's protocol modules.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from slime_async.generation import (MAX_ABORTS, Completion, CompletionSpec, GenerationFailed, ProgressFn, SendFn,
                                    complete)

CompletionFailed = GenerationFailed  # the front's name for it

__all__ = ["MAX_ABORTS", "Completion", "CompletionFailed", "CompletionSpec", "ProgressFn", "SendFn", "TextStream",
           "complete", "completion_text"]


def completion_text(completion: Completion, decode: Callable[[list[int]], str], no_stop_trim: bool) -> str:
    """The text SGLang would answer: a matched stop string (or stop token) is trimmed from the
    text, not from the ids, unless ``no_stop_trim``."""
    ids = completion.output_ids
    matched = (completion.finish_reason or {}).get("matched")
    if no_stop_trim or matched is None:
        return decode(ids)
    if isinstance(matched, str):
        text = decode(ids)
        position = text.find(matched)
        return text[:position] if position >= 0 else text
    return decode(ids[:-1]) if ids else ""


class TextStream:
    """Text deltas for a streaming client: only text that can no longer change is sent.

    Held back: a trailing partial UTF-8 character (decoded as U+FFFD until its last byte comes)
    and a tail that could be the start of a stop string (it would be trimmed if the stop
    completes).
    """

    def __init__(self, stops: Sequence[str] = ()):
        self.stops = tuple(stops)
        self.sent = 0

    def delta(self, text: str, final: bool) -> str:
        end = len(text) if final else len(text) - self._holdback(text)
        if end <= self.sent:
            return ""
        piece, self.sent = text[self.sent:end], end
        return piece

    def _holdback(self, text: str) -> int:
        settled = text.rstrip("\ufffd")
        partial = 0
        for stop in self.stops:
            for size in range(min(len(stop) - 1, len(settled)), 0, -1):
                if settled.endswith(stop[:size]):
                    partial = max(partial, size)
                    break
        return len(text) - len(settled) + partial
