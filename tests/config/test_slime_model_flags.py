"""slime launch scripts' Megatron-LM model flags and KL flags are accepted; the model flags are
checked against the HF config (which alone defines the model) and a mismatch fails at start
with one line naming the flag and both values."""

from __future__ import annotations

import pytest
from transformers import Qwen2Config, Qwen3Config

from actors.megatron.options import split_megatron_overrides
from slime_async.config.flags import ConfigError
from actors.loop.run_config import parse_run_config

SHAPE = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, vocab_size=512, max_position_embeddings=1024, rms_norm_eps=1e-6,
             rope_parameters={"rope_type": "default", "rope_theta": 1e6}, tie_word_embeddings=True)

# Megatron-LM's description of SHAPE as Qwen2 (a slime scripts/models/*.sh block).
QWEN2_MODEL_ARGS = [
    "--swiglu", "--num-layers", "2", "--hidden-size", "64", "--ffn-hidden-size", "128",
    "--num-attention-heads", "4", "--group-query-attention", "--num-query-groups", "2",
    "--use-rotary-position-embeddings", "--disable-bias-linear", "--add-qkv-bias", "--normalization", "RMSNorm",
    "--norm-epsilon", "1e-6", "--rotary-base", "1000000", "--vocab-size", "512", "--kv-channels", "16",
    "--max-position-embeddings", "1024", "--seq-length", "512", "--position-embedding-type", "rope",
]


@pytest.fixture(scope="module")
def qwen2(tmp_path_factory):
    path = tmp_path_factory.mktemp("qwen2")
    Qwen2Config(**SHAPE).save_pretrained(path)
    return str(path)


def run_config(model: str, *flags: str):
    return parse_run_config(["--prompt-data", "p.jsonl", "--hf-checkpoint", model, *flags])


def test_a_slime_model_block_that_matches_the_hf_config_is_accepted(qwen2):
    config = run_config(qwen2, *QWEN2_MODEL_ARGS)
    sections = split_megatron_overrides(config.trainer.megatron)
    # Megatron-LM-only flags are checked, then kept out of the TransformerConfig.
    assert sections.model["rotary_base"] == 1e6 and sections.model["swiglu"] is True
    assert "rotary_base" not in sections.transformer and sections.transformer["num_layers"] == 2


@pytest.mark.parametrize(("flags", "line"), [
    (["--num-layers", "36"], "--num-layers 36 does not match the HF config in {m} "
                             "(num_hidden_layers = 2, i.e. --num-layers 2)"),
    (["--num-query-groups", "8"], "--num-query-groups 8 does not match the HF config in {m} "
                                  "(num_key_value_heads = 2, i.e. --num-query-groups 2)"),
    (["--rotary-base", "10000"], "--rotary-base 10000 does not match the HF config in {m} "
                                 "(rope_theta = 1e+06, i.e. --rotary-base 1e+06)"),
    (["--norm-epsilon", "1e-5"], "--norm-epsilon 1e-05 does not match the HF config in {m} "
                                 "(rms_norm_eps = 1e-06, i.e. --norm-epsilon 1e-06)"),
    (["--qk-layernorm"], "--qk-layernorm does not match the HF config in {m} "
                         "(model_type = 'qwen2' has no q/k norms, i.e. --no-qk-layernorm)"),
    (["--untie-embeddings-and-output-weights"], "--untie-embeddings-and-output-weights does not match the HF "
                                                "config in {m} (tie_word_embeddings = True, i.e. "
                                                "--no-untie-embeddings-and-output-weights)"),
    (["--vocab-size", "151936"], "--vocab-size 151936 does not match the HF config in {m} "
                                 "(vocab_size = 512, i.e. --vocab-size 512)"),
    (["--seq-length", "4096"], "--seq-length 4096 does not match the HF config in {m} "
                               "(max_position_embeddings = 1024, at most --seq-length 1024)"),
    (["--no-group-query-attention"], "--no-group-query-attention does not match the HF config in {m}"),
    (["--position-embedding-type", "learned_absolute"], "--position-embedding-type learned_absolute does not match"),
])
def test_a_model_flag_that_disagrees_with_the_hf_config_fails_with_one_line(qwen2, flags, line):
    with pytest.raises(ConfigError) as error:
        run_config(qwen2, *flags)
    message = str(error.value)
    assert "\n" not in message and line.format(m=qwen2) in message


def test_qwen3_needs_qk_layernorm_and_no_qkv_bias(tmp_path):
    Qwen3Config(head_dim=32, **SHAPE).save_pretrained(tmp_path)
    run_config(str(tmp_path), "--qk-layernorm", "--kv-channels", "32")
    with pytest.raises(ConfigError, match="--add-qkv-bias does not match"):
        run_config(str(tmp_path), "--add-qkv-bias")


def test_model_flags_with_an_unreadable_hf_config_fail_naming_the_checkpoint(tmp_path):
    with pytest.raises(ConfigError, match=r"--hf-checkpoint .*missing: cannot read the HF config to check the "
                                          r"model flags --num-layers 2"):
        run_config(str(tmp_path / "missing"), "--num-layers", "2")


def test_without_model_flags_the_hf_config_is_not_read(tmp_path):
    run_config(str(tmp_path / "not-there-yet"))  # the trainer reads it later; the config alone is fine


def test_a_kl_loss_with_coefficient_zero_is_accepted(qwen2):
    config = run_config(qwen2, "--use-kl-loss", "--kl-loss-coef", "0.0", "--kl-loss-type", "low_var_kl")
    assert config.algorithm.use_kl_loss and config.algorithm.kl_loss_coef == 0.0


@pytest.mark.parametrize("flags, expected", [
    (["--moe-aux-loss-coeff", "0.001"], 0.001),  # one value: megatron-core's float, as a lone routing type needs
    (["--moe-aux-loss-coeff", "0.001", "0.01"], [0.001, 0.01]),  # one per routing type
    (["--moe-router-load-balancing-type", "seq_aux_loss"], "seq_aux_loss"),
])
def test_a_float_or_list_megatron_field_given_one_value_stays_a_scalar(qwen2, flags, expected):
    config = run_config(qwen2, *flags)
    assert config.trainer.megatron[flags[0][2:].replace("-", "_")] == expected


def test_a_float_or_list_megatron_field_from_a_config_file_stays_a_scalar(qwen2, tmp_path):
    path = tmp_path / "moe.toml"
    path.write_text("[megatron]\nmoe_aux_loss_coeff = 0.0\n")
    assert run_config(qwen2, "--config", str(path)).trainer.megatron["moe_aux_loss_coeff"] == 0.0


def test_a_list_only_field_given_one_value_stays_a_list():
    # Optional[list[str]] is a union too, but admits no scalar: one path must not become a string.
    from slime_async.config.flags import convert_value, flag_type
    assert convert_value(flag_type(list[str] | None), ["held.jsonl"], "--eval-prompt-data") == ["held.jsonl"]
    assert convert_value(flag_type(float | list[float]), ["0.5"], "--moe-aux-loss-coeff") == 0.5
