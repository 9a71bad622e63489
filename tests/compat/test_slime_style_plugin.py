"""A plug-in written in slime's style (tests/compat/slime_style_plugin.py) runs through the
rollout's adapter against a stand-in for the router's HTTP front: text in, several turns with a
local tool, tokens appended the slime way, and ``rm`` reading ``sample.response``."""

from __future__ import annotations

import pytest
import slime_style_plugin as plugin

from actors.rollout.config import RolloutConfig
from actors.rollout.generate import GenerationFailed
from actors.rollout.rewards import RewardScorer
from actors.rollout.slime_plugins import MAX_ABORT_RESTARTS, SlimePlugins
from slime_async.sample import Sample, Status


class Ctx:
    def __init__(self, tokenizer, router_url):
        self.tokenizer = tokenizer
        self.router_url = router_url


def new_sample(tokenizer, prompt="what is 1+2?") -> Sample:
    ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    return Sample(group_index=3, index=1, prompt=prompt, tokens=ids, session_id="group-3")


async def test_the_plugin_runs_several_turns_and_the_sample_holds_model_and_tool_tokens(tokenizer, front_factory):
    front = await front_factory([("length", "1+2=3")])
    plugins = SlimePlugins(RolloutConfig(), Ctx(tokenizer, front.url))
    generate = plugins.generate(plugin.generate)
    sample = new_sample(tokenizer)
    prompt_ids = list(sample.tokens)

    out = await generate(None, sample, {"max_new_tokens": 64, "temperature": 1.0})

    assert out is sample and len(front.requests) == plugin.MAX_TURNS
    assert front.requests[0]["text"] == "what is 1+2?" and front.requests[0]["return_logprob"] is True
    assert front.requests[0]["sampling_params"]["no_stop_trim"] is True  # slime's request defaults
    assert front.requests[1]["text"] == "what is 1+2?1+2=3\n<calc>6</calc>\n"  # the tool saw the model's text
    model_ids = tokenizer("1+2=3", add_special_tokens=False)["input_ids"]
    calc_ids = tokenizer("\n<calc>6</calc>\n", add_special_tokens=False)["input_ids"]
    assert sample.tokens == prompt_ids + model_ids + calc_ids + model_ids + calc_ids + model_ids
    assert sample.loss_mask == [1] * len(model_ids) + [0] * len(calc_ids) + [1] * len(model_ids) + \
        [0] * len(calc_ids) + [1] * len(model_ids)
    turn_logprobs = [-0.1 * (k + 1) for k in range(len(model_ids))]
    assert sample.rollout_logprobs[: len(model_ids)] == pytest.approx(turn_logprobs)
    assert sample.token_versions == [2] * sample.response_length and sample.weight_versions == ["2"] * 3
    assert sample.response == "1+2=3\n<calc>6</calc>\n" * 2 + "1+2=3"
    assert sample.status is Status.TRUNCATED and sample.metadata["tool_calls"] == 2
    sample.check()


async def test_the_slime_reward_reads_the_response(tokenizer, front_factory):
    front = await front_factory([("stop", "12ab")])
    config = RolloutConfig(custom_rm_path="slime_style_plugin.rm")
    ctx = Ctx(tokenizer, front.url)
    plugins = SlimePlugins(config, ctx)
    sample = await plugins.generate(plugin.generate)(None, new_sample(tokenizer), {"max_new_tokens": 64})
    await RewardScorer(config, ctx, plugins).score_group([sample])
    # "12ab\n\n" "12ab\n\n" "12ab" once the calculator's answers are taken out: 6 digits of 16 characters.
    assert sample.reward == pytest.approx(6 / 16)


async def test_a_sample_the_plugin_returns_aborted_is_generated_again_from_the_prompt(tokenizer, front_factory):
    front = await front_factory([("abort", "1"), ("stop", "77"), ("stop", "77"), ("stop", "77")])
    generate = SlimePlugins(RolloutConfig(), Ctx(tokenizer, front.url)).generate(plugin.generate)
    sample = new_sample(tokenizer)
    await generate(None, sample, {"max_new_tokens": 64})
    assert len(front.requests) == 1 + plugin.MAX_TURNS
    assert sample.status is Status.COMPLETED and sample.metadata["restarts_after_abort"] == 1
    assert not sample.response.startswith("1")  # nothing of the aborted attempt is kept


async def test_a_plugin_aborted_every_time_fails_its_sample(tokenizer, front_factory):
    front = await front_factory([("abort", "1")])
    generate = SlimePlugins(RolloutConfig(), Ctx(tokenizer, front.url)).generate(plugin.generate)
    with pytest.raises(GenerationFailed, match=f"ABORTED {MAX_ABORT_RESTARTS} times"):
        await generate(None, new_sample(tokenizer), {"max_new_tokens": 64})


async def test_a_plugin_that_drops_the_logprobs_is_refused_with_what_to_do(tokenizer, front_factory):
    async def no_logprobs(args, sample, sampling_params):
        sample.tokens = sample.tokens + [5, 6]
        sample.response_length = 2
        sample.loss_mask = [1, 1]
        sample.rollout_log_probs = None
        return sample

    generate = SlimePlugins(RolloutConfig(), Ctx(tokenizer, "http://127.0.0.1:1")).generate(no_logprobs)
    with pytest.raises(GenerationFailed, match='request "return_logprob": true'):
        await generate(None, new_sample(tokenizer), {"max_new_tokens": 4})


async def test_with_a_chat_template_the_plugin_gets_the_rendered_prompt_text(tokenizer, front_factory):
    front = await front_factory([("stop", "3")])
    config = RolloutConfig(apply_chat_template=True)
    generate = SlimePlugins(config, Ctx(tokenizer, front.url)).generate(plugin.generate)
    await generate(None, new_sample(tokenizer, "1+2?"), {"max_new_tokens": 64})
    assert front.requests[0]["text"] == "<|im_start|>user\n1+2?<|im_end|>\n<|im_start|>assistant\n"
