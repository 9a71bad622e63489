"""Token ids an engine can take without dying.

SGLang 0.5.17 never checks input ids against the vocabulary (its TokenizerManager defines
``_validate_input_ids_in_vocab``, and no path calls it), and its scheduler process exits on an id
out of range: a CUDA device-side assert in the embedding or the logprob gather takes the whole
server down, on a plain ``/generate`` too (measured, benchmarks/gpu/results/sglang_input_contract/).
So every place that passes on ids it did not sample itself — a hook's or an agent's tokens, an HTTP
client's, a student's to a teacher — checks them here first; the CPU engine refuses the same ids.
"""

from __future__ import annotations

from collections.abc import Sequence


def out_of_vocabulary(ids: Sequence[int], vocab_size: int | None, name: str = "input_ids") -> str | None:
    """None when every id lies in [0, vocab_size) (or the size is unknown); else one line naming
    the first id that does not, as ``name[position]=id``."""
    if vocab_size is None:
        return None
    for position, token in enumerate(ids):
        if not 0 <= token < vocab_size:
            return f"{name}[{position}]={token!r} is outside the vocabulary [0, {vocab_size})"
    return None
