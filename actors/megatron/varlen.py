"""Packed ("thd") attention of every sequence in one call, and which implementation runs.

Implementations, all with the shapes of ``torch.nn.attention.varlen.varlen_attn``
(query [T, Hq, D], key/value [T, Hkv, D], cumulative boundaries ``cu_q`` / ``cu_k``):

- ``flash``: on CUDA in bf16/fp16, torch's own ``varlen_attn`` (torch >= 2.10, FlashAttention
  kernels shipped with torch), else flash-attn's ``flash_attn_varlen_func`` where installed.
- ``masked``: one SDPA call over all tokens with a block-diagonal causal mask; exact, and what
  runs elsewhere when the one-call path is asked for. On CPU it is 3-6x slower than attending
  each sequence alone (measured: 8 x 64 tokens, 8 heads of 64, 1 thread: 31 ms vs 8.6 ms), so
  ``auto`` keeps the per-sequence loop there.

``varlen_attn``'s keyword arguments changed between torch releases (``is_causal`` in 2.10,
``window_size=(-1, 0)`` later; ``enable_gqa`` only in the newest), so the call is adapted to
the signature found at import time rather than to a version number.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from functools import lru_cache
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor

AttentionImpl = Literal["auto", "loop", "varlen"]

# (q, k, v, cu_q, cu_k, max_q, max_k, scale, causal) -> [T, Hq, D]
VarlenFn = Callable[[Tensor, Tensor, Tensor, Tensor, Tensor, int, int, float, bool], Tensor]


def _repeat_kv(q: Tensor, kv: Tensor) -> Tensor:
    groups = q.size(1) // kv.size(1)
    return kv if groups == 1 else kv.repeat_interleave(groups, dim=1)


def _torch_varlen() -> VarlenFn | None:
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    params = inspect.signature(varlen_attn).parameters
    native_gqa = "enable_gqa" in params

    def call(q, k, v, cu_q, cu_k, max_q, max_k, scale, causal):
        kwargs = {}
        if "window_size" in params:
            kwargs["window_size"] = (-1, 0) if causal else (-1, -1)
        else:
            kwargs["is_causal"] = causal
        if "scale" in params:
            kwargs["scale"] = scale
        elif not math.isclose(scale, 1.0 / math.sqrt(q.size(-1))):
            q = q * (scale * math.sqrt(q.size(-1)))  # the kernel's fixed 1/sqrt(d), rescaled
        if native_gqa and k.size(1) != q.size(1):
            kwargs["enable_gqa"] = True
        elif not native_gqa:
            k, v = _repeat_kv(q, k), _repeat_kv(q, v)
        return varlen_attn(q, k, v, cu_q, cu_k, max_q, max_k, **kwargs)

    return call


def _flash_attn_varlen() -> VarlenFn | None:
    try:
        from flash_attn import flash_attn_varlen_func
    except ImportError:
        return None

    def call(q, k, v, cu_q, cu_k, max_q, max_k, scale, causal):
        # flash-attn takes GQA natively (Hq a multiple of Hkv).
        return flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k, dropout_p=0.0, softmax_scale=scale,
                                      causal=causal)

    return call


def masked_varlen(q: Tensor, k: Tensor, v: Tensor, cu_q: Tensor, cu_k: Tensor, max_q: int, max_k: int,
                  scale: float, causal: bool) -> Tensor:
    """One SDPA call over all packed tokens: token i sees token j only within its own sequence
    (and, causal, only j at or before i). Rows outside every sequence see nothing (zeros)."""
    seg_q = _segment_ids(cu_q, q.size(0))
    seg_k = _segment_ids(cu_k, k.size(0))
    allowed = seg_q[:, None] == seg_k[None, :]
    if causal:
        # Top-left aligned within each sequence, as SDPA's is_causal (q and k sequences are the
        # same tokens in self-attention).
        last = cu_q.numel() - 2
        pos_q = torch.arange(q.size(0), device=q.device) - cu_q.long()[seg_q.clamp(max=last)]
        pos_k = torch.arange(k.size(0), device=k.device) - cu_k.long()[seg_k.clamp(max=last)]
        allowed = allowed & (pos_k[None, :] <= pos_q[:, None])
    outside = seg_q >= cu_q.numel() - 1
    allowed = allowed & ~outside[:, None]
    # A row with nothing allowed would give NaN: let it attend everywhere, then zero it.
    empty = ~allowed.any(dim=-1)
    allowed = allowed | empty[:, None]
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
        attn_mask=allowed, scale=scale, enable_gqa=k.size(1) != q.size(1),
    )[0].transpose(0, 1)
    return out.masked_fill(empty[:, None, None], 0.0)


def _segment_ids(cu: Tensor, total: int) -> Tensor:
    """Sequence index of each of ``total`` rows (``len(cu) - 1`` for rows past the last one)."""
    return torch.searchsorted(cu.long(), torch.arange(total, device=cu.device), right=True) - 1 \
        if total else torch.zeros(0, dtype=torch.long, device=cu.device)


@lru_cache(maxsize=1)  # what is installed does not change within a process; asked per layer call
def flash_varlen() -> tuple[str, VarlenFn] | None:
    """(name, fn) of the first installed flash varlen kernel, or None."""
    for name, make in (("torch.nn.attention.varlen.varlen_attn", _torch_varlen),
                       ("flash_attn.flash_attn_varlen_func", _flash_attn_varlen)):
        fn = make()
        if fn is not None:
            return name, fn
    return None


def flash_runs(dtype: torch.dtype) -> bool:
    """Whether a flash varlen kernel runs here for ``dtype`` (CUDA, half precision, installed)."""
    return torch.cuda.is_available() and dtype in (torch.bfloat16, torch.float16) and flash_varlen() is not None


def describe_attention(requested: AttentionImpl, dtype: torch.dtype) -> str:
    """What packed attention runs for ``--attention-impl requested`` at ``dtype``, in words."""
    if requested == "loop" or (requested == "auto" and not flash_runs(dtype)):
        return "per-sequence SDPA loop"
    if flash_runs(dtype):
        return f"one varlen call ({flash_varlen()[0]})"
    return "one SDPA call with a block-diagonal causal mask (no flash varlen kernel here)"
