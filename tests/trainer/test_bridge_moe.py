"""HF <-> Megatron bridge for MoE (Qwen3-MoE, GLM-4.5): logit parity with transformers at TP1·EP1,
EP2 and TP2·EP2 (gloo ranks), and a bit-exact HF -> Megatron -> HF round trip at TP2·EP2."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from conftest import MOE_TINY_CONFIGS, run_torchrun

ARCHS = sorted(MOE_TINY_CONFIGS)
# (ranks, TP, EP): expert parallelism takes the data-parallel ranks.
LAYOUTS = {"tp1ep1": (1, 1, 1), "ep2": (2, 1, 2), "tp2ep2": (4, 2, 2)}


@pytest.fixture(scope="module")
def moe_layout(tiny_moe_dirs, tmp_path_factory) -> Callable[[str], dict]:
    """layout -> its results, from one torchrun launch per layout: the parity of every tiny MoE
    model, and (TP2·EP2) each model exported back to HF."""
    runs: dict[str, dict] = {}

    def run(layout: str) -> dict:
        if layout not in runs:
            nproc, tp, ep = LAYOUTS[layout]
            root = tmp_path_factory.mktemp(f"moe_{layout}")
            export = [f"--export-dir={root / 'export'}"] if layout == "tp2ep2" else []
            models = [f"--model={arch}={tiny_moe_dirs[arch]}" for arch in ARCHS]
            run_torchrun("hf_logit_parity.py", nproc, *models, f"--tp={tp}", f"--ep={ep}", "--attention=sdpa",
                         f"--out={root / 'parity.json'}", *export, timeout=400)
            runs[layout] = {"parity": json.loads((root / "parity.json").read_text()), "export": root / "export"}
        return runs[layout]

    return run


@pytest.mark.timeout(420)
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_moe_logits_equal_transformers_within_1e_4(moe_layout, layout, arch):
    result = moe_layout(layout)["parity"][f"{arch}/sdpa"]
    assert result["shape"] == result["expected_shape"]
    assert result["logit_std"] > 0.5  # random weights drawn large: a mapping error shows
    assert result["max_abs_diff"] < 1e-4, result


def _load_dir(path: Path) -> dict[str, torch.Tensor]:
    tensors: dict[str, torch.Tensor] = {}
    for f in sorted(path.glob("*.safetensors")):
        tensors.update(load_file(f))
    return tensors


@pytest.mark.timeout(420)
@pytest.mark.parametrize("arch", ARCHS)
def test_moe_export_at_tp2_ep2_reproduces_every_source_tensor_bit_exactly(moe_layout, tiny_moe_dirs, arch):
    source, result = _load_dir(tiny_moe_dirs[arch]), _load_dir(moe_layout("tp2ep2")["export"] / arch)
    assert sorted(result) == sorted(source)
    for name, tensor in source.items():
        assert result[name].dtype == tensor.dtype and torch.equal(result[name], tensor), name
