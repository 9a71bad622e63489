"""HF <-> Megatron bridge: bit-exact HF export at TP=2. (Logit parity with transformers of the tiny
archs, TP=1 and 2: test_bridge_real_configs.py, in the one torchrun launch per TP size it makes.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from conftest import run_torchrun


def _load_dir(path: Path) -> dict[str, torch.Tensor]:
    tensors: dict[str, torch.Tensor] = {}
    for f in sorted(path.glob("*.safetensors")):
        tensors.update(load_file(f))
    return tensors


@pytest.fixture(scope="module")
def exported(tiny_hf_dirs, tmp_path_factory) -> dict[str, Path]:
    """arch -> HF checkpoint exported by save_hf_checkpoint after loading at TP=2 (one launch for both)."""
    out = {arch: tmp_path_factory.mktemp(f"export_{arch}") for arch in ("qwen2", "qwen3")}
    # qwen2: tied + padded vocab + qkv bias; qwen3: untied + qk-norm
    pairs = [flag for arch, path in out.items() for flag in (f"--hf-dir={tiny_hf_dirs[arch]}", f"--out-dir={path}")]
    run_torchrun("hf_export.py", 2, *pairs, "--bucket-bytes=20000", timeout=300)
    return out


@pytest.mark.timeout(330)
@pytest.mark.parametrize("arch", ["qwen2", "qwen3"])
def test_hf_export_at_tp2_reproduces_every_source_tensor_bit_exactly(exported, tiny_hf_dirs, arch):
    source, result = _load_dir(tiny_hf_dirs[arch]), _load_dir(exported[arch])
    assert sorted(result) == sorted(source)
    for name, tensor in source.items():
        assert torch.equal(result[name], tensor), name


@pytest.mark.timeout(330)
def test_weight_buckets_stay_within_bucket_bytes_unless_one_tensor_is_larger(exported):
    buckets = json.loads((exported["qwen3"] / "buckets.json").read_text())
    assert len(buckets) > 1
    for bucket in buckets:
        sizes = [nbytes for _, nbytes in bucket]
        assert sum(sizes) <= 20000 or len(sizes) == 1, bucket


@pytest.mark.timeout(330)
def test_exported_checkpoint_loads_in_transformers(exported, tiny_hf_dirs):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(exported["qwen2"])
    assert model.config.tie_word_embeddings
    assert model.config.vocab_size == 127


@pytest.mark.timeout(330)
@pytest.mark.parametrize("filename", ["config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"])
def test_exported_checkpoint_carries_the_source_config_and_tokenizer_files(exported, tiny_hf_dirs, filename):
    assert (exported["qwen2"] / filename).read_bytes() == (tiny_hf_dirs["qwen2"] / filename).read_bytes()
