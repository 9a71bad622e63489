"""A row without its label is a bad row (counted, logged with its line number) when the reward
needs labels — the built-in --rm-type rewards and SFT — and a normal row for a custom reward."""

from __future__ import annotations

import logging

from actors.rollout.config import RolloutConfig
from actors.rollout.data import PromptDataset, prompt_dataset
from test_data import tokenizer, write_jsonl  # noqa: F401 - the module's tokenizer fixture

ROWS = [{"prompt": "what is 1+2", "label": "3"}, {"prompt": "hello"}, {"prompt": "user", "label": None},
        {"prompt": "system", "label": "4"}]


def test_a_row_without_a_label_is_a_bad_row_with_its_line_number(tmp_path, tokenizer, caplog):  # noqa: F811
    path = write_jsonl(tmp_path / "d.jsonl", ROWS)
    with caplog.at_level(logging.WARNING):
        dataset = PromptDataset(path, tokenizer, require_label=True, shuffle=False)
    assert len(dataset) == 2 and dataset.bad_rows == 2
    assert [p.label for p in dataset.all_prompts()] == ["3", "4"]
    assert "line 2 skipped: missing label key 'label'" in caplog.text
    assert "line 3 skipped: missing label key 'label'" in caplog.text


def test_built_in_rewards_need_labels(tmp_path, tokenizer):  # noqa: F811
    path = write_jsonl(tmp_path / "d.jsonl", ROWS)
    dataset = prompt_dataset(RolloutConfig(rm_type="exact"), path, tokenizer, shuffle=False, num_epoch=1)
    assert dataset.bad_rows == 2


def test_a_custom_reward_gets_rows_without_labels(tmp_path, tokenizer):  # noqa: F811
    path = write_jsonl(tmp_path / "d.jsonl", ROWS)
    config = RolloutConfig(custom_rm_path="my_rewards:rm", label_key="label")
    dataset = prompt_dataset(config, path, tokenizer, shuffle=False, num_epoch=1)
    assert dataset.bad_rows == 0 and [p.label for p in dataset.all_prompts()] == ["3", None, None, "4"]


def test_a_falsy_label_is_still_a_label(tmp_path, tokenizer):  # noqa: F811
    path = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "hello", "label": 0}, {"prompt": "user", "label": ""}])
    assert PromptDataset(path, tokenizer, require_label=True).bad_rows == 0
