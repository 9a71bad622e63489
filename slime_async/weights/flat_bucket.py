"""SGLang's flattened weight bucket: a bucket's tensors as one uint8 buffer, one broadcast each.

The layout is SGLang 0.5.17's ``FlattenedTensorBucket`` (``srt/weight_sync/tensor_bucket.py``),
which its ``/update_weights_from_distributed`` receives with ``load_format="flattened_bucket"``:
every tensor's bytes (flattened, viewed as uint8) back to back in ``names`` order, no padding;
the receiver learns the split from the request's ``dtypes`` and ``shapes``. Mixed dtypes in one
bucket are fine: the buffer is bytes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch


def flatten(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """One uint8 tensor holding ``tensors``' bytes in order (on their device)."""
    if not tensors:
        raise ValueError("cannot flatten an empty weight bucket")
    return torch.cat([t.contiguous().reshape(-1).view(torch.uint8) for t in tensors])


def nbytes(dtypes: Sequence[torch.dtype], shapes: Sequence[Sequence[int]]) -> int:
    """Size of the flat buffer of tensors of these dtypes and shapes."""
    return sum(math.prod(shape) * dtype.itemsize for dtype, shape in zip(dtypes, shapes))


def unflatten(flat: torch.Tensor, dtypes: Sequence[torch.dtype], shapes: Sequence[Sequence[int]]) -> list[torch.Tensor]:
    """The tensors a flat buffer holds. Views of it where the offset suits the dtype; a copy where a
    smaller dtype before left it misaligned (SGLang's own ``view`` would fail there)."""
    if flat.dtype != torch.uint8 or flat.dim() != 1:
        raise ValueError(f"a flat bucket is a 1-D uint8 tensor, got {flat.dtype} of shape {tuple(flat.shape)}")
    expected = nbytes(dtypes, shapes)
    if flat.numel() != expected:
        raise ValueError(f"flat bucket holds {flat.numel()} bytes, its dtypes and shapes need {expected}")
    out, start = [], 0
    for dtype, shape in zip(dtypes, shapes):
        size = math.prod(shape) * dtype.itemsize
        piece = flat[start:start + size]
        if start % torch.empty((), dtype=dtype).element_size():
            piece = piece.clone()
        out.append(piece.view(dtype).reshape(tuple(shape)))
        start += size
    return out
