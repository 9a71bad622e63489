"""SGLang's flattened weight bucket (slime_async.weights.flat_bucket) and the engine identity of a weight group."""

import pytest
import torch

from actors.weight_sync.distributed import engine_identity
from slime_async.weights import flat_bucket


def test_a_bucket_is_its_tensors_bytes_back_to_back_with_no_padding():
    # 1.0 in float32 is 0x3f800000, in bfloat16 0x3f80, 2.0 in bfloat16 0x4000; little-endian.
    flat = flat_bucket.flatten([torch.tensor([1.0]), torch.tensor([1.0, 2.0], dtype=torch.bfloat16)])
    assert flat.dtype == torch.uint8
    assert flat.tolist() == [0x00, 0x00, 0x80, 0x3F, 0x80, 0x3F, 0x00, 0x40]


def test_unflatten_gives_back_each_tensor_of_a_mixed_dtype_bucket_even_misaligned():
    # The float32 tensor starts at byte 2, after one bfloat16: not a float32 boundary.
    tensors = [torch.tensor([3.5], dtype=torch.bfloat16), torch.arange(6, dtype=torch.float32).reshape(2, 3)]
    dtypes, shapes = [t.dtype for t in tensors], [list(t.shape) for t in tensors]
    flat = flat_bucket.flatten(tensors)
    assert flat_bucket.nbytes(dtypes, shapes) == 2 + 24 == flat.numel()
    out = flat_bucket.unflatten(flat, dtypes, shapes)
    assert [o.dtype for o in out] == dtypes and all(torch.equal(o, t) for o, t in zip(out, tensors))


def test_a_flat_buffer_of_the_wrong_size_is_refused_with_both_sizes():
    with pytest.raises(ValueError, match="holds 3 bytes, its dtypes and shapes need 4"):
        flat_bucket.unflatten(torch.zeros(3, dtype=torch.uint8), [torch.float32], [[1]])


def test_an_engine_is_known_by_its_instance_id_or_sglang_startup_timings():
    assert engine_identity({"instance_id": "ab12", "startup_time": {"load_weight": 1.5}}) == "ab12"
    first = engine_identity({"startup_time": {"load_weight": 3.25, "tokenizer_e2e": 20.5}})
    assert first == engine_identity({"startup_time": {"tokenizer_e2e": 20.5, "load_weight": 3.25}})
    assert first != engine_identity({"startup_time": {"load_weight": 3.26, "tokenizer_e2e": 20.5}})
    assert engine_identity({"tp_size": 1}) is None
