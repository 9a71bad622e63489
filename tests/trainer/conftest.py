"""Tiny random HF checkpoints (Llama, Qwen2, Qwen3, Qwen3-MoE, GLM-4.5) and a torchrun launcher for trainer tests."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

REPO_ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = Path(__file__).resolve().parent / "scripts"

# Each config covers a different corner: GQA everywhere; llama with a non-default RoPE theta
# and untied head; qwen2 with qkv bias, tied embeddings and a vocab that TP=2 must pad;
# qwen3 with qk-norm and head_dim != hidden / heads.
TINY_CONFIGS: dict[str, dict] = {
    "llama": dict(
        model_type="llama", vocab_size=128, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 50000.0},
    ),
    "qwen2": dict(model_type="qwen2", vocab_size=127, tie_word_embeddings=True),
    "qwen3": dict(model_type="qwen3", vocab_size=128, tie_word_embeddings=False, head_dim=32),
}


# Tiny MoE models (8 experts, hidden 64, 3 layers), each mixing dense and sparse layers and
# covering one corner of the router: Qwen3-MoE with renormalised top-k (mlp_only_layers) and
# without (decoder_sparse_step); GLM-4.5 with sigmoid scores + a random expert-score bias,
# group-limited top-k, shared experts, a routed scaling factor, partial RoPE, qkv bias and qk-norm.
MOE_TINY_CONFIGS: dict[str, dict] = {
    "qwen3_moe": dict(model_type="qwen3_moe", vocab_size=128, head_dim=32, num_experts=8, num_experts_per_tok=2,
                      moe_intermediate_size=32, norm_topk_prob=True, mlp_only_layers=[1]),
    "qwen3_moe_unnormed": dict(model_type="qwen3_moe", vocab_size=128, num_experts=8, num_experts_per_tok=3,
                               moe_intermediate_size=32, norm_topk_prob=False, decoder_sparse_step=2),
    "glm4_moe": dict(model_type="glm4_moe", vocab_size=127, head_dim=32, n_routed_experts=8, num_experts_per_tok=4,
                     moe_intermediate_size=32, n_shared_experts=1, first_k_dense_replace=1, n_group=4, topk_group=2,
                     routed_scaling_factor=1.5, norm_topk_prob=True, partial_rotary_factor=0.5, attention_bias=True,
                     use_qk_norm=True, tie_word_embeddings=False),
}


def _make_tokenizer(vocab_size: int):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<eos>": 1, **{f"w{i}": i for i in range(2, vocab_size)}}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", eos_token="<eos>")


def build_tiny_hf_model(out_dir: Path, arch: str, seed: int = 0) -> Path:
    """Save a tiny random HF model of ``arch`` (+ tokenizer) to ``out_dir``.

    Weights are re-drawn with a large scale (norm weights around 1, biases non-zero) so that
    logits are far from uniform and every tensor's mapping shows in a parity check.
    """
    from transformers import AutoConfig, AutoModelForCausalLM

    spec = dict({**TINY_CONFIGS, **MOE_TINY_CONFIGS}[arch])
    model_type = spec.pop("model_type")
    config = AutoConfig.for_model(
        model_type,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=3 if arch in MOE_TINY_CONFIGS else 2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        rms_norm_eps=1e-6,
        bos_token_id=1,
        eos_token_id=1,
        pad_token_id=0,
        **spec,
    )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.copy_(1.0 + 0.1 * torch.randn_like(param))
            else:
                param.normal_(0.0, 0.2)
        for name, buffer in model.named_buffers():
            if name.endswith("e_score_correction_bias"):  # large enough to change which experts win
                buffer.normal_(0.0, 0.3)
    model.save_pretrained(out_dir)
    _make_tokenizer(config.vocab_size).save_pretrained(out_dir)
    return out_dir


@pytest.fixture(scope="session")
def tiny_moe_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """arch -> directory of a saved tiny MoE checkpoint, for every arch in MOE_TINY_CONFIGS."""
    root = tmp_path_factory.mktemp("tiny_moe")
    return {arch: build_tiny_hf_model(root / arch, arch) for arch in MOE_TINY_CONFIGS}


@pytest.fixture(scope="session")
def tiny_hf_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """arch -> directory of a saved tiny HF checkpoint, for every arch in TINY_CONFIGS."""
    root = tmp_path_factory.mktemp("tiny_hf")
    return {arch: build_tiny_hf_model(root / arch, arch) for arch in TINY_CONFIGS}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def single_rank_megatron():
    """A one-process gloo world with Megatron's parallel state, torn down after the module."""
    import torch.distributed as dist

    from actors.megatron.cpu_compat import apply_cpu_compat
    from actors.megatron.parallel import destroy_model_parallel, init_model_parallel

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1)
    init_model_parallel(tensor_parallel_size=1)
    apply_cpu_compat()
    yield
    destroy_model_parallel()


def run_torchrun(script: str, nproc: int, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run tests/trainer/scripts/<script> under a real ``torchrun`` with ``nproc`` ranks (gloo)."""
    env = {
        **os.environ,
        "PYTHONPATH": f"{REPO_ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
        "OMP_NUM_THREADS": "1",
        "PYTHONWARNINGS": "ignore",
    }
    cmd = [
        sys.executable, "-m", "torch.distributed.run",
        "--nproc-per-node", str(nproc), "--master-addr", "127.0.0.1",
        "--master-port", str(_free_port()),
        str(SCRIPTS / script), *args,
    ]
    proc = subprocess.run(cmd, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise AssertionError(
            f"torchrun {script} {' '.join(args)} failed with exit code {proc.returncode}\n"
            f"--- stdout ---\n{proc.stdout[-4000:]}\n--- stderr ---\n{proc.stderr[-8000:]}"
        )
    return proc


@pytest.fixture
def torchrun() -> Callable[..., subprocess.CompletedProcess]:
    return run_torchrun


@pytest.fixture(scope="session")
def tp2_smoke(tiny_hf_dirs, tmp_path_factory) -> dict:
    """One 2-rank torchrun of train_step_smoke.py: 3 Adam steps at TP=1 (two DP ranks) and at TP=2
    on the qwen3 model, then the fused-kernel checks at TP=2 on qwen2 (tied, padded vocab)."""
    import json

    out = tmp_path_factory.mktemp("tp2_smoke") / "smoke.json"
    run_torchrun(
        "train_step_smoke.py", 2, f"--hf-dir={tiny_hf_dirs['qwen3']}", "--tp=1", "--tp=2", "--steps=3",
        f"--out={out}", f"--kernel-checks-hf-dir={tiny_hf_dirs['qwen2']}", timeout=280,
    )
    return json.loads(out.read_text())
