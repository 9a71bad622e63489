"""Which trainer kernels run: resolved once per rank from ``--attention-impl`` / ``--logprob-impl``.

``auto`` picks the fast path only where it runs and is faster: the one-call varlen attention
with a flash kernel (CUDA, half precision), and the chunked logprob head on CUDA (on CPU the
full-logits path is kept: it is what every CPU test and run has measured, and memory is not
the constraint there). ``--attention-impl loop|varlen`` and ``--logprob-impl full|chunked``
force either on any device.
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

    def describe(self, dtype: torch.dtype, use_sdpa: bool) -> str:
        attention = (describe_attention(self.attention, dtype) if use_sdpa
                     else "megatron-core's unfused local attention (no packed sequences)")
        head = ("chunked head (logits never whole; "
                + (f"{self.chunk_size} tokens per chunk)" if self.chunk_size else "chunks sized by element budget)")
                if self.chunked_logprobs else "full [tokens x vocab] logits")
        return f"packed attention: {attention}; logprobs/entropy: {head}"


def resolve_kernels(attention_impl: AttentionImpl, logprob_impl: LogprobImpl, log_probs_chunk_size: int,
                    cuda: bool) -> TrainerKernels:
    """The kernels of a rank on a machine with (``cuda``) or without CUDA."""
    chunked = logprob_impl == "chunked" or (logprob_impl == "auto" and cuda)
    return TrainerKernels(attention=attention_impl, chunked_logprobs=chunked,
                          chunk_size=log_probs_chunk_size if log_probs_chunk_size > 0 else None)
