"""Mixture-of-experts families: Qwen3-MoE (``qwen3_moe``) and GLM-4.5 (``glm4_moe``).

What each HF field becomes in megatron-core's MoE layer (local spec, ``SequentialMLP`` experts):

| HF | megatron-core |
|---|---|
| ``num_experts`` / ``n_routed_experts`` | ``num_moe_experts`` |
| ``num_experts_per_tok`` | ``moe_router_topk`` |
| ``moe_intermediate_size`` | ``moe_ffn_hidden_size`` (``intermediate_size`` stays the dense layers') |
| Qwen3-MoE ``decoder_sparse_step`` / ``mlp_only_layers``, GLM ``first_k_dense_replace`` | ``moe_layer_freq`` as a 0/1 list |
| Qwen3-MoE softmax router, ``norm_topk_prob`` | ``moe_router_score_function="softmax"``, ``moe_router_pre_softmax = not norm_topk_prob`` |
| Qwen3-MoE ``router_aux_loss_coef`` | ``moe_aux_loss_coeff`` (``aux_loss`` balancing) |
| GLM sigmoid router + ``e_score_correction_bias`` | ``moe_router_score_function="sigmoid"``, ``moe_router_enable_expert_bias`` (the bias is a buffer, loaded and exported; update rate 0: RL keeps the checkpoint's bias unless ``--moe-router-bias-update-rate`` says otherwise) |
| GLM ``n_group`` / ``topk_group`` | ``moe_router_num_groups`` / ``moe_router_group_topk`` |
| GLM ``routed_scaling_factor`` | ``moe_router_topk_scaling_factor`` |
| GLM ``n_shared_experts`` | ``moe_shared_expert_intermediate_size = n_shared_experts * moe_intermediate_size`` |

Numerics that megatron-core cannot reproduce are refused: a sigmoid router without top-k
renormalisation (megatron-core always renormalises sigmoid scores for top-k > 1), and group-limited
routing whose group score is not the sum of the top-2 experts (transformers' rule; megatron-core
sums the top ``topk / group_topk``). Every model-specific HF field is either mapped, listed as not
affecting the forward, or refused by name.
"""

from __future__ import annotations

from typing import Any

MOE_MODEL_TYPES = ("qwen3_moe", "glm4_moe")

# Model-specific HF fields of the MoE families (beyond PretrainedConfig's own). The dense fields
# are mapped or checked by hf_config.check_supported; ``_NOT_IN_FORWARD`` do not change logits.
_SHARED_FIELDS = frozenset({
    "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "head_dim", "hidden_act", "max_position_embeddings", "initializer_range", "rms_norm_eps",
    "tie_word_embeddings", "rope_parameters", "rope_theta", "rope_scaling", "attention_bias", "attention_dropout",
    "moe_intermediate_size", "num_experts_per_tok", "norm_topk_prob", "layer_types",
})
_NOT_IN_FORWARD = frozenset({
    "use_cache", "bos_token_id", "eos_token_id", "pad_token_id", "output_router_logits",
    # Multi-token-prediction layers (GLM-4.5): transformers does not build them either; their
    # weights are neither loaded nor exported.
    "num_nextn_predict_layers",
    # Read only together with use_sliding_window, which check_supported refuses.
    "sliding_window", "max_window_layers",
})
_FAMILY_FIELDS = {
    "qwen3_moe": frozenset({"num_experts", "num_local_experts", "decoder_sparse_step", "mlp_only_layers",
                            "router_aux_loss_coef", "use_sliding_window"}),
    "glm4_moe": frozenset({"n_routed_experts", "n_shared_experts", "routed_scaling_factor", "n_group", "topk_group",
                           "first_k_dense_replace", "use_qk_norm", "partial_rotary_factor"}),
}


def _model_specific_fields(hf_config: Any) -> set[str]:
    from transformers import PretrainedConfig

    return set(hf_config.to_dict()) - set(PretrainedConfig().to_dict())


def num_experts(hf_config: Any) -> int:
    if hf_config.model_type == "glm4_moe":
        return int(hf_config.n_routed_experts)
    return int(getattr(hf_config, "num_experts", 0) or 0)


def moe_layer_pattern(hf_config: Any) -> list[int]:
    """1 for each decoder layer with a sparse MLP, 0 for a dense one (transformers' rules)."""
    layers = hf_config.num_hidden_layers
    if hf_config.model_type == "glm4_moe":
        return [int(i >= hf_config.first_k_dense_replace) for i in range(layers)]
    step = getattr(hf_config, "decoder_sparse_step", 1) or 1
    dense = set(getattr(hf_config, "mlp_only_layers", None) or ())
    return [int(num_experts(hf_config) > 0 and i not in dense and (i + 1) % step == 0) for i in range(layers)]


def check_moe_config(hf_config: Any) -> None:
    """Raise ValueError (one line naming the field) for an MoE config the bridge cannot reproduce."""
    family = hf_config.model_type
    unknown = sorted(_model_specific_fields(hf_config) - _SHARED_FIELDS - _NOT_IN_FORWARD - _FAMILY_FIELDS[family])
    if unknown:
        raise ValueError(f"HF {family} config has field {unknown[0]!r}, which the bridge does not map"
                         + (f" (nor {', '.join(map(repr, unknown[1:]))})" if unknown[1:] else ""))
    experts, topk = num_experts(hf_config), hf_config.num_experts_per_tok
    if any(moe_layer_pattern(hf_config)) and not 0 < topk <= experts:
        raise ValueError(f"HF {family} config has num_experts_per_tok={topk}, which must be in 1..{experts} experts")
    if family != "glm4_moe":
        return
    if not hf_config.norm_topk_prob and topk > 1:
        raise ValueError("HF glm4_moe config has norm_topk_prob=False, which megatron-core's sigmoid router cannot "
                         "reproduce (it always renormalises the top-k scores)")
    groups, group_topk = hf_config.n_group, hf_config.topk_group
    if groups > 1:
        if experts % groups or not 0 < group_topk <= groups:
            raise ValueError(f"HF glm4_moe config has n_group={groups}, topk_group={group_topk}: n_group must divide "
                             f"the {experts} experts and topk_group be in 1..n_group")
        if topk // group_topk != 2:
            raise ValueError(f"HF glm4_moe config has topk_group={group_topk} with num_experts_per_tok={topk}: "
                             "transformers scores a group by its top-2 experts and megatron-core by its top "
                             "num_experts_per_tok / topk_group, so the bridge maps only topk / topk_group = 2")


def moe_transformer_fields(hf_config: Any) -> dict[str, Any]:
    """The TransformerConfig fields of an MoE family ({} for a dense model or an MoE config whose
    layers are all dense)."""
    if hf_config.model_type not in MOE_MODEL_TYPES:
        return {}
    pattern = moe_layer_pattern(hf_config)
    if not any(pattern):
        return {}
    fields: dict[str, Any] = dict(
        num_moe_experts=num_experts(hf_config),
        moe_router_topk=hf_config.num_experts_per_tok,
        moe_ffn_hidden_size=hf_config.moe_intermediate_size,
        moe_layer_freq=pattern,
        # SequentialMLP: one local MLP per expert, no grouped-GEMM kernel (CPU-safe, exact).
        moe_grouped_gemm=False,
        # all-gather / reduce-scatter dispatch works under gloo (the all-to-all one needs CUDA streams).
        moe_token_dispatcher_type="allgather",
    )
    if hf_config.model_type == "qwen3_moe":
        # norm_topk_prob: softmax over the top-k logits == softmax over all, then renormalised.
        fields.update(moe_router_score_function="softmax", moe_router_pre_softmax=not hf_config.norm_topk_prob,
                      moe_router_load_balancing_type="aux_loss",
                      moe_aux_loss_coeff=float(getattr(hf_config, "router_aux_loss_coef", 0.0) or 0.0))
        return fields
    groups = hf_config.n_group
    fields.update(
        moe_router_score_function="sigmoid",
        moe_router_enable_expert_bias=True,
        moe_router_bias_update_rate=0.0,
        # transformers computes GLM's router logits in fp32 whatever the model dtype.
        moe_router_dtype="fp32",
        moe_router_load_balancing_type="none",
        moe_router_topk_scaling_factor=float(hf_config.routed_scaling_factor),
        moe_router_num_groups=groups if groups > 1 else None,
        moe_router_group_topk=hf_config.topk_group if groups > 1 else None,
    )
    if hf_config.n_shared_experts:
        fields["moe_shared_expert_intermediate_size"] = hf_config.n_shared_experts * hf_config.moe_intermediate_size
    return fields
