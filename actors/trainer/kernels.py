"""Which trainer kernels run: resolved once per rank from ``--attention-impl`` / ``--logprob-impl``.

``auto`` picks the fast path only where it runs and is faster: micro-batches packed into one
row of back-to-back samples (no padding) attended in one varlen call with a flash kernel (CUDA,
half precision), and the chunked logprob head on CUDA. On CPU the right-padded micro-batches
and the full-logits head are kept: they are what every CPU test and run has measured, the
per-sequence loop a packed batch would need is no faster there, and memory is not the
constraint. ``--attention-impl loop|varlen`` and ``--logprob-impl full|chunked`` force either
on any device (``varlen`` packs the micro-batches; it needs SDPA attention and PP = 1).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from actors.trainer.varlen import AttentionImpl, describe_attention

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
                    cuda: bool, use_sdpa: bool = False, pipeline_parallel: int = 1,
                    flash: bool = False) -> TrainerKernels:
    """The kernels of a rank on a machine with (``cuda``) or without CUDA.

    Packing needs SDPA core attention (megatron-core's unfused one takes no ``thd`` input) and
    one pipeline stage (the stages' send/receive shapes assume ``[S, B]`` micro-batches).
    ``auto`` packs only where ``flash`` (``varlen.flash_runs`` of the params dtype): without a
    flash kernel the attention of a packed batch falls back to the per-sequence loop, which
    reads the boundaries from the device once per layer.
    """
    chunked = logprob_impl == "chunked" or (logprob_impl == "auto" and cuda)
    pack = (use_sdpa and pipeline_parallel == 1
            and (attention_impl == "varlen" or (attention_impl == "auto" and cuda and flash)))
    return TrainerKernels(attention=attention_impl, chunked_logprobs=chunked,
                          chunk_size=log_probs_chunk_size if log_probs_chunk_size > 0 else None,
                          pack_sequences=pack)
