"""Tiny random-init models: loadable by transformers, with a usable local tokenizer."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from tokenizers import Tokenizer
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from examples.models.tiny import ARCHS, build_tiny_model, generate_corpus, main, train_tokenizer

CLASS_NAMES = {"qwen2": "Qwen2ForCausalLM", "llama": "LlamaForCausalLM", "qwen3": "Qwen3ForCausalLM",
               "qwen3_moe": "Qwen3MoeForCausalLM"}


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return {arch: build_tiny_model(tmp_path_factory.mktemp(arch), arch=arch) for arch in ARCHS}


@pytest.mark.parametrize("arch", ARCHS)
def test_model_loads_with_transformers_auto_classes_and_runs(model_dirs, arch):
    model = AutoModelForCausalLM.from_pretrained(model_dirs[arch])
    assert type(model).__name__ == CLASS_NAMES[arch]
    logits = model(torch.tensor([[1, 2, 3]])).logits
    assert logits.shape == (1, 3, 512)


@pytest.mark.parametrize("arch", ARCHS)
def test_weights_are_written_as_safetensors(model_dirs, arch):
    assert (model_dirs[arch] / "model.safetensors").is_file()


def test_digits_tokenize_as_single_characters(model_dirs):
    tokenizer = AutoTokenizer.from_pretrained(model_dirs["qwen2"])
    pieces = tokenizer.tokenize("12345+678=13023")
    assert [p for p in pieces if p.isdigit()] == list("12345678" + "13023")
    assert all(len(p) == 1 for p in pieces if any(c.isdigit() for c in p))


@pytest.mark.parametrize("arch", ARCHS)
def test_auto_tokenizer_encodes_exactly_like_tokenizer_json(model_dirs, arch):
    # transformers swaps in Qwen2's tokenizer class for qwen2 models; it must not change ids.
    auto = AutoTokenizer.from_pretrained(model_dirs[arch])
    raw = Tokenizer.from_file(str(model_dirs[arch] / "tokenizer.json"))
    texts = generate_corpus(seed=7, num_lines=200) + ["héllo  wörld\n\n 2024!!", "x=12345"]
    assert all(auto.encode(t, add_special_tokens=False) == raw.encode(t, add_special_tokens=False).ids for t in texts)


def test_tokenizer_round_trips_text(model_dirs):
    tokenizer = AutoTokenizer.from_pretrained(model_dirs["qwen2"])
    text = "What is 12 + 30? The answer is 42."
    assert tokenizer.decode(tokenizer.encode(text, add_special_tokens=False)) == text


def test_tokenizer_has_bos_eos_and_pad_tokens(model_dirs):
    tokenizer = AutoTokenizer.from_pretrained(model_dirs["qwen2"])
    ids = {tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id}
    assert None not in ids and len(ids) == 3


def test_chat_template_renders_turns_and_a_generation_prompt(model_dirs):
    tokenizer = AutoTokenizer.from_pretrained(model_dirs["qwen2"])
    messages = [{"role": "system", "content": "Solve it."}, {"role": "user", "content": "2+2?"}]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert text == "<|im_start|>system\nSolve it.<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n"


def test_generation_stops_on_eos_and_end_of_turn(model_dirs):
    tokenizer = AutoTokenizer.from_pretrained(model_dirs["qwen2"])
    model = AutoModelForCausalLM.from_pretrained(model_dirs["qwen2"])
    stops = set(model.generation_config.eos_token_id)
    assert stops == {tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|im_end|>")}


def test_vocabulary_of_the_model_covers_the_tokenizer(model_dirs):
    tokenizer = AutoTokenizer.from_pretrained(model_dirs["llama"])
    assert len(tokenizer) <= AutoConfig.from_pretrained(model_dirs["llama"]).vocab_size


@pytest.mark.parametrize("arch", ARCHS)
def test_grouped_query_attention_has_fewer_kv_heads(model_dirs, arch):
    weights = load_file(model_dirs[arch] / "model.safetensors")
    head_dim = 64 // 4
    assert weights["model.layers.0.self_attn.k_proj.weight"].shape == (2 * head_dim, 64)
    assert weights["model.layers.0.self_attn.q_proj.weight"].shape == (4 * head_dim, 64)


def test_qwen2_projections_have_qkv_bias(model_dirs):
    weights = load_file(model_dirs["qwen2"] / "model.safetensors")
    assert {"model.layers.0.self_attn.q_proj.bias", "model.layers.0.self_attn.v_proj.bias"} <= set(weights)


def test_qwen3_has_qk_norm_and_no_qkv_bias(model_dirs):
    weights = load_file(model_dirs["qwen3"] / "model.safetensors")
    assert {"model.layers.0.self_attn.q_norm.weight", "model.layers.0.self_attn.k_norm.weight"} <= set(weights)
    assert "model.layers.0.self_attn.q_proj.bias" not in weights


def test_same_seed_gives_identical_weights(tmp_path, model_dirs):
    again = load_file(build_tiny_model(tmp_path / "again", arch="qwen2") / "model.safetensors")
    first = load_file(model_dirs["qwen2"] / "model.safetensors")
    assert all(torch.equal(first[name], again[name]) for name in first)


def test_tied_embeddings_share_one_matrix(tmp_path):
    model = AutoModelForCausalLM.from_pretrained(build_tiny_model(tmp_path, tie_word_embeddings=True))
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()


def test_cli_writes_a_model_with_the_requested_shape(tmp_path):
    assert main(["--out", str(tmp_path), "--arch", "llama", "--hidden-size", "32", "--num-layers", "1"]) == 0
    config = AutoConfig.from_pretrained(tmp_path)
    assert (config.model_type, config.hidden_size, config.num_hidden_layers) == ("llama", 32, 1)


def test_cli_rejects_heads_that_do_not_divide_the_hidden_size(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--out", str(tmp_path), "--hidden-size", "64", "--num-attention-heads", "5"])
    assert exit_info.value.code == 2
    assert "--num-attention-heads" in capsys.readouterr().err


def test_corpus_option_trains_the_tokenizer_on_the_given_text(tmp_path):
    lines = ["<search>capital of Zorblax</search> <information>Quenti</information>"] * 200
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(lines))
    assert main(["--out", str(tmp_path / "m"), "--corpus", str(corpus)]) == 0
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "m")
    default = train_tokenizer(512, 0)
    text = "<search>capital of Zorblax</search>"
    # merges learned from the task's own text encode it in fewer tokens than the built-in corpus's
    assert len(tokenizer(text)["input_ids"]) < len(default(text)["input_ids"])
    assert tokenizer.decode(tokenizer(text)["input_ids"]) == text


def test_no_merges_makes_every_character_one_token(tmp_path):
    assert main(["--out", str(tmp_path / "m"), "--no-merges", "--vocab-size", "300"]) == 0
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "m")
    text = "Spell this word backward: neon <answer>noen</answer>"
    ids = tokenizer(text)["input_ids"]
    assert len(ids) == len(text)  # one token per (ASCII) character: letters reverse token by token
    assert tokenizer.decode(ids) == text


def test_no_merges_with_a_corpus_is_one_line_naming_both_flags(tmp_path, capsys):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("some text\n")
    with pytest.raises(SystemExit) as exit_info:
        main(["--out", str(tmp_path / "m"), "--no-merges", "--corpus", str(corpus)])
    assert exit_info.value.code == 2
    assert "--no-merges and --corpus" in capsys.readouterr().err


def test_unreadable_corpus_is_one_line_naming_the_flag(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--out", str(tmp_path / "m"), "--corpus", str(tmp_path / "missing.txt")])
    assert exit_info.value.code == 2
    assert "--corpus: cannot read" in capsys.readouterr().err


def test_the_tools_chat_template_renders_tools_and_hermes_tool_calls(tmp_path):
    path = build_tiny_model(tmp_path / "m", vocab_size=320, chat_template="tools")
    tokenizer = AutoTokenizer.from_pretrained(path)
    tool = {"type": "function", "function": {"name": "run_python", "parameters": {"type": "object"}}}
    call = {"type": "function", "function": {"name": "run_python", "arguments": {"code": "print(1)"}}}
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "", "tool_calls": [call]},
                {"role": "tool", "content": "1"}]
    text = tokenizer.apply_chat_template(messages, tools=[tool], tokenize=False)
    assert '# Tools\n<tools>\n{"type": "function"' in text
    assert ('<|im_start|>assistant\n<tool_call>\n{"name": "run_python", "arguments": {"code": "print(1)"}}\n'
            '</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n1\n</tool_response><|im_end|>\n') in text


def test_an_unknown_chat_template_name_is_refused(tmp_path):
    with pytest.raises(ValueError, match="--chat-template must be one of plain, tools"):
        build_tiny_model(tmp_path / "m", chat_template="fancy")
