"""MoE HF config -> Megatron TransformerConfig (no processes, no weights): Qwen3-MoE and GLM-4.5
fields, dense/sparse layer patterns, partial RoPE, and refusals in one line naming the field."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoConfig

from actors.megatron.bridge import gpt_model_args_from_hf, moe_layer_pattern, rope_inv_freq, transformer_config_from_hf

# The fields a Qwen3-30B-A3B / GLM-4.5-Air config.json carries, at a few layers.
QWEN3_MOE = dict(
    attention_bias=False, attention_dropout=0.0, bos_token_id=151643, decoder_sparse_step=1, eos_token_id=151645,
    head_dim=128, hidden_act="silu", hidden_size=2048, initializer_range=0.02, intermediate_size=6144,
    max_position_embeddings=40960, max_window_layers=4, mlp_only_layers=[], moe_intermediate_size=768,
    norm_topk_prob=True, num_attention_heads=32, num_experts=128, num_experts_per_tok=8, num_hidden_layers=4,
    num_key_value_heads=4, output_router_logits=False, rms_norm_eps=1e-6, rope_theta=1e6, router_aux_loss_coef=0.001,
    sliding_window=None, tie_word_embeddings=False, use_cache=True, use_sliding_window=False, vocab_size=151936,
)
GLM45_AIR = dict(
    attention_bias=True, attention_dropout=0.0, pad_token_id=151329, eos_token_id=[151329, 151336, 151338],
    head_dim=128, hidden_act="silu", hidden_size=4096, partial_rotary_factor=0.5, initializer_range=0.02,
    intermediate_size=10944, max_position_embeddings=131072, moe_intermediate_size=1408, norm_topk_prob=True,
    num_attention_heads=96, n_group=1, topk_group=1, n_routed_experts=128, n_shared_experts=1,
    routed_scaling_factor=1.0, num_experts_per_tok=8, first_k_dense_replace=1, num_hidden_layers=4,
    num_key_value_heads=8, rms_norm_eps=1e-5, rope_theta=1e6, num_nextn_predict_layers=1, tie_word_embeddings=False,
    use_cache=True, use_qk_norm=False, vocab_size=151552,
)


def _config(model_type: str, **fields):
    base = QWEN3_MOE if model_type == "qwen3_moe" else GLM45_AIR
    return AutoConfig.for_model(model_type, **{**base, **fields})


def test_qwen3_moe_maps_experts_topk_sizes_softmax_router_and_aux_loss():
    config = transformer_config_from_hf(_config("qwen3_moe"))
    assert (config.num_moe_experts, config.moe_router_topk) == (128, 8)
    assert (config.moe_ffn_hidden_size, config.ffn_hidden_size) == (768, 6144)
    assert config.moe_layer_freq == [1, 1, 1, 1]
    assert config.moe_router_score_function == "softmax"
    assert config.moe_aux_loss_coeff == 0.001 and config.moe_router_load_balancing_type == "aux_loss"
    assert config.qk_layernorm and not config.add_qkv_bias and config.kv_channels == 128
    assert not config.moe_grouped_gemm and config.moe_token_dispatcher_type == "allgather"


@pytest.mark.parametrize("norm_topk_prob", [True, False])
def test_qwen3_moe_norm_topk_prob_selects_softmax_after_or_before_top_k(norm_topk_prob):
    config = transformer_config_from_hf(_config("qwen3_moe", norm_topk_prob=norm_topk_prob))
    # Renormalised top-k probabilities == softmax over the top-k logits (softmax after top-k).
    assert config.moe_router_pre_softmax is not norm_topk_prob


def test_qwen3_moe_sparse_step_and_mlp_only_layers_give_transformers_layer_pattern():
    hf = _config("qwen3_moe", num_hidden_layers=6, decoder_sparse_step=2, mlp_only_layers=[3])
    # transformers: sparse iff (i + 1) % step == 0 and i not in mlp_only_layers.
    assert moe_layer_pattern(hf) == [0, 1, 0, 0, 0, 1]
    assert transformer_config_from_hf(hf).moe_layer_freq == [0, 1, 0, 0, 0, 1]


def test_glm45_maps_sigmoid_router_expert_bias_shared_experts_and_dense_first_layers():
    config = transformer_config_from_hf(_config("glm4_moe", routed_scaling_factor=2.5))
    assert config.moe_layer_freq == [0, 1, 1, 1]
    assert config.moe_router_score_function == "sigmoid" and config.moe_router_enable_expert_bias
    assert config.moe_router_bias_update_rate == 0.0  # the checkpoint's bias is kept unless a flag says otherwise
    assert config.moe_router_dtype == "fp32"
    assert config.moe_router_topk_scaling_factor == 2.5
    assert config.moe_shared_expert_intermediate_size == 1408
    assert config.moe_router_num_groups is None  # n_group = 1: plain top-k
    assert config.add_qkv_bias and not config.qk_layernorm


def test_glm45_group_limited_routing_and_qk_norm_pass_through():
    config = transformer_config_from_hf(_config("glm4_moe", n_group=8, topk_group=4, use_qk_norm=True))
    assert (config.moe_router_num_groups, config.moe_router_group_topk) == (8, 4)
    assert config.qk_layernorm


def test_glm45_partial_rotary_rotates_half_the_head_with_transformers_frequencies():
    from transformers.models.glm4_moe.modeling_glm4_moe import Glm4MoeRotaryEmbedding

    hf = _config("glm4_moe")
    assert gpt_model_args_from_hf(hf, tensor_parallel_size=1).rotary_percent == 0.5
    ours = rope_inv_freq(hf)
    assert ours.shape == (32,)  # 128 * 0.5 / 2
    assert torch.equal(ours, Glm4MoeRotaryEmbedding(hf).inv_freq)


def test_flags_override_the_derived_moe_fields():
    config = transformer_config_from_hf(_config("qwen3_moe"), moe_token_dispatcher_type="alltoall",
                                        moe_aux_loss_coeff=0.0)
    assert config.moe_token_dispatcher_type == "alltoall" and config.moe_aux_loss_coeff == 0.0


REFUSED = {
    "unknown_field": (("qwen3_moe", dict(shared_expert_intermediate_size=512)),
                      r"^HF qwen3_moe config has field 'shared_expert_intermediate_size', which the bridge does not "
                      r"map$"),
    "glm_unnormalised_sigmoid": (("glm4_moe", dict(norm_topk_prob=False)), "norm_topk_prob=False"),
    "glm_group_score_rule": (("glm4_moe", dict(n_group=8, topk_group=1)), "topk_group=1 with num_experts_per_tok=8"),
    "glm_groups_do_not_divide": (("glm4_moe", dict(n_group=3, topk_group=1)), "n_group=3"),
    "qwen3_moe_partial_rotary": (("qwen3_moe", dict(partial_rotary_factor=0.5)), "partial_rotary_factor=0.5"),
    "topk_above_experts": (("qwen3_moe", dict(num_experts=4, num_experts_per_tok=8)), "num_experts_per_tok=8"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_unmapped_moe_fields_are_refused_in_one_line_naming_the_field(case):
    (model_type, fields), message = REFUSED[case]
    with pytest.raises(ValueError, match=message) as err:
        transformer_config_from_hf(_config(model_type, **fields))
    assert "\n" not in str(err.value)


# --------------------------------------------------------------------------------------------
# Parallel layouts, checked at start
# --------------------------------------------------------------------------------------------


def _hf_dir(tmp_path, model_type: str, **fields):
    if model_type == "qwen3":  # dense
        config = AutoConfig.for_model("qwen3", hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2)
    else:
        config = _config(model_type, num_hidden_layers=2, **fields)
    config.save_pretrained(tmp_path)
    return str(tmp_path)


LAYOUT_REFUSED = {
    "tp_with_moe_without_sp": (("qwen3_moe", {}), dict(tensor_model_parallel_size=2, sequence_parallel=False), 4,
                               r"^--no-sequence-parallel with --tensor-model-parallel-size 2 and the MoE model .* "
                               "megatron-core trains MoE layers under TP only with sequence parallelism"),
    "grouped_gemm": (("qwen3_moe", {}), dict(moe_grouped_gemm=True), 1, "^--moe-grouped-gemm is not supported"),
    "ep_on_dense": (("qwen3", {}), dict(expert_model_parallel_size=2), 2,
                    "need an MoE model; .* has no MoE layers"),
    "ep_not_dividing_experts": (("qwen3_moe", dict(num_experts=8)), dict(expert_model_parallel_size=3), 3,
                                "--expert-model-parallel-size 3 does not divide the 8 experts"),
    "ep_etp_not_dividing_ranks": (("qwen3_moe", {}), dict(expert_model_parallel_size=2,
                                                         expert_tensor_parallel_size=2), 2,
                                  "--expert-model-parallel-size 2 x --expert-tensor-parallel-size 2 does not divide "
                                  "the 2 ranks"),
}


@pytest.mark.parametrize("case", sorted(LAYOUT_REFUSED))
def test_moe_layouts_the_ranks_cannot_train_are_refused_at_start(case, tmp_path):
    from actors.megatron.moe_layout import check_moe_layout

    (model_type, fields), transformer, ranks, message = LAYOUT_REFUSED[case]
    with pytest.raises(ValueError, match=message) as err:
        check_moe_layout(transformer, _hf_dir(tmp_path, model_type, **fields), ranks)
    assert "\n" not in str(err.value)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU dispatcher rule")
@pytest.mark.parametrize("transformer", [dict(moe_token_dispatcher_type="alltoall"),
                                         dict(pipeline_model_parallel_size=2)])
def test_cuda_only_token_dispatchers_are_refused_on_cpu(transformer, tmp_path):
    from actors.megatron.moe_layout import check_moe_layout

    with pytest.raises(ValueError, match="needs CUDA; on CPU the experts are dispatched with allgather"):
        check_moe_layout(transformer, _hf_dir(tmp_path, "qwen3_moe"), 2)


def test_the_trainer_config_refuses_an_moe_layout_at_validate_and_takes_expert_parallel_ones(tmp_path):
    from actors.megatron.config import TrainerConfig

    config = TrainerConfig(hf_checkpoint=_hf_dir(tmp_path, "glm4_moe"), actor_num_procs=4,
                           megatron=dict(expert_model_parallel_size=3))
    with pytest.raises(ValueError, match="--expert-model-parallel-size 3 does not divide the 128 experts"):
        config.validate()
    config.megatron = dict(expert_model_parallel_size=2, expert_tensor_parallel_size=2)
    config.validate()  # EP2 x expert-TP2 over 4 ranks
    config.megatron = dict(tensor_model_parallel_size=2, expert_model_parallel_size=2)
    config.validate()  # TP2 x EP2 over 4 ranks (sequence parallel)


def test_moe_at_tp2_turns_sequence_parallelism_on_unless_a_flag_chose():
    moe = _config("qwen3_moe", num_hidden_layers=2)
    assert transformer_config_from_hf(moe, tensor_model_parallel_size=2).sequence_parallel
    assert not transformer_config_from_hf(moe, tensor_model_parallel_size=1).sequence_parallel
    assert not transformer_config_from_hf(moe, tensor_model_parallel_size=2, sequence_parallel=False).sequence_parallel


# --------------------------------------------------------------------------------------------
# slime's Megatron-LM MoE model flags, checked against the HF config
# --------------------------------------------------------------------------------------------

# scripts/models/glm4.5-106B-A12B.sh's MoE block (slime), at GLM-4.5-Air's values.
GLM45_AIR_FLAGS = dict(num_experts=128, moe_ffn_hidden_size=1408, moe_shared_expert_intermediate_size=1408,
                       moe_router_topk=8, moe_router_score_function="sigmoid", moe_router_topk_scaling_factor=1.0,
                       rotary_percent=0.5, add_qkv_bias=True, kv_channels=128)


def test_slime_moe_model_flags_that_match_the_hf_config_are_accepted(tmp_path):
    from actors.megatron.model_flags import check_model_flags

    check_model_flags(GLM45_AIR_FLAGS, _hf_dir(tmp_path, "glm4_moe"))


@pytest.mark.parametrize(("model_type", "flags", "line"), [
    ("glm4_moe", dict(num_experts=160), r"^--num-experts 160 does not match the HF config in .* "
                                        r"\(num_experts = 128, i\.e\. --num-experts 128\)$"),
    ("glm4_moe", dict(rotary_percent=1.0), r"^--rotary-percent 1 does not match .*partial_rotary_factor = 0\.5"),
    ("qwen3_moe", dict(moe_router_score_function="sigmoid"), "--moe-router-score-function sigmoid does not match"),
    ("qwen3", dict(num_experts=8), r"^--num-experts 8 does not match the HF config in .* \(a model without MoE "
                                   r"layers\)$"),
])
def test_a_slime_moe_flag_that_disagrees_with_the_hf_config_fails_in_one_line(model_type, flags, line, tmp_path):
    from actors.megatron.model_flags import check_model_flags

    with pytest.raises(ValueError, match=line):
        check_model_flags(flags, _hf_dir(tmp_path, model_type))
