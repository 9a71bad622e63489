"""HF config -> megatron-core ``TransformerConfig`` and ``GPTModel`` arguments, and the RoPE
frequencies, for every family the bridge maps (dense: Llama, Qwen2, Qwen3; MoE: Qwen3-MoE,
GLM-4.5 — the MoE fields come from ``bridge.moe``).

RoPE: rope_type default, linear and llama3 (Llama 3.1 / 3.2), over the whole head or its first
``partial_rotary_factor`` (GLM-4.5); the inverse frequencies are computed as transformers
computes them (``rope_inv_freq``). Config fields that would change the numerics and are not
mapped are refused by name (``check_supported``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from megatron.core import parallel_state
from megatron.core.transformer.transformer_config import TransformerConfig
from torch import Tensor

from actors.megatron.bridge.moe import MOE_MODEL_TYPES, check_moe_config, moe_transformer_fields

DENSE_MODEL_TYPES = ("llama", "qwen2", "qwen3")
SUPPORTED_MODEL_TYPES = DENSE_MODEL_TYPES + MOE_MODEL_TYPES
# Llama 3.1 / 3.2 use llama3; Qwen2.5 / Qwen3 the default (their yarn long-context option is not mapped).
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")


# --------------------------------------------------------------------------------------------
# Config
# --------------------------------------------------------------------------------------------


def load_hf_config(hf_dir_or_config: Any) -> Any:
    """An HF ``PretrainedConfig`` from a directory path or an already-loaded config."""
    if isinstance(hf_dir_or_config, (str, Path)):
        from transformers import AutoConfig

        # Local only: a checkpoint is a directory here. A path that is not one would otherwise be
        # taken for a Hub id and retried for ~25 s (offline) before the start-time checks go on.
        return AutoConfig.from_pretrained(str(hf_dir_or_config), local_files_only=True)
    return hf_dir_or_config


def hf_config_if_readable(hf_checkpoint: str) -> Any | None:
    """The checkpoint's HF config, or None where it cannot be read: the start-time layout checks
    skip then, and the preflight reports the missing or broken model directory in its own line."""
    if not Path(hf_checkpoint).is_dir():
        return None  # not even a local lookup: huggingface_hub's request headers alone go to the network
    try:
        return load_hf_config(hf_checkpoint)
    except Exception:  # noqa: BLE001 - reported by the preflight, not here
        return None


def check_supported(hf_config: Any) -> None:
    """Raise ValueError (one line naming the field) for an HF config the bridge cannot reproduce."""
    # Every field that changes the HF model's numerics is either mapped below or refused here.
    # Accepted without mapping because the model's forward does not read them: pretraining_tp
    # (transformers 5 ignores it; older versions only split the same matmuls), bos / eos / pad
    # token ids, torch_dtype / dtype (the trainer's precision comes from its own flags),
    # sliding_window / max_window_layers while no layer slides, use_cache.
    model_type = getattr(hf_config, "model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(
            f"HF model_type {model_type!r} is not supported by the bridge "
            f"(supported: {', '.join(SUPPORTED_MODEL_TYPES)})"
        )
    if getattr(hf_config, "hidden_act", "silu") != "silu":
        raise ValueError(f"only hidden_act='silu' is supported, config has {hf_config.hidden_act!r}")
    if getattr(hf_config, "mlp_bias", False):
        raise ValueError("HF config has mlp_bias=True, which the bridge does not map")
    # Llama and Qwen3 put the bias on o_proj as well; the local layer spec can only give
    # linear_proj a bias together with the MLP (add_bias_linear), so it would be dropped.
    # GLM-4.5's attention_bias is on q/k/v only, like Qwen2's.
    if model_type not in ("qwen2", "glm4_moe") and getattr(hf_config, "attention_bias", False):
        raise ValueError("HF config has attention_bias=True (q/k/v/o_proj biases), which the bridge does not map")
    if getattr(hf_config, "use_sliding_window", False):
        raise ValueError("HF config has use_sliding_window=True, which the bridge does not map")
    # transformers 5 decides per layer: Qwen2 / Qwen3 derive layer_types from
    # use_sliding_window and max_window_layers, so real configs give only full_attention.
    other_layers = sorted(set(getattr(hf_config, "layer_types", None) or ()) - {"full_attention"})
    if other_layers:
        raise ValueError(f"HF config has layer_types {other_layers}; the bridge maps only full_attention layers")
    rope = _rope_parameters(hf_config)
    if rope["rope_type"] not in SUPPORTED_ROPE_TYPES:
        raise ValueError(
            f"rope_type {rope['rope_type']!r} is not supported by the bridge "
            f"(supported: {', '.join(SUPPORTED_ROPE_TYPES)})"
        )
    if model_type != "glm4_moe" and rotary_fraction(hf_config) != 1.0:
        raise ValueError(
            f"HF config has partial_rotary_factor={rotary_fraction(hf_config)}, which the bridge maps for "
            "glm4_moe only"
        )
    if model_type in MOE_MODEL_TYPES:
        check_moe_config(hf_config)


def _rope_parameters(hf_config: Any) -> dict[str, Any]:
    """RoPE settings with ``rope_type`` and ``rope_theta`` always present.

    transformers >= 5 keeps them all in ``rope_parameters`` (nested per layer type when
    layer_types differ); older versions in ``rope_theta`` and ``rope_scaling`` (with the
    legacy key ``type``), which is also how hub config.json files spell them.
    """
    params = dict(getattr(hf_config, "rope_parameters", None) or {})
    if isinstance(params.get("full_attention"), dict):
        params = dict(params["full_attention"])
    params = {**(getattr(hf_config, "rope_scaling", None) or {}), **params}
    params["rope_type"] = params.get("rope_type") or params.get("type") or "default"
    if params.get("rope_theta") is None:
        params["rope_theta"] = getattr(hf_config, "rope_theta", None) or 10000.0
    return params


def rotary_fraction(hf_config: Any) -> float:
    """The fraction of each head RoPE rotates (GLM-4.5: its first half); 1.0 elsewhere."""
    rope = _rope_parameters(hf_config)
    factor = rope.get("partial_rotary_factor") or getattr(hf_config, "partial_rotary_factor", None)
    return float(factor or 1.0)


def rope_inv_freq(hf_config: Any) -> Tensor:
    """RoPE inverse frequencies (float32, head_dim / 2) exactly as transformers computes them.

    Megatron's RotaryEmbedding does linear scaling on the positions (equal up to rounding) and
    llama3 scaling only with Llama 3.1's constants hard-coded (low / high freq factor 1 / 4,
    original length 8192), so ``build_gpt_model`` replaces its frequencies with these.
    """
    hf_config = load_hf_config(hf_config)
    check_supported(hf_config)
    rope = _rope_parameters(hf_config)
    # transformers and Megatron's RotaryEmbedding both rotate int(head_dim * fraction) dims.
    dim = int(hf_head_dim(hf_config) * rotary_fraction(hf_config))
    # transformers' expression (int64 arange cast to float32), so results are bit-identical.
    inv_freq = 1.0 / (rope["rope_theta"] ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    if rope["rope_type"] == "linear":
        return inv_freq / rope["factor"]
    if rope["rope_type"] == "llama3":
        # transformers fills in max_position_embeddings when the config omits the original length.
        original = rope.get("original_max_position_embeddings") or hf_config.max_position_embeddings
        return _llama3_scaled(inv_freq, rope["factor"], rope["low_freq_factor"], rope["high_freq_factor"], original)
    return inv_freq


def _llama3_scaled(
    inv_freq: Tensor, factor: float, low_freq_factor: float, high_freq_factor: float, original_max_positions: int
) -> Tensor:
    # Llama 3.1's band-wise scaling, in transformers' operation order: wavelengths shorter than
    # original / high_freq_factor are kept, longer than original / low_freq_factor divided by
    # factor, and those between interpolated linearly in original / wavelength.
    low_freq_wavelen = original_max_positions / low_freq_factor
    high_freq_wavelen = original_max_positions / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (original_max_positions / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return torch.where(medium, (1 - smooth) * scaled / factor + smooth * scaled, scaled)


def hf_head_dim(hf_config: Any) -> int:
    head_dim = getattr(hf_config, "head_dim", None)
    return int(head_dim) if head_dim else hf_config.hidden_size // hf_config.num_attention_heads


def hf_qkv_bias(hf_config: Any) -> bool:
    """Qwen2 always has q/k/v biases (and none on o_proj), GLM-4.5 with attention_bias;
    Llama / Qwen3 biases are refused."""
    if hf_config.model_type == "glm4_moe":
        return bool(getattr(hf_config, "attention_bias", False))
    return hf_config.model_type == "qwen2"


def hf_qk_layernorm(hf_config: Any) -> bool:
    """RMSNorm on q and k per head: always in Qwen3 (and its MoE), in GLM-4.5 with use_qk_norm."""
    if hf_config.model_type == "glm4_moe":
        return bool(getattr(hf_config, "use_qk_norm", False))
    return hf_config.model_type in ("qwen3", "qwen3_moe")


def transformer_config_from_hf(hf_config: Any, **overrides: Any) -> TransformerConfig:
    """Megatron ``TransformerConfig`` for an HF config of a supported family (MoE included).

    ``overrides`` are TransformerConfig fields (e.g. from ``--tensor-model-parallel-size``,
    ``--bf16``, ``--recompute-granularity``) and replace the values derived here. Without
    CUDA the defaults are fp32 and CPU initialisation; with CUDA, bf16. TP/PP default to the
    initialised Megatron parallel state.
    """
    hf_config = load_hf_config(hf_config)
    check_supported(hf_config)
    cuda = torch.cuda.is_available()
    fields: dict[str, Any] = dict(
        num_layers=hf_config.num_hidden_layers,
        hidden_size=hf_config.hidden_size,
        ffn_hidden_size=hf_config.intermediate_size,
        num_attention_heads=hf_config.num_attention_heads,
        num_query_groups=getattr(hf_config, "num_key_value_heads", None) or hf_config.num_attention_heads,
        kv_channels=hf_head_dim(hf_config),
        normalization="RMSNorm",
        layernorm_epsilon=hf_config.rms_norm_eps,
        gated_linear_unit=True,
        activation_func=F.silu,
        add_bias_linear=False,
        add_qkv_bias=hf_qkv_bias(hf_config),
        qk_layernorm=hf_qk_layernorm(hf_config),
        hidden_dropout=0.0,
        attention_dropout=float(getattr(hf_config, "attention_dropout", 0.0) or 0.0),
        init_method_std=getattr(hf_config, "initializer_range", 0.02),
        attention_softmax_in_fp32=True,
        apply_query_key_layer_scaling=False,
        # Fused kernels need CUDA / Apex / TE; the plain torch paths give the same numbers.
        bias_activation_fusion=False,
        bias_dropout_fusion=False,
        masked_softmax_fusion=False,
        apply_rope_fusion=False,
        persist_layer_norm=False,
        gradient_accumulation_fusion=False,
        use_cpu_initialization=not cuda,
        bf16=cuda,
        **moe_transformer_fields(hf_config),
    )
    if parallel_state.model_parallel_is_initialized():
        fields["tensor_model_parallel_size"] = parallel_state.get_tensor_model_parallel_world_size()
        fields["pipeline_model_parallel_size"] = parallel_state.get_pipeline_model_parallel_world_size()
        if fields.get("num_moe_experts"):
            fields["expert_model_parallel_size"] = parallel_state.get_expert_model_parallel_world_size()
            fields["expert_tensor_parallel_size"] = parallel_state.get_expert_tensor_parallel_world_size()
    fields.update(overrides)
    if (fields.get("num_moe_experts") and fields.get("tensor_model_parallel_size", 1) > 1
            and "sequence_parallel" not in overrides):
        # megatron-core trains MoE layers under TP only with sequence parallelism (MoELayer.forward);
        # an explicit --no-sequence-parallel is refused at start (moe_layout.check_moe_layout).
        fields["sequence_parallel"] = True
    if fields.get("pipeline_model_parallel_size", 1) > 1 and "variable_seq_lengths" not in overrides:
        # Micro-batches are padded to their own length (and hold as many samples as fit), so
        # the stages exchange each activation's shape before the activation itself.
        fields["variable_seq_lengths"] = True
        # megatron-core refuses that with the allgather MoE dispatcher (its default, and the
        # bridge's for MoE models) even in a dense model, which never dispatches tokens: name the
        # one it accepts unless a flag chose.
        if "moe_token_dispatcher_type" not in overrides:
            fields["moe_token_dispatcher_type"] = "alltoall"
    # Parameter dtype follows the precision flags unless given explicitly.
    if fields.get("fp16"):
        fields["bf16"] = False
    if "params_dtype" not in overrides:
        fields["params_dtype"] = (
            torch.bfloat16 if fields.get("bf16") else torch.float16 if fields.get("fp16") else torch.float32
        )
    fields.setdefault("pipeline_dtype", fields["params_dtype"])
    return TransformerConfig(**fields)


@dataclass(frozen=True)
class GPTModelArgs:
    """The ``GPTModel`` constructor arguments that come from the HF config (not the TransformerConfig)."""

    vocab_size: int  # padded to a multiple of TP
    hf_vocab_size: int
    max_sequence_length: int
    rotary_base: float
    rotary_percent: float  # the fraction of each head RoPE rotates
    share_embeddings_and_output_weights: bool


def padded_vocab_size(vocab_size: int, tp: int) -> int:
    """Smallest multiple of ``tp`` >= vocab_size: pad rows add logits the trainer must drop."""
    return -(-vocab_size // tp) * tp


def gpt_model_args_from_hf(hf_config: Any, tensor_parallel_size: int) -> GPTModelArgs:
    hf_config = load_hf_config(hf_config)
    check_supported(hf_config)
    return GPTModelArgs(
        vocab_size=padded_vocab_size(hf_config.vocab_size, tensor_parallel_size),
        hf_vocab_size=hf_config.vocab_size,
        max_sequence_length=hf_config.max_position_embeddings,
        rotary_base=float(_rope_parameters(hf_config)["rope_theta"]),
        rotary_percent=rotary_fraction(hf_config),
        share_embeddings_and_output_weights=bool(getattr(hf_config, "tie_word_embeddings", False)),
    )
