"""The text of a growing list of token ids, decoding only the tokens added since the last call.

Decoding all of a completion after every chunk costs O(length) per chunk, O(length²) per
completion. Here the text of a settled prefix ``ids[:settled]`` is kept, and the text of
``ids[:k]`` is that plus what the tokens after it add, found by decoding a window that starts
``CONTEXT_TOKENS`` before the settled point and dropping the window's own text of the settled
part (vLLM's incremental detokenizer does the same): the tokens before the new ones give the
tokenizer the context its decoding of a token can depend on (SentencePiece drops the leading
space of a text's first token; byte-level BPE needs the earlier bytes of a character).

A prefix is settled only when its text does not end in U+FFFD: that is how a character whose
bytes have not all come yet decodes, and it changes when they do. If the window's text does not
start with its text of the settled part (a tokenizer whose decoding is not prefix-stable), the
whole list is decoded instead, so the answer is always ``decode(ids[:k])`` for tokenizers that
decode a prefix to a prefix of the text, which byte-level BPE (Qwen, Llama 3, GPT-2) and
SentencePiece with this context both do.
"""

from __future__ import annotations

from collections.abc import Callable

DecodeFn = Callable[[list[int]], str]
CONTEXT_TOKENS = 5  # tokens before the settled point decoded with the new ones (vLLM uses 5 too)
PARTIAL = "\ufffd"  # how an incomplete UTF-8 character decodes (errors="replace")


class IncrementalText:
    """``text(ids, k)`` is ``decode(ids[:k])`` for a list that only grows (earlier ids never change;
    a list cut below the settled point is decoded whole)."""

    def __init__(self, decode: DecodeFn):
        self.decode = decode
        self.settled = 0  # ids[:settled] decode to settled_text, and that text is final
        self.settled_text = ""
        self._window_start = 0
        self._window_settled = ""  # decode(ids[_window_start:settled])

    def text(self, ids: list[int], k: int | None = None) -> str:
        """The text of ``ids[:k]`` (all of ``ids`` by default)."""
        k = len(ids) if k is None else k
        if k < self.settled:  # the list was cut (at a stop string): decode what is left, whole
            return self.decode(ids[:k])
        window = self.decode(ids[self._window_start:k])
        if not window.startswith(self._window_settled):
            return self.decode(ids[:k])  # not prefix-stable here: the whole text, exactly
        return self.settled_text + window[len(self._window_settled):]

    def settle(self, ids: list[int], k: int, text: str) -> None:
        """Take ``text`` (= ``text(ids, k)``) as final for ``ids[:k]``, unless it may still change."""
        if k <= self.settled or text.endswith(PARTIAL):
            return
        self.settled, self.settled_text = k, text
        self._window_start = max(0, k - CONTEXT_TOKENS)
        self._window_settled = self.decode(ids[self._window_start:k])

    def advance(self, ids: list[int]) -> str:
        """The text of all of ``ids``, settled as far as it can be: the common call for a stream."""
        text = self.text(ids)
        self.settle(ids, len(ids), text)
        return text
