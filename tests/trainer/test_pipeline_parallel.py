"""Pipeline parallelism: TP1·PP2 against TP1·PP1 (DP2) on one batch and the tiny qwen2 model
(tied embeddings, like SmolLM2). One torchrun launch of two ranks runs both layouts
(scripts/pipeline_parity.py); the tests assert on its report and exports.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from safetensors.torch import load_file

from conftest import run_torchrun

TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def parity(tiny_hf_dirs, tmp_path_factory) -> dict:
    work = tmp_path_factory.mktemp("pipeline")
    out = work / "report.json"
    run_torchrun("pipeline_parity.py", 2, "--hf-dir", str(tiny_hf_dirs["qwen2"]), "--out", str(out), timeout=240)
    report = json.loads(out.read_text())
    report["work"] = work
    return report


def _max_diff(a: list[list[float]], b: list[list[float]]) -> float:
    assert [len(r) for r in a] == [len(r) for r in b]
    return max(abs(x - y) for ra, rb in zip(a, b) for x, y in zip(ra, rb))


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=TOLERANCE, abs_tol=TOLERANCE)


@pytest.mark.slow  # shares one two-rank torchrun launch (~16 s of CPU)
def test_the_layout_is_two_stages_of_one_replica(parity):
    assert parity["pp2"]["info"] == [[0, 2, 1], [1, 2, 1]]  # (pp_rank, pp_size, dp_size) per rank


@pytest.mark.slow
def test_logprobs_and_reference_logprobs_match_pp1(parity):
    pp1, pp2 = parity["pp1"], parity["pp2"]
    assert _max_diff(pp1["logprobs0"], pp2["logprobs0"]) < TOLERANCE
    assert _max_diff(pp1["ref"], pp2["ref"]) < TOLERANCE


@pytest.mark.slow
def test_one_step_gives_the_same_loss_and_grad_norm_and_then_the_same_logprobs(parity):
    pp1, pp2 = parity["pp1"]["step1"], parity["pp2"]["step1"]
    assert pp2["update_successful"] == 1.0 and pp2["num_micro_batches"] > 1  # micro-batches of different shapes
    for key in ("loss", "pg_loss", "entropy", "grad_norm", "lr"):
        assert _close(pp1[key], pp2[key]), (key, pp1[key], pp2[key])
    assert _max_diff(parity["pp1"]["logprobs1"], parity["pp2"]["logprobs1"]) < TOLERANCE


@pytest.mark.slow
def test_the_export_of_the_loaded_weights_is_the_hf_checkpoint_bit_for_bit(parity, tiny_hf_dirs):
    source = load_file(str(tiny_hf_dirs["qwen2"] / "model.safetensors"))
    exported = load_file(str(parity["work"] / "export-pp2-initial" / "model.safetensors"))
    assert sorted(exported) == sorted(source)
    assert all(exported[name].equal(source[name]) for name in source)


@pytest.mark.slow
def test_the_export_after_one_step_equals_pp1s(parity):
    pp1 = load_file(str(parity["work"] / "export-pp1" / "model.safetensors"))
    pp2 = load_file(str(parity["work"] / "export-pp2" / "model.safetensors"))
    assert list(pp2) == list(pp1)  # same tensors in the same (HF) order
    assert max(float((pp1[n] - pp2[n]).abs().max()) for n in pp1) < TOLERANCE
    assert parity["pp2"]["metadata"] == parity["pp1"]["metadata"]  # the weight broadcast's buckets


@pytest.mark.slow
def test_checkpoints_resume_across_layouts_with_model_optimizer_and_schedule(parity):
    """Step 2 from a checkpoint of step 1 saved at the other layout equals the uninterrupted step 2,
    and so do the logprobs after it (the update reads Adam's moments and the warmup's LR)."""
    pp1, pp2 = parity["pp1"], parity["pp2"]
    assert pp2["loaded_step_from_pp1"] == 1 and pp1["loaded_step_from_pp2"] == 1
    for resumed in (pp2["step2_from_pp1"], pp1["step2_from_pp2"]):
        for key in ("loss", "grad_norm", "lr", "step"):
            assert _close(pp1["step2"][key], resumed[key]), (key, pp1["step2"][key], resumed[key])
    assert _max_diff(pp1["logprobs2"], pp2["logprobs2_from_pp1"]) < TOLERANCE
    assert _max_diff(pp1["logprobs2"], pp1["logprobs2_from_pp2"]) < TOLERANCE
    assert _max_diff(pp1["logprobs2"], pp1["logprobs1"]) > 1e-3  # step 2 moved them: the check can fail


@pytest.mark.slow
def test_the_critic_at_pp2_gives_pp1s_values_loss_and_update(parity):
    pp1, pp2 = parity["critic"]["pp1"], parity["critic"]["pp2"]
    assert _max_diff(pp1["values0"], pp2["values0"]) < TOLERANCE
    for key in ("value_loss", "grad_norm", "update_successful"):
        assert _close(pp1["step"][key], pp2["step"][key]), (key, pp1["step"][key], pp2["step"][key])
    assert _max_diff(pp1["values1"], pp2["values1"]) < TOLERANCE
    assert _max_diff(pp2["values1"], pp2["values0"]) > 1e-3  # the step moved the values


@pytest.mark.parametrize("megatron, message", [
    ({"pipeline_model_parallel_size": 3},
     r"--pipeline-model-parallel-size 3 does not divide the 2 layers of .*; set --num-layers-in-first"),
    ({"pipeline_model_parallel_size": 2, "num_layers_in_first_pipeline_stage": 3},
     r"--num-layers-in-first-pipeline-stage 3 leaves -1 of the 2 layers .* not an even split"),
    ({"pipeline_model_parallel_size": 2, "virtual_pipeline_model_parallel_size": 2},
     r"--virtual-pipeline-model-parallel-size is not supported with --pipeline-model-parallel-size 2"),
])
def test_a_layout_the_stages_could_not_build_fails_at_validation_naming_the_flag(tiny_hf_dirs, megatron, message):
    from actors.megatron.config import TrainerConfig

    with pytest.raises(ValueError, match=message):
        TrainerConfig(hf_checkpoint=str(tiny_hf_dirs["qwen2"]), megatron=megatron).validate()
    TrainerConfig(hf_checkpoint=str(tiny_hf_dirs["qwen2"]), megatron={"pipeline_model_parallel_size": 2}).validate()
