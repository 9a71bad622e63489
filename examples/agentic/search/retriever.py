"""A local BM25 retriever over the example's corpus (``bm25s``, sparse-matrix BM25).

Words are lower-cased and split on non-letters; no stop words are removed (the relation words
"country" and "river" are what tell a city's two passages apart) and no stemming (names are
made up). A query with no known word returns nothing.
"""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path

import bm25s

_WORD = re.compile(r"[a-z0-9]+")


def words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


class Retriever:
    def __init__(self, passages: list[str]):
        if not passages:
            raise ValueError("the retriever needs at least one passage")
        self.passages = list(passages)
        self._vocab: dict[str, int] = {}
        corpus_ids = [[self._vocab.setdefault(w, len(self._vocab)) for w in words(p)] for p in self.passages]
        self._bm25 = bm25s.BM25()
        self._bm25.index(bm25s.tokenization.Tokenized(ids=corpus_ids, vocab=self._vocab), show_progress=False)

    def search(self, query: str, k: int = 1) -> list[str]:
        """The top-``k`` passages for ``query``, best first (fewer when fewer match any word)."""
        ids = [self._vocab[w] for w in words(query) if w in self._vocab]
        if not ids:
            return []
        k = min(k, len(self.passages))
        docs, scores = self._bm25.retrieve([ids], k=k, show_progress=False, n_threads=1)
        return [self.passages[int(d)] for d, s in zip(docs[0], scores[0]) if s > 0]


@functools.lru_cache(maxsize=4)
def load(path: str) -> Retriever:
    """The retriever of a corpus file (JSONL rows ``{"text": ...}``), built once per process:
    every sample of a run searches the same corpus."""
    rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    return Retriever([row["text"] for row in rows])
