"""Which trainer kernels run: resolved once per rank from ``--attention-impl`` / ``--logprob-impl``.

``auto`` keeps right-padded micro-batches and the full-logits head on every device: they are
the fastest measured, on CPU and on an H200 (benchmarks/gpu/results/trainer_kernels_*.txt,
2026-12-02, seq len 2048: 0.5B shape 54.6k train tokens/s padded + full logits, 47.9k with the
chunked head, 44.0k packed with varlen attention, 35.2k both; 1.5B shape 31.1k vs 25.7k with
both). The varlen call itself is 14x faster than the per-sequence loop; the packed (``thd``)
micro-batch around it is what costs. ``--attention-impl varlen`` (packs the micro-batches; needs
SDPA attention and PP = 1) and ``--logprob-impl chunked`` (the [tokens x vocab] logits never
whole: 0.5B peak 39.8 -> 23.3 GiB) are there for memory, chosen explicitly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from actors.megatron.varlen import AttentionImpl, describe_attention

LogprobImpl = Literal["auto", "full", "chunked"]


@dataclass(frozen=True)
class TrainerKernels:
    attention: AttentionImpl  # passed to SDPAttention, which decides per call (dtype, device)
    chunked_logprobs: bool
    chunk_size: int | None  # tokens per logprob chunk; None: an element budget
    pack_sequences: bool = False  # micro-batches as one packed (thd) row instead of right-padded

    def describe(self, dtype: torch.dtype, use_sdpa: bool) -> str:
        attention = (describe_attention(self.attention, dtype) if use_sdpa
                     else "megatron-core's unfused local attention (no packed sequences)")
        head = ("chunked head (logits never whole; "
                + (f"{self.chunk_size} tokens per chunk)" if self.chunk_size else "chunks sized by element budget)")
                if self.chunked_logprobs else "full [tokens x vocab] logits")
        inputs = "packed (thd, no padding)" if self.pack_sequences else "right-padded"
        return f"micro-batches: {inputs}; packed attention: {attention}; logprobs/entropy: {head}"


def resolve_kernels(attention_impl: AttentionImpl, logprob_impl: LogprobImpl, log_probs_chunk_size: int,
                    use_sdpa: bool = False, pipeline_parallel: int = 1) -> TrainerKernels:
    """The kernels of a rank. Packing needs SDPA core attention (megatron-core's unfused one takes
    no ``thd`` input) and one pipeline stage (the stages' send/receive shapes assume ``[S, B]``
    micro-batches); ``auto`` neither packs nor chunks (the module docstring has the measurements)."""
    chunked = logprob_impl == "chunked"
    pack = use_sdpa and pipeline_parallel == 1 and attention_impl == "varlen"
    return TrainerKernels(attention=attention_impl, chunked_logprobs=chunked,
                          chunk_size=log_probs_chunk_size if log_probs_chunk_size > 0 else None,
                          pack_sequences=pack)
