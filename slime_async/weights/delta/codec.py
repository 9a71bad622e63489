"""Tensor bytes <-> delta payloads, and the checksums that prove a reconstruction bit-exact.

Pure functions of bytes; no I/O. A tensor's payload is its raw bytes (full) or the bit-XOR of
its raw bytes against the receiver's copy of the same tensor (delta), byte-shuffled, then
zstd-compressed. Everything works on the bytes, never on float values, so NaN payloads, ±inf,
−0 and denormals survive unchanged.

Why XOR + shuffle + zstd: an RL step at a small learning rate moves most weights by less than
one unit in the last place of bf16, so their bits do not change at all, and a changed one keeps
its sign and exponent. The XOR is zero wherever nothing changed; shuffling puts byte k of every
element next to each other (the high bytes, sign and exponent, are then long runs of zeros), and
zstd turns the runs into almost nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np
import torch
import xxhash
import zstandard

from slime_async.dtypes import dtype_from_name

ENCODINGS = ("raw", "xor", "same")  # raw: the bytes; xor: bytes XOR base; same: identical to base
ZSTD_LEVEL = 3


class DeltaDecodeError(ValueError):
    """A payload that does not reconstruct its tensor (corrupt, wrong base, wrong size)."""


@dataclass(frozen=True)
class TensorMeta:
    name: str
    dtype: str  # torch's name without "torch.", e.g. "bfloat16"
    shape: tuple[int, ...]
    checksum: str  # xxh3-128 of the raw bytes, hex

    @property
    def itemsize(self) -> int:
        return torch.empty((), dtype=dtype_from_name(self.dtype, DeltaDecodeError)).element_size()

    @property
    def nbytes(self) -> int:
        return self.itemsize * int(np.prod(self.shape, dtype=np.int64))


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def tensor_bytes(tensor: torch.Tensor) -> np.ndarray:
    """The tensor's raw bytes as a uint8 array (a view where the tensor is contiguous on CPU)."""
    flat = tensor.detach().cpu().contiguous().reshape(-1)
    return flat.view(torch.uint8).numpy()


def tensor_checksum(raw: np.ndarray) -> str:
    return xxhash.xxh3_128_hexdigest(memoryview(raw))


def meta_of(name: str, tensor: torch.Tensor) -> TensorMeta:
    return TensorMeta(name, dtype_name(tensor.dtype), tuple(tensor.shape), tensor_checksum(tensor_bytes(tensor)))


def state_checksum(metas: Iterable[TensorMeta]) -> str:
    """One checksum of a whole state dict: names, dtypes, shapes and every tensor's checksum."""
    digest = xxhash.xxh3_128()
    for meta in sorted(metas, key=lambda m: m.name):
        digest.update(f"{meta.name}\0{meta.dtype}\0{','.join(map(str, meta.shape))}\0{meta.checksum}\n".encode())
    return digest.hexdigest()


def state_metas(state: Mapping[str, torch.Tensor]) -> dict[str, TensorMeta]:
    return {name: meta_of(name, tensor) for name, tensor in state.items()}


def encode(raw: np.ndarray, itemsize: int, base: np.ndarray | None, level: int = ZSTD_LEVEL) -> tuple[str, bytes]:
    """(encoding, payload) of one tensor's bytes, against ``base`` (same length) where given."""
    if base is not None:
        if base.shape != raw.shape:
            raise ValueError(f"base has {base.size} bytes, tensor {raw.size}")
        if np.array_equal(raw, base):
            return "same", b""
        data = np.bitwise_xor(raw, base)
        encoding = "xor"
    else:
        data, encoding = raw, "raw"
    return encoding, zstandard.ZstdCompressor(level=level).compress(_shuffle(data, itemsize).tobytes())


def decode(encoding: str, payload: bytes, meta: TensorMeta, base: np.ndarray | None) -> torch.Tensor:
    """The tensor ``meta`` describes, rebuilt from its payload (and ``base`` for xor/same);
    raises DeltaDecodeError unless its bytes match ``meta.checksum``."""
    nbytes = meta.nbytes
    if encoding in ("xor", "same") and (base is None or base.size != nbytes):
        raise DeltaDecodeError(f"{meta.name}: a {encoding} payload needs the base tensor of {nbytes} bytes")
    if encoding == "same":
        raw = base.copy()
    elif encoding in ("raw", "xor"):
        try:
            data = zstandard.ZstdDecompressor().decompress(payload, max_output_size=nbytes)
        except zstandard.ZstdError as exc:
            raise DeltaDecodeError(f"{meta.name}: corrupt payload ({exc})") from exc
        if len(data) != nbytes:
            raise DeltaDecodeError(f"{meta.name}: payload holds {len(data)} bytes, the tensor {nbytes}")
        raw = _unshuffle(np.frombuffer(data, dtype=np.uint8), meta.itemsize)
        if encoding == "xor":
            np.bitwise_xor(raw, base, out=raw)
    else:
        raise DeltaDecodeError(f"{meta.name}: unknown encoding {encoding!r}; expected one of {list(ENCODINGS)}")
    if tensor_checksum(raw) != meta.checksum:
        raise DeltaDecodeError(f"{meta.name}: checksum mismatch after reconstruction ({encoding})")
    return torch.from_numpy(raw).view(dtype_from_name(meta.dtype, DeltaDecodeError)).reshape(meta.shape)


def _shuffle(data: np.ndarray, itemsize: int) -> np.ndarray:
    """Byte k of every element together: [a0 a1 b0 b1] -> [a0 b0 a1 b1]."""
    if itemsize == 1:
        return data
    return np.ascontiguousarray(data.reshape(-1, itemsize).T).reshape(-1)


def _unshuffle(data: np.ndarray, itemsize: int) -> np.ndarray:
    if itemsize == 1:
        return data.copy()
    if data.size % itemsize:
        raise DeltaDecodeError(f"{data.size} bytes are not whole elements of {itemsize} bytes")
    return np.ascontiguousarray(data.reshape(itemsize, -1).T).reshape(-1)
