"""Rollout flags of slime's launch scripts: several eval sets, samples per eval prompt, the
context length, chat-template keyword arguments, reward key, plug-in settings and hook paths."""

from __future__ import annotations

import pytest

from slime_async.config.flags import ConfigError
from actors.loop.run_config import parse_run_config

REQUIRED = ["--prompt-data", "p.jsonl", "--hf-checkpoint", "model/"]


def rollout(*flags: str):
    return parse_run_config([*REQUIRED, *flags]).rollout


def test_eval_prompt_data_takes_name_path_pairs():
    config = rollout("--eval-prompt-data", "aime", "aime.jsonl", "gsm8k", "gsm8k.parquet")
    assert config.eval_sets() == {"aime": "aime.jsonl", "gsm8k": "gsm8k.parquet"}


def test_a_single_eval_path_is_the_unnamed_set_as_before(tmp_path):
    assert rollout("--eval-prompt-data", "heldout.jsonl").eval_sets() == {"": "heldout.jsonl"}
    path = tmp_path / "run.toml"
    path.write_text('[rollout]\neval_prompt_data = "heldout.jsonl"\n')
    assert parse_run_config([*REQUIRED, "--config", str(path)]).rollout.eval_sets() == {"": "heldout.jsonl"}


@pytest.mark.parametrize(("values", "message"), [
    (["a", "a.jsonl", "b"], "takes PATH or NAME PATH [NAME PATH ...], got 3 values"),
    (["a", "a.jsonl", "a", "b.jsonl"], "eval set name 'a' must be unique"),
    (["x/y", "a.jsonl"], "eval set name 'x/y' must be unique, non-empty and without '/'"),
])
def test_bad_eval_prompt_data_fails_at_start_with_one_line(values, message):
    with pytest.raises(ConfigError, match="--eval-prompt-data") as error:
        rollout("--eval-prompt-data", *values)
    assert message in str(error.value) and "\n" not in str(error.value)


def test_n_samples_per_eval_prompt_is_slimes_flag():
    assert rollout("--n-samples-per-eval-prompt", "16").n_samples_per_eval_prompt == 16
    with pytest.raises(ConfigError, match="--n-samples-per-eval-prompt must be > 0"):
        rollout("--n-samples-per-eval-prompt", "0")


def test_apply_chat_template_kwargs_is_a_json_object():
    config = rollout("--apply-chat-template", "--apply-chat-template-kwargs", '{"enable_thinking": false}')
    assert config.apply_chat_template_kwargs == {"enable_thinking": False}
    assert rollout().apply_chat_template_kwargs == {}


@pytest.mark.parametrize(("value", "message"), [
    ("{enable_thinking: false}", "is not JSON"),
    ("[1, 2]", "expected a JSON object, got list"),
])
def test_bad_apply_chat_template_kwargs_fail_naming_the_flag(value, message):
    with pytest.raises(ConfigError, match=f"--apply-chat-template-kwargs: .*{message}"):
        rollout("--apply-chat-template-kwargs", value)


def test_apply_chat_template_kwargs_may_be_a_table_in_a_config_file(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text("[rollout]\napply_chat_template_kwargs = {enable_thinking = false}\n")
    assert parse_run_config([*REQUIRED, "--config", str(path)]).rollout.apply_chat_template_kwargs == {
        "enable_thinking": False}


def test_rollout_max_context_len_is_accepted_and_checked():
    assert rollout("--rollout-max-context-len", "4096").rollout_max_context_len == 4096
    with pytest.raises(ConfigError, match="--rollout-max-context-len must be >= 2"):
        rollout("--rollout-max-context-len", "1")


def test_hook_paths_take_slimes_dotted_form():
    config = rollout("--custom-generate-function-path", "generate_with_search.generate",
                     "--custom-rm-path", "generate_with_search.reward_func", "--reward-key", "score")
    assert config.custom_rm_path == "generate_with_search.reward_func" and config.reward_key == "score"
    with pytest.raises(ConfigError, match="--custom-rm-path: expected package.module:function"):
        rollout("--custom-rm-path", "reward_func")


def test_custom_config_path_must_be_a_yaml_mapping(tmp_path):
    path = tmp_path / "plugin.yaml"
    path.write_text("- a list\n")
    with pytest.raises(ConfigError, match="--custom-config-path .*expected a mapping"):
        rollout("--custom-config-path", str(path))
    with pytest.raises(ConfigError, match="--custom-config-path .*no such file"):
        rollout("--custom-config-path", str(tmp_path / "missing.yaml"))
