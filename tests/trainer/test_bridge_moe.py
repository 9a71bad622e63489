"""HF <-> Megatron bridge for MoE (Qwen3-MoE, GLM-4.5) on gloo ranks: logit parity with transformers
at TP1·EP1, EP2 and TP2·EP2, a bit-exact HF -> Megatron -> HF round trip at TP2·EP2, and the same
logprobs after one optimizer step at TP1·EP1, EP2 and TP2·EP2 (sequence parallel). EP2·ETP2 (experts
cut by their own tensor-parallel group) steps through the trainer in test_trainer_moe_ep.py."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from conftest import MOE_TINY_CONFIGS, run_torchrun

ARCHS = sorted(MOE_TINY_CONFIGS)
# launch -> (ranks, layout flags) of tests/trainer/scripts/moe_train_step.py. Expert parallelism
# takes the data-parallel ranks. Each launch checks parity with transformers, then trains one step;
# TP2·EP2 (under sequence parallelism, which the bridge turns on for MoE at TP > 1) exports the
# model as loaded too. dense_tp2_sp: a dense model (DENSE) under --sequence-parallel, against its
# TP1 step in the tp1ep1 launch (the norms' gradients are summed over TP there too).
LAUNCHES = {
    "tp1ep1": (1, ("--tp=1", "--ep=1")),
    "ep2": (2, ("--tp=1", "--ep=2")),
    "tp2ep2": (4, ("--tp=2", "--ep=2")),
    "dense_tp2_sp": (2, ("--tp=2", "--ep=1", "--sequence-parallel")),
}
DENSE = "qwen3"
PARITY_LAYOUTS = ("tp1ep1", "ep2", "tp2ep2")
TRAIN_LAYOUTS = ("ep2", "tp2ep2")  # each compared with tp1ep1


@pytest.fixture(scope="module")
def moe_run(tiny_moe_dirs, tiny_hf_dirs, tmp_path_factory) -> Callable[[str], dict]:
    """launch name -> its results ("parity", "train", "export" dir), one torchrun launch each."""
    runs: dict[str, dict] = {}

    def run(launch: str) -> dict:
        if launch not in runs:
            nproc, layout = LAUNCHES[launch]
            root = tmp_path_factory.mktemp(f"moe_{launch}")
            moe = [f"--model={arch}={tiny_moe_dirs[arch]}" for arch in ARCHS]
            dense = [f"--model={DENSE}={tiny_hf_dirs[DENSE]}"]
            models = {"tp1ep1": moe + dense, "dense_tp2_sp": dense}.get(launch, moe)
            outputs = [f"--out={root / 'train.json'}", f"--parity-out={root / 'parity.json'}"]
            if launch == "tp2ep2":
                outputs.append(f"--export-dir={root / 'export'}")
            run_torchrun("moe_train_step.py", nproc, *models, *layout, *outputs, timeout=400)
            runs[launch] = {name: json.loads((root / f"{name}.json").read_text())
                            for name in ("parity", "train") if (root / f"{name}.json").exists()}
            runs[launch]["export"] = root / "export"
        return runs[launch]

    return run


@pytest.mark.timeout(420)
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("layout", PARITY_LAYOUTS)
def test_moe_logits_equal_transformers_within_1e_4(moe_run, layout, arch):
    result = moe_run(layout)["parity"][f"{arch}/sdpa"]
    assert result["shape"] == result["expected_shape"]
    assert result["logit_std"] > 0.5  # random weights drawn large: a mapping error shows
    assert result["max_abs_diff"] < 1e-4, result


def _max_diff(a: list[list[float]], b: list[list[float]]) -> float:
    return max(abs(x - y) for row_a, row_b in zip(a, b) for x, y in zip(row_a, row_b))


@pytest.mark.timeout(420)
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("layout", TRAIN_LAYOUTS)
def test_logprobs_after_one_optimizer_step_equal_the_single_rank_ones_within_1e_5(moe_run, layout, arch):
    single, spread = moe_run("tp1ep1")["train"][arch], moe_run(layout)["train"][arch]
    assert single["changed"] and spread["changed"]
    # The step moves the logprobs far more than the tolerance, so equal logprobs mean equal steps.
    assert _max_diff(single["logprobs"], single["initial_logprobs"]) > 1e-2
    assert _max_diff(spread["logprobs"], single["logprobs"]) < 1e-5


@pytest.mark.timeout(420)
def test_a_dense_model_under_sequence_parallelism_steps_as_at_tp1_within_1e_5(moe_run):
    single, spread = moe_run("tp1ep1")["train"][DENSE], moe_run("dense_tp2_sp")["train"][DENSE]
    assert _max_diff(single["logprobs"], single["initial_logprobs"]) > 1e-2
    assert _max_diff(spread["logprobs"], single["logprobs"]) < 1e-5


def _load_dir(path: Path) -> dict[str, torch.Tensor]:
    tensors: dict[str, torch.Tensor] = {}
    for f in sorted(path.glob("*.safetensors")):
        tensors.update(load_file(f))
    return tensors


@pytest.mark.timeout(420)
@pytest.mark.parametrize("arch", ARCHS)
def test_moe_export_at_tp2_ep2_reproduces_every_source_tensor_bit_exactly(moe_run, tiny_moe_dirs, arch):
    source, result = _load_dir(tiny_moe_dirs[arch]), _load_dir(moe_run("tp2ep2")["export"] / arch)
    assert sorted(result) == sorted(source)
    for name, tensor in source.items():
        assert result[name].dtype == tensor.dtype and torch.equal(result[name], tensor), name
