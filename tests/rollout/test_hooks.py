"""Hook loading: both path spellings, slime-style vs native detection, and the adapters that
run slime's filter, reward and rollout-function signatures."""

from __future__ import annotations

import sys
import textwrap
import types

import pytest

from actors.rollout.config import RolloutConfig
from actors.rollout.hooks import hook_style, load_function, split_function_path
from actors.rollout.rewards import RewardScorer
from actors.rollout.slime_plugins import SlimePlugins
from slime_async.compat.slime.rollout.filter_hub.base_types import DynamicFilterOutput
from slime_async.compat.slime.rollout.filter_hub.dynamic_sampling_filters import check_reward_nonzero_std
from slime_async.sample import Sample


class Ctx:
    tokenizer = None
    router_url = "http://127.0.0.1:30000"


def samples_with(*rewards: float) -> list[Sample]:
    out = []
    for i, reward in enumerate(rewards):
        sample = Sample(group_index=0, index=i, prompt="p", tokens=[1])
        sample.reward = reward
        out.append(sample)
    return out


@pytest.mark.parametrize("path", ["os.path:join", "os.path.join"])
def test_a_hook_path_may_use_a_colon_or_slimes_dot(path):
    import os.path

    assert split_function_path(path) == ("os.path", "join")
    assert load_function(path, "--custom-rm-path") is os.path.join


@pytest.mark.parametrize("path", ["join", ":join", "os.path:", "os.path:a.b"])
def test_a_malformed_hook_path_names_the_flag(path):
    with pytest.raises(ValueError, match="--custom-rm-path: expected package.module:function"):
        load_function(path, "--custom-rm-path")


def test_a_missing_function_names_the_module():
    with pytest.raises(ValueError, match="--custom-rm-path os.path.nope: module 'os.path' has no function 'nope'"):
        load_function("os.path.nope", "--custom-rm-path")


def test_the_first_parameter_named_args_makes_a_hook_slime_style():
    async def slime(args, sample, sampling_params): ...
    async def native(ctx, sample, sampling_params): ...

    assert hook_style(slime) == "slime" and hook_style(native) == "native"


def test_another_first_name_is_slime_style_only_when_the_module_imports_the_compat_layer(tmp_path, monkeypatch):
    (tmp_path / "swapped_plugin.py").write_text(textwrap.dedent('''
        from slime_async.compat.slime.utils.types import Sample

        async def generate(a, sample, sampling_params):
            return sample
    '''))
    (tmp_path / "own_plugin.py").write_text("async def generate(c, sample, sampling_params):\n    return sample\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert hook_style(load_function("swapped_plugin.generate", "-")) == "slime"
    assert hook_style(load_function("own_plugin.generate", "-")) == "native"


def test_a_native_filter_gets_the_rewards_and_never_a_reason():
    keep = SlimePlugins(RolloutConfig(), Ctx()).group_filter(lambda rewards: len(set(rewards)) > 1)
    assert keep(samples_with(0.0, 1.0)) == (True, None)
    assert keep(samples_with(1.0, 1.0)) == (False, None)


def test_slimes_filter_gets_args_and_samples_and_its_reason_is_kept():
    keep = SlimePlugins(RolloutConfig(), Ctx()).group_filter(check_reward_nonzero_std)
    assert keep(samples_with(0.0, 1.0)) == (True, None)
    assert keep(samples_with(1.0, 1.0)) == (False, "zero_std_1.0")


def test_a_slime_filter_returning_a_bool_is_slimes_legacy_form():
    def legacy(args, samples):
        assert args.n_samples_per_prompt == 4
        return samples[0].reward > 0

    keep = SlimePlugins(RolloutConfig(), Ctx()).group_filter(legacy)
    assert keep(samples_with(1.0, 0.0)) == (True, None)
    assert keep(samples_with(0.0, 1.0)) == (False, None)


def test_dynamic_filter_output_defaults_as_in_slime():
    assert DynamicFilterOutput(keep=False) == DynamicFilterOutput(False, None, False)


def test_slimes_generate_rollout_is_refused_with_the_reason():
    def generate_rollout(args, rollout_id, data_source, evaluation=False): ...

    with pytest.raises(ValueError, match="is slime's generate_rollout, which drives the whole rollout"):
        SlimePlugins(RolloutConfig(), Ctx()).group(generate_rollout)


async def test_a_slime_group_function_runs_with_args():
    async def group(args, samples, sampling_params):
        assert sampling_params["no_stop_trim"] is True
        for sample in samples:
            sample.append_response_tokens(args, tokens=[7], log_probs=[-0.5], meta_info={"weight_version": "1"})
        return samples

    run = SlimePlugins(RolloutConfig(), Ctx()).group(group)
    [out] = await run(Ctx(), samples_with(0.0), {"max_new_tokens": 4})
    assert out.tokens == [1, 7] and out.token_versions == [1]


def register_module(monkeypatch, name: str, **functions) -> None:
    module = types.ModuleType(name)
    module.__dict__.update(functions)
    monkeypatch.setitem(sys.modules, name, module)


async def test_a_slime_reward_function_gets_args_and_may_return_a_dict_read_at_reward_key(monkeypatch):
    async def reward_func(args, sample, **kwargs):
        return {"score": 0.5 if args.rollout_temperature == 1.0 else -1.0, "pred": "x"}

    register_module(monkeypatch, "dict_reward", reward_func=reward_func)
    config = RolloutConfig(custom_rm_path="dict_reward.reward_func", reward_key="score")
    scorer = RewardScorer(config, Ctx(), SlimePlugins(config, Ctx()))
    [sample] = samples_with(0.0)
    assert await scorer.score_group([sample]) is True
    assert sample.reward == 0.5 and sample.metadata["reward_info"] == {"score": 0.5, "pred": "x"}


async def test_a_dict_reward_without_reward_key_is_a_counted_reward_error(monkeypatch):
    async def rm(ctx, sample):
        return {"score": 1.0}

    register_module(monkeypatch, "dict_reward_native", rm=rm)
    config = RolloutConfig(custom_rm_path="dict_reward_native:rm")
    scorer = RewardScorer(config, Ctx(), SlimePlugins(config, Ctx()))
    [sample] = samples_with(0.0)
    await scorer.score_group([sample])
    assert scorer.errors == 1 and "set --reward-key" in sample.metadata["reward_error"]


async def test_a_batched_slime_reward_function_scores_the_group(monkeypatch):
    async def rm(args, samples):
        return [float(s.index) for s in samples]

    register_module(monkeypatch, "batched_reward", rm=rm)
    config = RolloutConfig(custom_rm_path="batched_reward.rm", group_rm=True)
    scorer = RewardScorer(config, Ctx(), SlimePlugins(config, Ctx()))
    group = samples_with(0.0, 0.0)
    await scorer.score_group(group)
    assert [s.reward for s in group] == [0.0, 1.0]
