"""A bf16 run checkpoint of a tied-embedding model saves and resumes (Megatron's Float16 optimizer).

The first GPU run died at its first save: the local spec's RMSNorm weights stayed fp32 in a bf16
model, so the optimizer's sharded_state_dict mapped its state to the wrong model tensors
("Param id 121 does not match any model sharded param"; on the tiny model, a shape mismatch).
"""

from __future__ import annotations

import json

import pytest

from conftest import run_torchrun

pytestmark = pytest.mark.slow  # one torchrun rank, two trainer builds: ~40 s on 2 cores


def test_a_bf16_tied_embedding_run_resumes_to_the_same_weights(tiny_hf_dirs, tmp_path):
    out = tmp_path / "report.json"
    run_torchrun("bf16_checkpoint.py", 1, f"--hf-dir={tiny_hf_dirs['qwen2']}", f"--out={out}", timeout=480)
    report = json.loads(out.read_text())
    assert report["dtypes"] == ["torch.bfloat16"], "a parameter is not in the run's precision"
    assert report["resumed_step"] == 1
    # The step after the resume lands exactly where the uninterrupted run's did: fp32 main
    # weights and Adam moments came back (from the bf16 weights alone it would differ).
    assert report["max_diff"] == 0.0
