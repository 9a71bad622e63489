"""Random-init models with the real Qwen2.5-0.5B / 1.5B architectures (nothing is downloaded).

The configs are those of the published checkpoints (hidden size, layers, heads, GQA groups,
vocabulary, tied embeddings, RoPE base); only the weights are random. A random-init model's
next-token distribution is almost uniform over 151,936 tokens (logit std ~0.6), which would
make any logprob comparison trivially small, so ``norm_scale`` multiplies the final RMSNorm
weight to give trained-model-like entropies (a few nats); the benchmarks print the entropy
they measured.
"""

from __future__ import annotations

from pathlib import Path

import torch

QWEN25_SHAPES: dict[str, dict] = {
    "qwen2.5-0.5b": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                         num_attention_heads=14, num_key_value_heads=2, tie_word_embeddings=True),
    "qwen2.5-1.5b": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                         num_attention_heads=12, num_key_value_heads=2, tie_word_embeddings=True),
    # Not a Qwen model: the real vocabulary on a 2-layer body, so the GPU benchmarks can be
    # checked end to end on a CPU in seconds.
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True),
}
COMMON = dict(vocab_size=151936, max_position_embeddings=32768, rope_theta=1000000.0, rms_norm_eps=1e-6,
              bos_token_id=151643, eos_token_id=151643, use_sliding_window=False)


def qwen25_config(name: str):
    from transformers import Qwen2Config

    if name not in QWEN25_SHAPES:
        raise SystemExit(f"unknown shape {name!r}; choose from {sorted(QWEN25_SHAPES)}")
    return Qwen2Config(**COMMON, **QWEN25_SHAPES[name])


def write_random_model(out: Path, name: str, dtype: torch.dtype = torch.bfloat16, norm_scale: float = 1.0,
                       seed: int = 0) -> Path:
    """Save a random-init HF model of shape ``name`` to ``out`` (built on GPU when there is one)."""
    from transformers import AutoModelForCausalLM

    config = qwen25_config(name)
    torch.manual_seed(seed)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    with torch.no_grad():
        model.model.norm.weight.mul_(norm_scale)
    model.save_pretrained(out)
    return out


def matmul_params(config) -> int:
    """Parameters that take part in a matmul per token: every layer's projections and the LM head."""
    h, layers = config.hidden_size, config.num_hidden_layers
    head_dim = h // config.num_attention_heads
    qkv = h * (h + 2 * config.num_key_value_heads * head_dim)
    per_layer = qkv + h * h + 3 * h * config.intermediate_size
    return layers * per_layer + h * config.vocab_size


def train_flops_per_token(config, seq_len: int) -> float:
    """6 N (forward + backward of the matmuls) plus causal attention: 6 L s d per token."""
    return 6.0 * matmul_params(config) + 6.0 * config.num_hidden_layers * seq_len * config.hidden_size
