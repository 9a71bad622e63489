"""`slime-async convert`: HF -> Megatron dist checkpoint -> HF is bit-exact, across TP sizes."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from actors.trainer.convert import main


def _tensors(path: Path) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for f in sorted(path.glob("*.safetensors")):
        out.update(load_file(f))
    return out


@pytest.mark.timeout(400)
@pytest.mark.parametrize(
    "arch, save_tp, load_tp",
    [("qwen2", 2, 1), ("qwen3", 1, 2)],  # qwen2: tied, qkv bias, vocab padded only at TP=2
    ids=["qwen2-tp2-to-tp1", "qwen3-tp1-to-tp2"],
)
def test_hf_to_megatron_to_hf_round_trips_every_tensor_bit_exactly(tiny_hf_dirs, tmp_path, arch, save_tp, load_tp):
    megatron_dir, hf_out = tmp_path / "megatron", tmp_path / "hf"
    main(["hf-to-megatron", "--hf-checkpoint", str(tiny_hf_dirs[arch]), "--save", str(megatron_dir),
          "--tensor-model-parallel-size", str(save_tp)])
    main(["megatron-to-hf", "--load", str(megatron_dir), "--save", str(hf_out),
          "--tensor-model-parallel-size", str(load_tp)])
    source, result = _tensors(tiny_hf_dirs[arch]), _tensors(hf_out)
    assert sorted(result) == sorted(source)
    for name, tensor in source.items():
        assert result[name].dtype == tensor.dtype and torch.equal(result[name], tensor), name
    assert (hf_out / "tokenizer.json").read_bytes() == (tiny_hf_dirs[arch] / "tokenizer.json").read_bytes()


def test_megatron_to_hf_rejects_a_directory_not_written_by_hf_to_megatron(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a checkpoint written by `convert hf-to-megatron`"):
        main(["megatron-to-hf", "--load", str(tmp_path), "--save", str(tmp_path / "out")])


def test_hf_to_megatron_rejects_a_directory_without_config_json(tmp_path):
    with pytest.raises(FileNotFoundError, match="has no config.json"):
        main(["hf-to-megatron", "--hf-checkpoint", str(tmp_path), "--save", str(tmp_path / "out")])
