"""HF config -> Megatron TransformerConfig / GPTModel arguments (no processes, no weights)."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, Qwen2Config, Qwen3Config

from actors.megatron.bridge import (gpt_model_args_from_hf, hf_config_if_readable, padded_vocab_size,
                                    transformer_config_from_hf)

SMALL = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)


def test_qwen3_maps_head_dim_gqa_qk_norm_and_no_qkv_bias():
    config = transformer_config_from_hf(Qwen3Config(head_dim=32, rms_norm_eps=1e-5, **SMALL))
    assert (config.num_attention_heads, config.num_query_groups, config.kv_channels) == (4, 2, 32)
    assert config.qk_layernorm and not config.add_qkv_bias
    assert config.gated_linear_unit and not config.add_bias_linear
    assert config.normalization == "RMSNorm" and config.layernorm_epsilon == 1e-5
    assert config.ffn_hidden_size == 96


def test_qwen2_has_qkv_bias_and_llama_attention_bias_is_refused():
    assert transformer_config_from_hf(Qwen2Config(**SMALL)).add_qkv_bias
    assert not transformer_config_from_hf(LlamaConfig(**SMALL)).add_qkv_bias
    # Llama's attention_bias also biases o_proj, which the local spec cannot map alone.
    with pytest.raises(ValueError, match="attention_bias=True"):
        transformer_config_from_hf(LlamaConfig(attention_bias=True, **SMALL))


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU defaults")
def test_cpu_defaults_are_fp32_with_cpu_initialisation():
    config = transformer_config_from_hf(LlamaConfig(**SMALL))
    assert config.params_dtype == torch.float32 and not config.bf16
    assert config.use_cpu_initialization


def test_overrides_replace_derived_fields_and_bf16_sets_the_param_dtype():
    config = transformer_config_from_hf(
        LlamaConfig(**SMALL), bf16=True, recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1
    )
    assert config.bf16 and config.params_dtype == torch.bfloat16
    assert config.recompute_granularity == "full"


def test_gpt_model_args_take_rope_theta_tying_and_pad_the_vocab_to_tp():
    hf = Qwen2Config(vocab_size=127, tie_word_embeddings=True, max_position_embeddings=256,
                     rope_parameters={"rope_type": "default", "rope_theta": 1e6}, **SMALL)
    args = gpt_model_args_from_hf(hf, tensor_parallel_size=2)
    assert (args.vocab_size, args.hf_vocab_size) == (128, 127)
    assert args.rotary_base == 1e6 and args.share_embeddings_and_output_weights
    assert args.max_sequence_length == 256
    assert padded_vocab_size(128, 4) == 128 and padded_vocab_size(129, 4) == 132


def test_unsupported_model_type_is_rejected_by_name():
    from transformers import GPT2Config

    with pytest.raises(ValueError, match="'gpt2' is not supported"):
        transformer_config_from_hf(GPT2Config())


def test_unsupported_rope_scaling_is_rejected_rather_than_silently_ignored():
    hf = LlamaConfig(rope_parameters={"rope_type": "yarn", "rope_theta": 5e5, "factor": 4.0,
                                      "original_max_position_embeddings": 8192}, **SMALL)
    with pytest.raises(ValueError, match="rope_type 'yarn'"):
        transformer_config_from_hf(hf)


def test_a_checkpoint_path_that_is_no_directory_is_never_looked_up_on_the_hub(monkeypatch):
    # The start-time layout checks read the config before the preflight names a missing directory:
    # a Hub lookup there cost ~25 s of retries on a machine with no network.
    import huggingface_hub.file_download as hub

    lookups = []
    monkeypatch.setattr(hub, "get_hf_file_metadata", lambda *args, **kwargs: lookups.append(args) or 1 / 0)
    assert hf_config_if_readable("m") is None
    assert hf_config_if_readable("some-org/some-model") is None
    assert lookups == []
