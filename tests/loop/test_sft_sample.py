"""SFT samples (`actors.loop.sft.sft_sample`): a plain label trains whole; a segmented label
(a tool-use trace) trains only its model-written segments, tokenized as a hook appends them."""

import pytest

from actors.loop.sft import sft_sample
from actors.rollout.data import Prompt
from examples.models.tiny import train_tokenizer


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer(vocab_size=400, seed=0)


def ids(tokenizer, text):
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def test_a_plain_label_is_trained_whole_with_eos(tokenizer):
    prompt = Prompt(index=0, epoch=0, prompt="q", prompt_ids=[5, 6], label="42")
    sample = sft_sample(prompt, tokenizer, 3)
    assert sample.tokens == [5, 6, *ids(tokenizer, "42"), tokenizer.eos_token_id]
    assert sample.loss_mask == [1] * sample.response_length


def test_segments_marked_not_trained_get_loss_mask_0(tokenizer):
    label = [{"text": "<search>a b</search>", "train": True},
             {"text": "<information>a b is c</information>", "train": False},
             {"text": "<answer>c</answer>", "train": True}]
    prompt = Prompt(index=0, epoch=0, prompt="q", prompt_ids=[5], label=label)
    sample = sft_sample(prompt, tokenizer, 0)
    first, info, last = (ids(tokenizer, s["text"]) for s in label)
    assert sample.tokens == [5, *first, *info, *last, tokenizer.eos_token_id]
    assert sample.loss_mask == [1] * len(first) + [0] * len(info) + [1] * (len(last) + 1)
    sample.check()


def test_a_malformed_segment_names_the_row_and_segment(tokenizer):
    prompt = Prompt(index=7, epoch=0, prompt="q", prompt_ids=[5], label=[{"text": "x", "train": True}, {"text": "y"}])
    with pytest.raises(ValueError, match="SFT row 7: label segment 1 must be"):
        sft_sample(prompt, tokenizer, 0)
