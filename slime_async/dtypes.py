"""A torch dtype from its name, as the wire formats (SGLang's payloads, delta metadata) spell it."""

from __future__ import annotations

import torch


def dtype_from_name(name: str, error: type[Exception] = ValueError) -> torch.dtype:
    """``torch.bfloat16`` for "bfloat16" or "torch.bfloat16"; ``error`` naming the name otherwise."""
    dtype = getattr(torch, str(name).removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype):
        raise error(f"unknown dtype {name!r}")
    return dtype
