"""HF <-> megatron-core GPTModel (local spec) bridge: Llama / Qwen2 / Qwen3 dense and the
Qwen3-MoE / GLM-4.5 mixture-of-experts families, any TP, PP, EP and expert-TP.

- ``hf_config``: HF config -> TransformerConfig / GPTModel arguments, RoPE frequencies, and the
  refusal of every config field that would change the numerics and is not mapped;
- ``moe``: the MoE families' router, expert and layer-pattern fields;
- ``mapping``: which HF tensors each Megatron parameter holds and how it is split;
- ``weights``: loading HF safetensors into a rank's model and exporting it back (weight sync,
  ``--save-hf``, ``convert``).
"""

from actors.megatron.bridge.hf_config import (
    DENSE_MODEL_TYPES,
    SUPPORTED_MODEL_TYPES,
    SUPPORTED_ROPE_TYPES,
    GPTModelArgs,
    check_supported,
    gpt_model_args_from_hf,
    hf_config_if_readable,
    hf_head_dim,
    hf_qk_layernorm,
    hf_qkv_bias,
    load_hf_config,
    padded_vocab_size,
    rope_inv_freq,
    rotary_fraction,
    transformer_config_from_hf,
)
from actors.megatron.bridge.mapping import ParamMapping, model_tensors, param_mappings, unwrap_model
from actors.megatron.bridge.moe import MOE_MODEL_TYPES, moe_layer_pattern
from actors.megatron.bridge.weights import (
    HFWeights,
    copy_hf_metadata,
    hf_vocab_size_of,
    iter_hf_weight_buckets,
    iter_hf_weights,
    load_hf_weights,
    save_hf_checkpoint,
)

__all__ = [
    "DENSE_MODEL_TYPES", "MOE_MODEL_TYPES", "SUPPORTED_MODEL_TYPES", "SUPPORTED_ROPE_TYPES", "GPTModelArgs",
    "HFWeights", "ParamMapping", "check_supported", "copy_hf_metadata", "gpt_model_args_from_hf", "hf_head_dim",
    "hf_qk_layernorm", "hf_qkv_bias", "hf_vocab_size_of", "iter_hf_weight_buckets", "iter_hf_weights",
    "hf_config_if_readable", "load_hf_config", "load_hf_weights", "model_tensors", "moe_layer_pattern", "padded_vocab_size", "param_mappings",
    "rope_inv_freq", "rotary_fraction", "save_hf_checkpoint", "transformer_config_from_hf", "unwrap_model",
]
