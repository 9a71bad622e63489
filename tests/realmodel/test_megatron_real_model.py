"""SmolLM2-135M-Instruct through the HF <-> Megatron bridge: logit parity and a bit-exact export.

The model has 9 attention heads in 3 query groups, which Megatron cannot split over 2
tensor-parallel ranks; TP = 3 is the smallest TP > 1 it allows, so that is the sharded case
tested (one torchrun launch of 3 ranks does TP = 3, the export, and TP = 1).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from actors.megatron.bridge import transformer_config_from_hf
from slime_async.net import free_port

pytestmark = [pytest.mark.realmodel, pytest.mark.timeout(600)]

REPO_ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).resolve().parent / "scripts" / "megatron_roundtrip.py"
SHARDED_TP = 3
LOGIT_TOLERANCE = 1e-3

# A whole chat turn, answer included, so the logits compared cover the template's special
# tokens, the question and the assistant's reply.
CONVERSATION = [
    {"role": "user", "content": "What is 17 + 25? Answer with the number."},
    {"role": "assistant", "content": "17 + 25 = 42."},
]


@pytest.fixture(scope="module")
def tokens(chat_ids) -> list[int]:
    return chat_ids(CONVERSATION, False)


@pytest.fixture(scope="module")
def megatron_run(smollm2_dir: Path, tokens: list[int], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Output directory of one torchrun launch (logits_tp1.pt, logits_tp3.pt, export_tp3/)."""
    out = tmp_path_factory.mktemp("megatron-real")
    (out / "tokens.json").write_text(json.dumps(tokens))
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(SHARDED_TP),
        "--master-addr", "127.0.0.1", "--master-port", str(free_port()), str(SCRIPT),
        f"--hf-dir={smollm2_dir}", f"--tokens={out / 'tokens.json'}", f"--out-dir={out}",
    ]
    done = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=540)
    if done.returncode != 0:
        raise AssertionError(
            f"torchrun {SCRIPT.name} failed with exit code {done.returncode}\n"
            f"--- stdout ---\n{done.stdout[-4000:]}\n--- stderr ---\n{done.stderr[-8000:]}"
        )
    yield out
    shutil.rmtree(out / f"export_tp{SHARDED_TP}")  # 0.5 GB that pytest would keep for three sessions


@pytest.fixture(scope="module")
def hf_logits(hf_model: torch.nn.Module, tokens: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf_model(torch.tensor([tokens])).logits


@pytest.mark.parametrize("tp", [1, SHARDED_TP], ids=lambda tp: f"tp{tp}")
def test_megatron_logits_match_transformers_within_1e_3(megatron_run, hf_logits, tp):
    logits = torch.load(megatron_run / f"logits_tp{tp}.pt")
    assert logits.shape == hf_logits.shape
    max_diff = (logits - hf_logits).abs().max().item()
    report = f"TP={tp}: max |Δ logit| = {max_diff:.3e} over {tuple(logits.shape)} (logit std {hf_logits.std():.2f})"
    print(report)
    assert max_diff <= LOGIT_TOLERANCE, report
    assert torch.equal(logits.argmax(-1), hf_logits.argmax(-1)), report


def test_tp2_is_refused_because_9_heads_do_not_split_over_2_ranks(smollm2_dir):
    with pytest.raises(ValueError, match=r"num_attention_heads \(9\) must be a multiple of tensor_model_parallel_size \(2\)"):
        transformer_config_from_hf(smollm2_dir, tensor_model_parallel_size=2)


def _tensors(directory: Path) -> dict[str, torch.Tensor]:
    tensors: dict[str, torch.Tensor] = {}
    for file in sorted(directory.glob("*.safetensors")):
        tensors.update(load_file(file))
    return tensors


def test_hf_export_after_loading_at_tp3_reproduces_every_tensor_bit_exactly(megatron_run, smollm2_dir):
    source, exported = _tensors(smollm2_dir), _tensors(megatron_run / f"export_tp{SHARDED_TP}")
    # Tied embeddings: the source has no lm_head.weight and the export must not add one.
    assert "lm_head.weight" not in source
    assert sorted(exported) == sorted(source)
    differing = [name for name, tensor in source.items()
                 if exported[name].dtype != tensor.dtype or not torch.equal(exported[name], tensor)]
    assert not differing, f"{len(differing)} of {len(source)} tensors differ, e.g. {differing[:5]}"


@pytest.mark.parametrize("filename", ["config.json", "generation_config.json", "tokenizer.json", "chat_template.jinja"])
def test_hf_export_carries_the_config_tokenizer_and_chat_template(megatron_run, smollm2_dir, filename):
    exported = megatron_run / f"export_tp{SHARDED_TP}" / filename
    assert exported.read_bytes() == (smollm2_dir / filename).read_bytes()
