"""The converted SmolLM2 checkpoint as users get it from examples.models.pretrained."""

import json

import pytest
from transformers import AutoConfig, AutoTokenizer

pytestmark = pytest.mark.realmodel


def test_the_tokenizer_ends_turns_with_im_end_as_the_model_does(smollm2_dir):
    # The GGUF metadata says <|im_start|> (id 1); the model's config and its chat turns say 2.
    tokenizer = AutoTokenizer.from_pretrained(str(smollm2_dir))
    assert tokenizer.eos_token == "<|im_end|>"
    assert tokenizer.eos_token_id == AutoConfig.from_pretrained(str(smollm2_dir)).eos_token_id == 2
    assert tokenizer.pad_token_id == 2


def test_the_checkpoint_is_the_135m_llama_with_tied_embeddings(smollm2_dir):
    config = json.loads((smollm2_dir / "config.json").read_text())
    assert (config["model_type"], config["num_hidden_layers"], config["hidden_size"]) == ("llama", 30, 576)
    assert (config["num_attention_heads"], config["num_key_value_heads"], config["vocab_size"]) == (9, 3, 49152)
    assert config["tie_word_embeddings"] is True
    assert "_model_name_or_path" not in config
