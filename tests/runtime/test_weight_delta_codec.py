"""slime_async/weights/delta/codec.py: XOR + zstd payloads rebuild tensors bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from slime_async.weights.delta import codec

# Bit patterns that float arithmetic would not keep: two NaN payloads, ±inf, −0, a denormal.
BF16_SPECIAL = [0x7FC0, 0x7FC1, 0xFFFF, 0x7F80, 0xFF80, 0x8000, 0x0001]
FP32_SPECIAL = [0x7FC00000, 0x7FC00001, 0xFFFFFFFF, 0x7F800000, 0xFF800000, 0x80000000, 0x00000001]


def _with_specials(dtype: torch.dtype, shape: tuple[int, ...], seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    tensor = (torch.randn(shape, generator=generator) * 0.02).to(dtype)
    signed = torch.int16 if dtype == torch.bfloat16 else torch.int32
    bits = tensor.reshape(-1).view(signed).numpy().view(np.uint16 if dtype == torch.bfloat16 else np.uint32)
    for i, pattern in enumerate(BF16_SPECIAL if dtype == torch.bfloat16 else FP32_SPECIAL):
        bits[i * 3] = pattern  # writes through the shared memory into the tensor
    return tensor


def _bits(tensor: torch.Tensor) -> bytes:
    return codec.tensor_bytes(tensor).tobytes()


def _roundtrip(target: torch.Tensor, base: torch.Tensor | None) -> tuple[str, torch.Tensor]:
    meta = codec.meta_of("w", target)
    base_raw = codec.tensor_bytes(base) if base is not None else None
    encoding, payload = codec.encode(codec.tensor_bytes(target), meta.itemsize, base_raw)
    return encoding, codec.decode(encoding, payload, meta, base_raw)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_delta_and_full_rebuild_every_bit_including_nan_inf_and_negative_zero(dtype: torch.dtype) -> None:
    base = _with_specials(dtype, (37, 11), seed=0)
    target = base.clone()
    target.view(-1)[200:260] += 0.01  # a step moved some weights
    target.reshape(-1).view(torch.uint8)[-1] ^= 0x80  # and flipped a sign bit (−x / −0)
    for against in (base, None):
        encoding, rebuilt = _roundtrip(target, against)
        assert encoding == ("xor" if against is not None else "raw")
        assert rebuilt.dtype == dtype and rebuilt.shape == target.shape
        assert _bits(rebuilt) == _bits(target)
    assert any(torch.isnan(target.reshape(-1)[:24]))  # the specials are really in there


def test_an_unchanged_tensor_costs_no_payload() -> None:
    base = _with_specials(torch.bfloat16, (64,), seed=1)
    encoding, rebuilt = _roundtrip(base.clone(), base)
    assert encoding == "same"
    assert _bits(rebuilt) == _bits(base)


def test_a_small_step_compresses_far_below_a_full_transfer() -> None:
    master = torch.randn(256, 256, generator=torch.Generator().manual_seed(2)) * 0.02
    base = master.to(torch.bfloat16)
    target = (master + 1e-6 * torch.sign(torch.randn(256, 256))).to(torch.bfloat16)  # one Adam step at lr 1e-6
    meta = codec.meta_of("w", target)
    _, delta = codec.encode(codec.tensor_bytes(target), meta.itemsize, codec.tensor_bytes(base))
    _, full = codec.encode(codec.tensor_bytes(target), meta.itemsize, None)
    assert len(delta) < len(full) / 10


def test_a_delta_against_another_base_fails_its_checksum() -> None:
    base, other = _with_specials(torch.float32, (50,), 3), _with_specials(torch.float32, (50,), 4)
    target = base + 1
    meta = codec.meta_of("w", target)
    encoding, payload = codec.encode(codec.tensor_bytes(target), meta.itemsize, codec.tensor_bytes(base))
    with pytest.raises(codec.DeltaDecodeError, match="w: checksum mismatch"):
        codec.decode(encoding, payload, meta, codec.tensor_bytes(other))


def test_a_corrupt_payload_is_refused() -> None:
    target = _with_specials(torch.bfloat16, (40,), 5)
    meta = codec.meta_of("w", target)
    _, payload = codec.encode(codec.tensor_bytes(target), meta.itemsize, None)
    with pytest.raises(codec.DeltaDecodeError, match="w: corrupt payload"):
        codec.decode("raw", payload[:-3], meta, None)


def test_the_state_checksum_covers_names_shapes_and_every_bit() -> None:
    state = {"a": torch.zeros(4), "b": torch.ones(2, 2)}
    reference = codec.state_checksum(codec.state_metas(state).values())
    assert codec.state_checksum(codec.state_metas(dict(reversed(state.items()))).values()) == reference
    negative_zero = {"a": torch.tensor([0.0, 0.0, 0.0, -0.0]), "b": torch.ones(2, 2)}
    renamed = {"a": torch.zeros(4), "c": torch.ones(2, 2)}
    reshaped = {"a": torch.zeros(4), "b": torch.ones(4)}
    for other in (negative_zero, renamed, reshaped):
        assert codec.state_checksum(codec.state_metas(other).values()) != reference


def test_shuffle_puts_byte_planes_together() -> None:
    data = np.array([0xA0, 0xA1, 0xB0, 0xB1, 0xC0, 0xC1], dtype=np.uint8)
    shuffled = codec._shuffle(data, 2)
    assert shuffled.tolist() == [0xA0, 0xB0, 0xC0, 0xA1, 0xB1, 0xC1]
    assert codec._unshuffle(shuffled, 2).tolist() == data.tolist()
