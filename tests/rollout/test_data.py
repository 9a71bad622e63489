"""PromptDataset: loading JSONL/Parquet prompts, skipping bad rows, epoch order, resumable cursor."""

from __future__ import annotations

import copy
import json
import logging
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from tokenizers import Tokenizer, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from actors.rollout.data import Prompt, PromptDataset

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerFast:
    """A small byte-level BPE with a ChatML template: any text tokenizes, nothing is downloaded."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<|pad|>", "<|eos|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(["what is 1+2", "user assistant system hello"] * 10, trainer=trainer)
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|eos|>", pad_token="<|pad|>",
        additional_special_tokens=["<|im_start|>", "<|im_end|>"],
    )
    wrapped.chat_template = CHAT_TEMPLATE
    return wrapped


def write_jsonl(path: Path, rows: list[object]) -> Path:
    """Rows that are strings are written verbatim (to plant malformed lines)."""
    with path.open("w") as f:
        for row in rows:
            f.write((row if isinstance(row, str) else json.dumps(row)) + "\n")
    return path


def numbered_rows(n: int) -> list[dict]:
    return [{"prompt": f"question {i}", "label": str(i), "metadata": {"i": i}} for i in range(n)]


def drain(dataset: PromptDataset) -> list[tuple[int, int]]:
    out = []
    while (prompt := dataset.next_prompt()) is not None:
        out.append((prompt.epoch, prompt.index))
    return out


# ----- loading ---------------------------------------------------------------------------------
def test_jsonl_row_becomes_prompt_with_ids_label_and_metadata(tmp_path, tokenizer):
    path = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "what is 1+2", "label": "3", "metadata": {"src": "x"}}])
    prompt = PromptDataset(path, tokenizer).next_prompt()
    assert prompt == Prompt(
        index=0, epoch=0, prompt="what is 1+2",
        prompt_ids=tokenizer("what is 1+2", add_special_tokens=False)["input_ids"],
        label="3", metadata={"src": "x"},
    )


def test_custom_keys_select_input_label_and_metadata(tmp_path, tokenizer):
    path = write_jsonl(tmp_path / "d.jsonl", [{"q": "hello", "a": 7, "m": {"k": 1}}])
    prompt = PromptDataset(path, tokenizer, input_key="q", label_key="a", metadata_key="m").next_prompt()
    assert (prompt.prompt, prompt.label, prompt.metadata) == ("hello", 7, {"k": 1})


def test_missing_label_and_metadata_default_to_none_and_empty(tmp_path, tokenizer):
    prompt = PromptDataset(write_jsonl(tmp_path / "d.jsonl", [{"prompt": "hello"}]), tokenizer).next_prompt()
    assert (prompt.label, prompt.metadata) == (None, {})


def test_chat_template_wraps_a_string_as_one_user_message(tmp_path, tokenizer):
    path = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "hello"}])
    prompt = PromptDataset(path, tokenizer, apply_chat_template=True).next_prompt()
    text = "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n"
    assert prompt.prompt_ids == tokenizer(text, add_special_tokens=False)["input_ids"]
    assert prompt.prompt == "hello"


def test_chat_template_renders_a_message_list(tmp_path, tokenizer):
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello"}]
    path = write_jsonl(tmp_path / "d.jsonl", [{"prompt": messages}])
    prompt = PromptDataset(path, tokenizer, apply_chat_template=True).next_prompt()
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text.endswith("<|im_start|>assistant\n")
    assert prompt.prompt_ids == tokenizer(text, add_special_tokens=False)["input_ids"]
    assert prompt.prompt == messages


def test_parquet_rows_load_like_jsonl_rows(tmp_path, tokenizer):
    path = tmp_path / "d.parquet"
    pq.write_table(pa.Table.from_pylist(numbered_rows(3)), path)
    dataset = PromptDataset(path, tokenizer, shuffle=False)
    prompts = [dataset.next_prompt() for _ in range(3)]
    assert [(p.prompt, p.label, p.metadata) for p in prompts] == [
        (f"question {i}", str(i), {"i": i}) for i in range(3)
    ]


def test_parquet_metadata_stored_as_json_string_is_parsed(tmp_path, tokenizer):
    path = tmp_path / "d.parquet"
    pq.write_table(pa.Table.from_pylist([{"prompt": "hello", "metadata": '{"k": 2}'}]), path)
    assert PromptDataset(path, tokenizer).next_prompt().metadata == {"k": 2}


def test_unsupported_extension_is_an_error_naming_the_file(tmp_path, tokenizer):
    path = tmp_path / "d.csv"
    path.write_text("prompt\nhello\n")
    with pytest.raises(ValueError, match=r"d\.csv.*unsupported format"):
        PromptDataset(path, tokenizer)


# ----- bad rows --------------------------------------------------------------------------------
def test_malformed_rows_are_skipped_counted_and_logged_with_line_numbers(tmp_path, tokenizer, caplog):
    rows = [
        {"prompt": "good one"},           # line 1
        "{not json",                       # line 2: bad JSON
        {"question": "wrong key"},         # line 3: missing input key
        {"prompt": 42},                    # line 4: wrong type
        "[1, 2]",                          # line 5: not an object
        {"prompt": "x", "metadata": [1]},  # line 6: metadata not an object
        {"prompt": "good two"},            # line 7
    ]
    path = write_jsonl(tmp_path / "d.jsonl", rows)
    with caplog.at_level(logging.WARNING, logger="actors.rollout.data"):
        dataset = PromptDataset(path, tokenizer, shuffle=False)
    assert dataset.bad_rows == 5
    assert len(dataset) == 2
    assert [dataset.next_prompt().prompt for _ in range(2)] == ["good one", "good two"]
    skipped = [r.getMessage() for r in caplog.records if "skipped:" in r.getMessage()]
    assert [m.split(" skipped")[0].split()[-1] for m in skipped] == ["2", "3", "4", "5", "6"]
    assert all("d.jsonl" in m for m in skipped)


def test_blank_lines_are_not_rows(tmp_path, tokenizer):
    path = tmp_path / "d.jsonl"
    path.write_text('{"prompt": "a"}\n\n   \n{"prompt": "b"}\n')
    dataset = PromptDataset(path, tokenizer)
    assert (len(dataset), dataset.bad_rows) == (2, 0)


def test_a_line_that_is_not_utf8_is_a_bad_row(tmp_path, tokenizer):
    path = tmp_path / "d.jsonl"
    path.write_bytes(b'{"prompt": "a"}\n{"prompt": "\xff\xfe"}\n{"prompt": "b"}\n')
    dataset = PromptDataset(path, tokenizer, shuffle=False)
    assert (dataset.bad_rows, [p.prompt for p in dataset.all_prompts()]) == (1, ["a", "b"])


def test_message_list_without_chat_template_is_a_bad_row(tmp_path, tokenizer):
    path = write_jsonl(tmp_path / "d.jsonl", [{"prompt": [{"role": "user", "content": "hi"}]}, {"prompt": "ok"}])
    assert PromptDataset(path, tokenizer).bad_rows == 1


def test_malformed_messages_are_bad_rows_with_chat_template(tmp_path, tokenizer):
    rows = [{"prompt": [{"role": "user"}]}, {"prompt": []}, {"prompt": ["hi"]}, {"prompt": "ok"}]
    dataset = PromptDataset(write_jsonl(tmp_path / "d.jsonl", rows), tokenizer, apply_chat_template=True)
    assert (dataset.bad_rows, len(dataset)) == (3, 1)


def test_parquet_bad_rows_are_logged_with_their_row_index(tmp_path, tokenizer, caplog):
    path = tmp_path / "d.parquet"
    pq.write_table(pa.Table.from_pylist([{"prompt": "a"}, {"prompt": None}, {"prompt": "c"}]), path)
    with caplog.at_level(logging.WARNING, logger="actors.rollout.data"):
        dataset = PromptDataset(path, tokenizer)
    assert dataset.bad_rows == 1
    assert any("row 1 skipped" in r.getMessage() for r in caplog.records)


def test_all_rows_bad_is_a_value_error_naming_the_file(tmp_path, tokenizer):
    path = write_jsonl(tmp_path / "all_bad.jsonl", ["{oops", {"other": 1}])
    with pytest.raises(ValueError, match=r"all_bad\.jsonl.*none of its 2 rows"):
        PromptDataset(path, tokenizer)


# ----- iteration -------------------------------------------------------------------------------
def test_each_epoch_visits_every_row_once_then_returns_none(tmp_path, tokenizer):
    dataset = PromptDataset(write_jsonl(tmp_path / "d.jsonl", numbered_rows(5)), tokenizer, num_epoch=2)
    seen = drain(dataset)
    assert sorted(i for e, i in seen if e == 0) == list(range(5))
    assert sorted(i for e, i in seen if e == 1) == list(range(5))
    assert len(seen) == 10
    assert dataset.next_prompt() is None


def test_epoch_order_is_seeded_by_seed_plus_epoch(tmp_path, tokenizer):
    path = write_jsonl(tmp_path / "d.jsonl", numbered_rows(20))
    two_epochs = drain(PromptDataset(path, tokenizer, seed=7, num_epoch=2))
    second_epoch_alone = drain(PromptDataset(path, tokenizer, seed=8, num_epoch=1))
    assert [i for e, i in two_epochs if e == 1] == [i for _, i in second_epoch_alone]
    assert [i for e, i in two_epochs if e == 0] != [i for e, i in two_epochs if e == 1]


def test_same_seed_gives_same_order(tmp_path, tokenizer):
    path = write_jsonl(tmp_path / "d.jsonl", numbered_rows(20))
    assert drain(PromptDataset(path, tokenizer, seed=3)) == drain(PromptDataset(path, tokenizer, seed=3))


def test_without_shuffle_rows_come_in_file_order(tmp_path, tokenizer):
    dataset = PromptDataset(write_jsonl(tmp_path / "d.jsonl", numbered_rows(6)), tokenizer, shuffle=False)
    assert [i for _, i in drain(dataset)] == list(range(6))


def test_num_epoch_none_cycles_forever(tmp_path, tokenizer):
    dataset = PromptDataset(write_jsonl(tmp_path / "d.jsonl", numbered_rows(2)), tokenizer, num_epoch=None)
    epochs = [dataset.next_prompt().epoch for _ in range(7)]
    assert epochs == [0, 0, 1, 1, 2, 2, 3]


def test_all_prompts_lists_rows_in_file_order_without_moving_the_cursor(tmp_path, tokenizer):
    dataset = PromptDataset(write_jsonl(tmp_path / "d.jsonl", numbered_rows(4)), tokenizer, seed=1)
    first = dataset.next_prompt()
    assert [p.index for p in dataset.all_prompts()] == [0, 1, 2, 3]
    fresh = PromptDataset(write_jsonl(tmp_path / "e.jsonl", numbered_rows(4)), tokenizer, seed=1)
    assert [fresh.next_prompt().index for _ in range(2)] == [first.index, dataset.next_prompt().index]


def test_mutating_a_served_prompt_does_not_change_the_dataset(tmp_path, tokenizer):
    dataset = PromptDataset(write_jsonl(tmp_path / "d.jsonl", numbered_rows(1)), tokenizer, num_epoch=2)
    first = dataset.next_prompt()
    first.prompt_ids.append(999)
    first.metadata["i"] = -1
    second = dataset.next_prompt()
    assert 999 not in second.prompt_ids and second.metadata == {"i": 0}


# ----- resume ----------------------------------------------------------------------------------
@pytest.mark.parametrize("stop_after", [0, 3, 7, 10, 13, 15])
def test_resumed_cursor_neither_skips_nor_repeats(tmp_path, tokenizer, stop_after):
    """Stopping mid-epoch, at an epoch boundary, or at the very start: the union is one full run."""
    path = write_jsonl(tmp_path / "d.jsonl", numbered_rows(5))
    uninterrupted = drain(PromptDataset(path, tokenizer, seed=11, num_epoch=3))

    first = PromptDataset(path, tokenizer, seed=11, num_epoch=3)
    before = [(p.epoch, p.index) for p in (first.next_prompt() for _ in range(stop_after))]
    state = json.loads(json.dumps(first.state_dict()))  # a checkpoint survives serialization
    resumed = PromptDataset(path, tokenizer, seed=11, num_epoch=3)
    resumed.load_state_dict(state)
    assert before + drain(resumed) == uninterrupted


def test_resume_keeps_the_checkpoints_seed(tmp_path, tokenizer):
    path = write_jsonl(tmp_path / "d.jsonl", numbered_rows(8))
    uninterrupted = drain(PromptDataset(path, tokenizer, seed=5))
    first = PromptDataset(path, tokenizer, seed=5)
    before = [(p.epoch, p.index) for p in (first.next_prompt() for _ in range(3))]
    resumed = PromptDataset(path, tokenizer, seed=99)
    resumed.load_state_dict(first.state_dict())
    assert before + drain(resumed) == uninterrupted


def test_resume_on_changed_data_is_refused(tmp_path, tokenizer):
    state = PromptDataset(write_jsonl(tmp_path / "a.jsonl", numbered_rows(5)), tokenizer).state_dict()
    other = PromptDataset(write_jsonl(tmp_path / "b.jsonl", numbered_rows(6)), tokenizer)
    with pytest.raises(ValueError, match=r"b\.jsonl has 6 usable rows.*saved with 5"):
        other.load_state_dict(state)


def test_prompt_round_trips_through_a_dict(tmp_path, tokenizer):
    prompt = PromptDataset(write_jsonl(tmp_path / "d.jsonl", numbered_rows(1)), tokenizer).next_prompt()
    assert Prompt.from_dict(json.loads(json.dumps(prompt.to_dict()))) == prompt


# ----- slime's rollout flags ---------------------------------------------------------------------
def test_apply_chat_template_kwargs_reach_the_template(tmp_path, tokenizer):
    template = "{% if shout %}LOUD {% endif %}{{ messages[0]['content'] }}"
    tok = copy.copy(tokenizer)
    tok.chat_template = template
    path = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "hello"}])
    dataset = PromptDataset(path, tok, apply_chat_template=True, apply_chat_template_kwargs={"shout": True})
    assert dataset.next_prompt().prompt_ids == tok("LOUD hello", add_special_tokens=False)["input_ids"]


def test_a_prompt_that_fills_the_max_context_len_is_a_bad_row(tmp_path, tokenizer, caplog):
    long = "what is 1+2 " * 20
    path = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "hello"}, {"prompt": long}])
    with caplog.at_level(logging.WARNING):
        dataset = PromptDataset(path, tokenizer, max_context_len=8)
    assert len(dataset) == 1 and dataset.bad_rows == 1
    assert "line 2 skipped: the prompt has" in caplog.text and "--rollout-max-context-len 8" in caplog.text


def test_eval_datasets_are_named_by_the_eval_prompt_data_pairs(tmp_path, tokenizer):
    from actors.rollout.config import RolloutConfig
    from actors.rollout.data import eval_datasets

    a = write_jsonl(tmp_path / "a.jsonl", numbered_rows(2))
    b = write_jsonl(tmp_path / "b.jsonl", numbered_rows(3))
    sets = eval_datasets(RolloutConfig(eval_prompt_data=["a", str(a), "b", str(b)]), tokenizer)
    assert {name: len(dataset) for name, dataset in sets.items()} == {"a": 2, "b": 3}
    assert list(eval_datasets(RolloutConfig(eval_prompt_data=[str(a)]), tokenizer)) == [""]
    assert eval_datasets(RolloutConfig(), tokenizer) is None
