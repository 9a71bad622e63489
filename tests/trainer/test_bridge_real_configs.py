"""The bridge on the config fields real Llama 3.1 / 3.2, Qwen2.5 and Qwen3 checkpoints carry.

RoPE scaling (llama3, linear), Qwen's sliding-window fields with the window off, layer_types,
token-id lists, dtype and tying are accepted and give HF logit parity at TP=1 and 2; fields
that would change the numerics and are not mapped are refused by name. The same launches check
the parity of conftest's tiny archs (every arch the bridge maps, both attentions).
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from actors.megatron.bridge import gpt_model_args_from_hf, rope_inv_freq, transformer_config_from_hf
from conftest import TINY_CONFIGS, run_torchrun

# config.json of the hub checkpoints as published (weights not needed: only the config is read).
HUB_CONFIGS: dict[str, dict] = {
    "meta-llama/Llama-3.2-1B-Instruct": {
        "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
        "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009], "head_dim": 64,
        "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 8192,
        "max_position_embeddings": 131072, "mlp_bias": False, "model_type": "llama",
        "num_attention_heads": 32, "num_hidden_layers": 16, "num_key_value_heads": 8, "pretraining_tp": 1,
        "rms_norm_eps": 1e-05,
        "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                         "original_max_position_embeddings": 8192, "rope_type": "llama3"},
        "rope_theta": 500000.0, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
        "transformers_version": "4.45.0.dev0", "use_cache": True, "vocab_size": 128256,
    },
    "meta-llama/Llama-3.1-8B": {
        "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
        "bos_token_id": 128000, "eos_token_id": 128001, "hidden_act": "silu", "hidden_size": 4096,
        "initializer_range": 0.02, "intermediate_size": 14336, "max_position_embeddings": 131072,
        "mlp_bias": False, "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 32,
        "num_key_value_heads": 8, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
        "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 8192, "rope_type": "llama3"},
        "rope_theta": 500000.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        "transformers_version": "4.43.0.dev0", "use_cache": True, "vocab_size": 128256,
    },
    "Qwen/Qwen2.5-0.5B-Instruct": {
        "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
        "eos_token_id": 151645, "hidden_act": "silu", "hidden_size": 896, "initializer_range": 0.02,
        "intermediate_size": 4864, "max_position_embeddings": 32768, "max_window_layers": 21,
        "model_type": "qwen2", "num_attention_heads": 14, "num_hidden_layers": 24, "num_key_value_heads": 2,
        "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "sliding_window": 32768, "tie_word_embeddings": True,
        "torch_dtype": "bfloat16", "transformers_version": "4.43.1", "use_cache": True,
        "use_sliding_window": False, "vocab_size": 151936,
    },
    "Qwen/Qwen3-0.6B": {
        "architectures": ["Qwen3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
        "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
        "hidden_size": 1024, "initializer_range": 0.02, "intermediate_size": 3072,
        "max_position_embeddings": 40960, "max_window_layers": 28, "model_type": "qwen3",
        "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 8, "rms_norm_eps": 1e-06,
        "rope_scaling": None, "rope_theta": 1000000, "sliding_window": None, "tie_word_embeddings": True,
        "torch_dtype": "bfloat16", "transformers_version": "4.51.0", "use_cache": True,
        "use_sliding_window": False, "vocab_size": 151936,
    },
}

# hub name -> (head_dim, rope_theta, tied embeddings) the bridge must derive.
EXPECTED = {
    "meta-llama/Llama-3.2-1B-Instruct": (64, 500000.0, True),
    "meta-llama/Llama-3.1-8B": (128, 500000.0, False),
    "Qwen/Qwen2.5-0.5B-Instruct": (64, 1e6, True),
    "Qwen/Qwen3-0.6B": (128, 1e6, True),
}

TINY_SIZES = dict(
    hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
    max_position_embeddings=256, vocab_size=128, bos_token_id=1, eos_token_id=2,
)
# llama3 scaling with an original length of 8 positions: hf_logit_parity.py's 12-token sequence
# runs past it, and with head_dim 16 some frequencies are interpolated, the others divided by factor.
SHORT_LLAMA3 = {"low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8,
                "rope_type": "llama3"}

# name -> (config.json, whether it stays in the hub's spelling or as transformers 5 saves it).
TINY_CHECKPOINTS: dict[str, tuple[dict, bool]] = {
    "llama3.1": ({**HUB_CONFIGS["meta-llama/Llama-3.1-8B"], **TINY_SIZES,
                  "rope_scaling": {**SHORT_LLAMA3, "factor": 8.0}}, True),
    # transformers 5 writes rope_parameters instead of rope_scaling / rope_theta.
    "llama3.2": ({**HUB_CONFIGS["meta-llama/Llama-3.2-1B-Instruct"], **TINY_SIZES, "head_dim": 16,
                  "eos_token_id": [2, 3, 4], "rope_scaling": {**SHORT_LLAMA3, "factor": 32.0}}, False),
    # Llama-2-era long-context fine-tunes spell it with the legacy key "type".
    "llama-linear": ({**HUB_CONFIGS["meta-llama/Llama-3.1-8B"], **TINY_SIZES,
                      "rope_scaling": {"type": "linear", "factor": 4.0}}, True),
    # A window shorter than the sequence on the second layer, were use_sliding_window true;
    # vocab 127 is padded at TP=2.
    "qwen2.5": ({**HUB_CONFIGS["Qwen/Qwen2.5-0.5B-Instruct"], **TINY_SIZES, "vocab_size": 127,
                 "sliding_window": 4, "max_window_layers": 1}, True),
    "qwen3": ({**HUB_CONFIGS["Qwen/Qwen3-0.6B"], **TINY_SIZES, "head_dim": 32, "max_window_layers": 2,
               "eos_token_id": [2, 3]}, False),
}
SCALED = ("llama3.1", "llama3.2", "llama-linear")
ATTENTIONS = ("unfused", "sdpa")


def _write_config(out_dir: Path, config_json: dict) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "config.json").write_text(json.dumps(config_json))
    return out_dir


def _write_checkpoint(out_dir: Path, config_json: dict, hub_spelling: bool) -> Path:
    _write_config(out_dir, config_json)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(out_dir), dtype=torch.float32)
    # As conftest.build_tiny_hf_model: large random weights, so that logits are far from flat
    # and every mapping (and the RoPE frequencies) shows in the parity check.
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.copy_(1.0 + 0.1 * torch.randn_like(param))
            else:
                param.normal_(0.0, 0.2)
    model.save_pretrained(out_dir)
    if hub_spelling:  # save_pretrained rewrote config.json in transformers 5's spelling
        _write_config(out_dir, config_json)
    return out_dir


@pytest.fixture(scope="module")
def tiny_dirs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("real_configs")
    return {name: _write_checkpoint(root / name, *spec) for name, spec in TINY_CHECKPOINTS.items()}


def _parity_tokens() -> torch.Tensor:
    # The tokens tests/trainer/scripts/hf_logit_parity.py feeds both models.
    return torch.randint(0, 120, (2, 12), generator=torch.Generator().manual_seed(0))


# --------------------------------------------------------------------------------------------
# Real hub configs (no weights)
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("hub_name", sorted(HUB_CONFIGS))
def test_hub_config_is_accepted_with_its_head_dim_rope_theta_and_tying(hub_name, tmp_path):
    hf_dir = _write_config(tmp_path, HUB_CONFIGS[hub_name])
    head_dim, rope_theta, tied = EXPECTED[hub_name]
    config = transformer_config_from_hf(hf_dir)
    args = gpt_model_args_from_hf(hf_dir, tensor_parallel_size=1)
    assert config.kv_channels == head_dim
    assert args.rotary_base == rope_theta
    assert args.share_embeddings_and_output_weights == tied
    assert args.max_sequence_length == HUB_CONFIGS[hub_name]["max_position_embeddings"]


def _hf_rotary_inv_freq(hf_config) -> torch.Tensor:
    model_type = hf_config.model_type
    module = importlib.import_module(f"transformers.models.{model_type}.modeling_{model_type}")
    cls = getattr(module, {"llama": "Llama", "qwen2": "Qwen2", "qwen3": "Qwen3"}[model_type] + "RotaryEmbedding")
    return cls(hf_config).inv_freq


@pytest.mark.parametrize("hub_name", sorted(HUB_CONFIGS))
def test_rope_frequencies_equal_the_hf_rotary_embedding_bit_exactly(hub_name, tmp_path):
    hf_config = AutoConfig.from_pretrained(_write_config(tmp_path, HUB_CONFIGS[hub_name]))
    assert torch.equal(rope_inv_freq(hf_config), _hf_rotary_inv_freq(hf_config))


@pytest.mark.parametrize("name", SCALED)
def test_scaled_rope_frequencies_equal_hf_and_differ_from_unscaled_ones(name, tmp_path):
    hf_config = AutoConfig.from_pretrained(_write_config(tmp_path, TINY_CHECKPOINTS[name][0]))
    ours = rope_inv_freq(hf_config)
    assert torch.equal(ours, _hf_rotary_inv_freq(hf_config))
    head_dim, theta = 16, hf_config.rope_parameters["rope_theta"]
    unscaled = 1.0 / (theta ** (torch.arange(0, head_dim, 2).float() / head_dim))
    assert not torch.allclose(ours, unscaled)


def test_llama3_frequencies_equal_megatrons_own_scaling_for_llama31_constants(tmp_path):
    from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding

    hf_config = AutoConfig.from_pretrained(_write_config(tmp_path, HUB_CONFIGS["meta-llama/Llama-3.1-8B"]))
    megatron = RotaryEmbedding(128, 1.0, rotary_base=500000.0, rope_scaling=True, rope_scaling_factor=8.0,
                               use_cpu_initialization=True)
    assert torch.equal(rope_inv_freq(hf_config), megatron.inv_freq)


# --------------------------------------------------------------------------------------------
# Logit parity on tiny checkpoints with the real fields
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module", params=[1, 2], ids=lambda tp: f"tp{tp}")
def parity(request, tiny_dirs, tiny_hf_dirs, tmp_path_factory) -> dict:
    """Logit comparisons for every tiny checkpoint here and every conftest tiny arch ("arch:NAME"),
    both attentions, at one TP size: one torchrun launch for both sets (its start-up is most of it)."""
    out = tmp_path_factory.mktemp("parity") / "parity.json"
    models = [f"--model={name}={path}" for name, path in tiny_dirs.items()]
    models += [f"--model=arch:{arch}={path}" for arch, path in tiny_hf_dirs.items()]
    run_torchrun("hf_logit_parity.py", request.param, *models, f"--out={out}", timeout=300)
    return json.loads(out.read_text())


def assert_parity(result: dict) -> None:
    assert result["shape"] == result["expected_shape"]
    # Random weights are drawn large, so logits are far from flat and a mapping error shows.
    assert result["logit_std"] > 0.5
    assert result["max_abs_diff"] < 1e-5, f"max |Δ| = {result['max_abs_diff']:.3g} ({result})"


@pytest.mark.timeout(330)
@pytest.mark.parametrize("attention", ATTENTIONS)
@pytest.mark.parametrize("arch", sorted(TINY_CONFIGS))
def test_megatron_logits_of_every_tiny_arch_equal_transformers_within_1e_5(parity, arch, attention):
    assert_parity(parity[f"arch:{arch}/{attention}"])


@pytest.mark.timeout(330)
@pytest.mark.parametrize("attention", ATTENTIONS)
@pytest.mark.parametrize("name", sorted(TINY_CHECKPOINTS))
def test_megatron_logits_equal_transformers_within_1e_5(parity, name, attention):
    assert_parity(parity[f"{name}/{attention}"])


@pytest.mark.parametrize("name", SCALED)
def test_rope_scaling_changes_the_parity_sequences_logits_far_beyond_the_tolerance(name, tiny_dirs):
    # Megatron's unscaled RoPE equals HF's (the tiny archs' parity above), so a bridge that ignored the
    # scaling would miss the parity above by this much.
    scaled = AutoModelForCausalLM.from_pretrained(tiny_dirs[name], dtype=torch.float32, attn_implementation="eager")
    config = AutoConfig.from_pretrained(tiny_dirs[name])
    config.rope_parameters = {"rope_type": "default", "rope_theta": config.rope_parameters["rope_theta"]}
    unscaled = AutoModelForCausalLM.from_pretrained(
        tiny_dirs[name], config=config, dtype=torch.float32, attn_implementation="eager"
    )
    tokens = _parity_tokens()
    with torch.no_grad():
        diff = (scaled.eval()(tokens).logits - unscaled.eval()(tokens).logits).abs().max().item()
    assert diff > 0.1, diff


# --------------------------------------------------------------------------------------------
# Refused fields
# --------------------------------------------------------------------------------------------

SMALL = {k: v for k, v in TINY_SIZES.items() if k in ("hidden_size", "intermediate_size", "num_hidden_layers",
                                                       "num_attention_heads", "num_key_value_heads")}
REFUSED = {
    # Qwen2.5's documented long-context setting.
    "yarn": (("qwen2", dict(rope_scaling={"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768},
                            max_position_embeddings=131072)),
             r"^rope_type 'yarn' is not supported by the bridge \(supported: default, linear, llama3\)$"),
    "dynamic": (("llama", dict(rope_scaling={"rope_type": "dynamic", "factor": 2.0})),
                r"^rope_type 'dynamic' is not supported by the bridge \(supported: default, linear, llama3\)$"),
    "partial_rotary_factor": (("llama", dict(partial_rotary_factor=0.5)), "partial_rotary_factor=0.5"),
    "attention_bias": (("llama", dict(attention_bias=True)), "attention_bias=True"),
    "qwen3_attention_bias": (("qwen3", dict(attention_bias=True)), "attention_bias=True"),
    "mlp_bias": (("llama", dict(mlp_bias=True)), "mlp_bias=True"),
    "use_sliding_window": (("qwen2", dict(use_sliding_window=True, sliding_window=4)), "use_sliding_window=True"),
    "layer_types": (("qwen3", dict(layer_types=["full_attention", "sliding_attention"])),
                    r"layer_types \['sliding_attention'\]"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_unmapped_numerics_fields_are_refused_in_one_line_naming_the_field(case):
    (model_type, fields), message = REFUSED[case]
    hf_config = AutoConfig.for_model(model_type, **SMALL, **fields)
    with pytest.raises(ValueError, match=message) as err:
        transformer_config_from_hf(hf_config)
    assert "\n" not in str(err.value)
