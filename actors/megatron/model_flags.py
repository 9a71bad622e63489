"""Megatron-LM's model-architecture flags, accepted as slime's launch scripts write them and
checked against the HF config.

slime's scripts describe the model twice: ``--hf-checkpoint`` and a block of Megatron-LM flags
(``--swiglu --num-layers 36 --hidden-size 2048 --group-query-attention --num-query-groups 2
--disable-bias-linear --normalization RMSNorm --norm-epsilon 1e-6 --rotary-base 1e6 --vocab-size
151936`` ...). Here the architecture comes from the HF config alone (the bridge maps it), so the
flags are accepted only to be compared with it: a flag that disagrees fails at start with one
line naming the flag, its value and the HF config's. Flags that are TransformerConfig fields
(``--num-layers``, ``--kv-channels``, ``--qk-layernorm`` ...) are checked the same way before they
reach the model; the Megatron-LM-only ones below are dropped after the check.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any


@dataclass
class MegatronLMModelFlags:
    """Megatron-LM model flags without a megatron-core field (checked, then unused)."""

    swiglu: bool = False
    group_query_attention: bool = False
    disable_bias_linear: bool = False
    norm_epsilon: float | None = None
    rotary_base: float | None = None
    rotary_percent: float | None = None
    vocab_size: int | None = None
    untie_embeddings_and_output_weights: bool = False
    seq_length: int | None = None
    max_position_embeddings: int | None = None
    use_rotary_position_embeddings: bool = False
    position_embedding_type: str | None = None
    num_experts: int | None = None  # MoE: Megatron-LM's name for num_moe_experts


MODEL_FLAG_NAMES = frozenset(f.name for f in fields(MegatronLMModelFlags))

# TransformerConfig fields that describe the architecture: given as flags, they must match too.
ARCHITECTURE_FIELDS = ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "num_query_groups",
                       "kv_channels", "normalization", "layernorm_epsilon", "gated_linear_unit", "add_bias_linear",
                       "add_qkv_bias", "qk_layernorm", "rotary_interleaved",
                       # MoE (None for a dense model)
                       "num_moe_experts", "moe_ffn_hidden_size", "moe_router_topk", "moe_shared_expert_intermediate_size",
                       "moe_router_score_function", "moe_router_topk_scaling_factor")


@dataclass(frozen=True)
class _Expected:
    value: Any  # what the flag must be for this HF config
    source: str  # where in the HF config it comes from, for the error line
    agrees: Callable[[Any, Any], bool] = lambda given, expected: given == expected


def _close(given: Any, expected: Any) -> bool:
    return given is not None and expected is not None and math.isclose(float(given), float(expected), rel_tol=1e-6)


def _expectations(hf_config: Any) -> dict[str, _Expected]:
    from actors.megatron.bridge import gpt_model_args_from_hf, transformer_config_from_hf

    tc = transformer_config_from_hf(hf_config)
    gpt = gpt_model_args_from_hf(hf_config, tensor_parallel_size=1)
    kv_heads = getattr(hf_config, "num_key_value_heads", None) or hf_config.num_attention_heads
    family = f"model_type = {hf_config.model_type!r}"
    return {
        "num_layers": _Expected(tc.num_layers, f"num_hidden_layers = {hf_config.num_hidden_layers}"),
        "hidden_size": _Expected(tc.hidden_size, f"hidden_size = {hf_config.hidden_size}"),
        "ffn_hidden_size": _Expected(tc.ffn_hidden_size, f"intermediate_size = {hf_config.intermediate_size}"),
        "num_attention_heads": _Expected(tc.num_attention_heads,
                                         f"num_attention_heads = {hf_config.num_attention_heads}"),
        "num_query_groups": _Expected(tc.num_query_groups, f"num_key_value_heads = {kv_heads}"),
        "kv_channels": _Expected(tc.kv_channels, f"head_dim = {tc.kv_channels}"),
        "normalization": _Expected(tc.normalization, f"{family} uses RMSNorm"),
        "layernorm_epsilon": _Expected(tc.layernorm_epsilon, f"rms_norm_eps = {hf_config.rms_norm_eps}", _close),
        "norm_epsilon": _Expected(tc.layernorm_epsilon, f"rms_norm_eps = {hf_config.rms_norm_eps}", _close),
        "gated_linear_unit": _Expected(True, f"{family} has a SwiGLU MLP"),
        "swiglu": _Expected(True, f"{family} has a SwiGLU MLP"),
        "add_bias_linear": _Expected(tc.add_bias_linear, f"{family} has no linear biases"),
        "disable_bias_linear": _Expected(not tc.add_bias_linear, f"{family} has no linear biases"),
        "add_qkv_bias": _Expected(tc.add_qkv_bias, f"{family}{'' if tc.add_qkv_bias else ' without attention_bias'} "
                                                   f"{'has' if tc.add_qkv_bias else 'has no'} q/k/v biases"),
        "qk_layernorm": _Expected(tc.qk_layernorm, f"{family} {'has' if tc.qk_layernorm else 'has no'} q/k norms"),
        "rotary_interleaved": _Expected(False, "HF RoPE rotates halves, not interleaved pairs"),
        # With GQA off Megatron-LM uses one group per head: only a config without GQA allows that.
        "group_query_attention": _Expected(True if kv_heads < hf_config.num_attention_heads else None,
                                           f"num_key_value_heads = {kv_heads} < num_attention_heads = "
                                           f"{hf_config.num_attention_heads}",
                                           lambda given, expected: expected is None or given == expected),
        "rotary_base": _Expected(gpt.rotary_base, f"rope_theta = {gpt.rotary_base:g}", _close),
        "rotary_percent": _Expected(gpt.rotary_percent, f"partial_rotary_factor = {gpt.rotary_percent:g}", _close),
        **_moe_expectations(tc),
        "vocab_size": _Expected(gpt.hf_vocab_size, f"vocab_size = {gpt.hf_vocab_size}"),
        "untie_embeddings_and_output_weights": _Expected(
            not gpt.share_embeddings_and_output_weights,
            f"tie_word_embeddings = {gpt.share_embeddings_and_output_weights}"),
        "max_position_embeddings": _Expected(gpt.max_sequence_length,
                                             f"max_position_embeddings = {gpt.max_sequence_length}"),
        "seq_length": _Expected(gpt.max_sequence_length, f"max_position_embeddings = {gpt.max_sequence_length}",
                                lambda given, expected: given <= expected),
        "use_rotary_position_embeddings": _Expected(True, f"{family} uses RoPE"),
        "position_embedding_type": _Expected("rope", f"{family} uses RoPE"),
    }


def _moe_expectations(tc: Any) -> dict[str, _Expected]:
    """The MoE flags slime's scripts write (Megatron-LM's ``--num-experts`` included), as the
    bridge derives them from the HF config; a dense model takes none of them."""
    if not tc.num_moe_experts:
        dense = _Expected(None, "a model without MoE layers")
        return {name: dense for name in ("num_experts", "num_moe_experts", "moe_ffn_hidden_size", "moe_router_topk",
                                         "moe_shared_expert_intermediate_size", "moe_router_score_function",
                                         "moe_router_topk_scaling_factor")}
    experts = _Expected(tc.num_moe_experts, f"num_experts = {tc.num_moe_experts}")
    return {
        "num_experts": experts,
        "num_moe_experts": experts,
        "moe_ffn_hidden_size": _Expected(tc.moe_ffn_hidden_size, f"moe_intermediate_size = {tc.moe_ffn_hidden_size}"),
        "moe_router_topk": _Expected(tc.moe_router_topk, f"num_experts_per_tok = {tc.moe_router_topk}"),
        "moe_shared_expert_intermediate_size": _Expected(
            tc.moe_shared_expert_intermediate_size,
            f"n_shared_experts x moe_intermediate_size = {tc.moe_shared_expert_intermediate_size}"),
        "moe_router_score_function": _Expected(tc.moe_router_score_function,
                                               f"the HF model's {tc.moe_router_score_function} router"),
        "moe_router_topk_scaling_factor": _Expected(tc.moe_router_topk_scaling_factor,
                                                    f"routed_scaling_factor = {tc.moe_router_topk_scaling_factor}",
                                                    lambda given, expected: _close(given, expected or 1.0)),
    }


def _flag_text(name: str, value: Any) -> str:
    flag = name.replace("_", "-")
    if isinstance(value, bool):
        return f"--{flag}" if value else f"--no-{flag}"
    return f"--{flag} {value:g}" if isinstance(value, float) else f"--{flag} {value}"


def check_model_flags(megatron: dict[str, Any], hf_checkpoint: str) -> None:
    """Raise ValueError (one line) for the first architecture flag the HF config disagrees with."""
    given = {k: v for k, v in megatron.items() if k in MODEL_FLAG_NAMES or k in ARCHITECTURE_FIELDS}
    if not given:
        return  # nothing to check: no need to read the HF config
    from actors.megatron.bridge import load_hf_config

    try:
        hf_config = load_hf_config(hf_checkpoint)
    except Exception as error:  # noqa: BLE001 - a missing or unreadable config.json
        raise ValueError(f"--hf-checkpoint {hf_checkpoint}: cannot read the HF config to check the model flags "
                         f"{', '.join(_flag_text(k, v) for k, v in given.items())}: {error}") from None
    expected = _expectations(hf_config)
    for name, value in given.items():
        rule = expected[name]
        if not rule.agrees(value, rule.value):
            wanted = "at most" if name == "seq_length" else "i.e."
            hint = f", {wanted} {_flag_text(name, rule.value)}" if rule.value is not None else ""
            raise ValueError(f"{_flag_text(name, value)} does not match the HF config in {hf_checkpoint} "
                             f"({rule.source}{hint})")
