"""slime's ``args``: built once from the typed config, slime's attribute names, read-only."""

from __future__ import annotations

import argparse

import pytest

from actors.rollout.config import RolloutConfig
from actors.rollout.slime_plugins import SlimePlugins
from slime_async.compat.slime.args import SlimeArgs, flatten_config
from slime_async.compat.slime.rollout.sglang_rollout import GenerateState, get_model_url
from slime_async.compat.slime.rollout.rm_hub import async_rm
from actors.loop.run_config import parse_run_config
from slime_async.sample import Sample


class Ctx:
    def __init__(self, tokenizer=None, router_url="http://127.0.0.1:31234"):
        self.tokenizer = tokenizer
        self.router_url = router_url


def test_args_carry_the_whole_run_config_under_slimes_names(tokenizer):
    config = parse_run_config(["--prompt-data", "p.jsonl", "--hf-checkpoint", "/models/m",
                               "--rollout-max-response-len", "96", "--tensor-model-parallel-size", "2",
                               "--max-tokens-per-gpu", "9216", "--sglang-mem-fraction-static", "0.7"])
    args = SlimePlugins(config.rollout, Ctx(tokenizer), flatten_config(config)).args
    assert (args.sglang_router_ip, args.sglang_router_port) == ("127.0.0.1", 31234)
    assert args.hf_checkpoint == "/models/m" and args.rollout_max_response_len == 96
    assert args.tensor_model_parallel_size == 2 and args.max_tokens_per_gpu == 9216
    # Text without sglang installed (forwarded raw), typed with it.
    assert float(args.sglang_mem_fraction_static) == 0.7 and args.context_parallel_size == 1
    assert args.partial_rollout is False and args.n_samples_per_prompt == 4
    assert args.rollout_max_context_len is None and args.apply_chat_template is False


def test_without_the_run_config_args_come_from_the_rollout_section_and_the_tokenizer(tokenizer):
    args = SlimePlugins(RolloutConfig(rollout_temperature=0.7), Ctx(tokenizer)).args
    assert args.rollout_temperature == 0.7 and args.hf_checkpoint == tokenizer.name_or_path


def test_args_are_read_only_and_an_unknown_name_says_so():
    args = SlimeArgs({"rollout_temperature": 1.0})
    with pytest.raises(AttributeError, match="args is read-only"):
        args.rollout_temperature = 0.5
    with pytest.raises(AttributeError, match="args.rollout_temprature: .*did you mean rollout_temperature"):
        args.rollout_temprature
    assert getattr(args, "use_wandb", False) is False  # slime's getattr-with-default idiom works


def test_router_address_missing_is_explained_when_read():
    args = SlimePlugins(RolloutConfig(), Ctx(router_url=None)).args
    with pytest.raises(AttributeError, match="args.sglang_router_ip: this run has no router HTTP front"):
        args.sglang_router_ip


def test_custom_config_path_adds_settings_for_plugins(tmp_path):
    path = tmp_path / "plugin.yaml"
    path.write_text("max_turns: 5\nsearch_url: http://127.0.0.1:8000/retrieve\n")
    args = SlimePlugins(RolloutConfig(custom_config_path=str(path)), Ctx()).args
    assert args.max_turns == 5 and args.search_url.endswith("/retrieve")


def test_generate_state_gives_the_rollouts_tokenizer_and_slimes_request_defaults(tokenizer):
    args = SlimePlugins(RolloutConfig(rollout_max_response_len=32), Ctx(tokenizer)).args
    state = GenerateState(args)
    assert state.tokenizer is tokenizer
    assert state.sampling_params == {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "max_new_tokens": 32,
                                     "skip_special_tokens": False, "no_stop_trim": True,
                                     "spaces_between_special_tokens": False}
    assert get_model_url(args, "actor") == "http://127.0.0.1:31234/generate"


async def test_async_rm_runs_the_built_in_reward_named_by_rm_type():
    args = SlimePlugins(RolloutConfig(rm_type="exact"), Ctx()).args
    sample = Sample(prompt="p", tokens=[1], response="42", label="42")
    assert await async_rm(args, sample) == 1.0


async def test_async_rm_without_a_run_says_what_is_missing():
    args = argparse.Namespace(custom_rm_path=None, rm_type="math")
    with pytest.raises(RuntimeError, match="need the args of a slime-async run"):
        await async_rm(args, Sample(prompt="p"))


def test_a_name_outside_the_rollout_section_says_the_run_config_was_not_given():
    args = SlimePlugins(RolloutConfig(), Ctx()).args
    with pytest.raises(AttributeError, match="args.max_tokens_per_gpu: not among the rollout section's settings"):
        args.max_tokens_per_gpu


def test_sglang_server_concurrency_is_the_rollouts_derived_limit_else_the_cap_else_slimes_512(tokenizer):
    config = RolloutConfig()
    assert SlimePlugins(config, Ctx(tokenizer), concurrency=lambda: 64).args.sglang_server_concurrency == 64
    assert SlimePlugins(RolloutConfig(rollout_concurrency=8), Ctx(tokenizer)).args.sglang_server_concurrency == 8
    assert SlimePlugins(config, Ctx(tokenizer)).args.sglang_server_concurrency == 512
