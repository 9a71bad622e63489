"""RolloutActor: named eval sets, samples per eval prompt, the context-length cap, and
``sample.response`` set for native hooks. The router is a stand-in that answers at once."""

from __future__ import annotations

from actors.rollout.actor import RolloutActor
from actors.rollout.config import RolloutConfig
from actors.rollout.data import Prompt
from slime_async.actor import Actor, spawn
from examples.models.tiny import train_tokenizer


class EchoRouter(Actor):
    """Answers every request with tokens 10, 11, ... up to max_new_tokens (finish: length)."""

    name = "router"

    def __init__(self):
        super().__init__()
        self.requests: list[tuple[list[int], dict]] = []

    def generate(self, input_ids, sampling_params, session_id=None, trace_args=None):
        self.requests.append((list(input_ids), dict(sampling_params)))
        ids = list(range(10, 10 + sampling_params["max_new_tokens"]))
        return {"meta_info": {"output_token_logprobs": [[-1.0, t, None] for t in ids],
                              "finish_reason": {"type": "length"}, "weight_version": "0"}}


class Prompts:
    def __init__(self, n: int, prompt_ids: list[int]):
        self.prompts = [Prompt(index=i, epoch=0, prompt=f"p{i}", prompt_ids=list(prompt_ids), label="x")
                        for i in range(n)]

    def all_prompts(self):
        return iter(self.prompts)


TOKENIZER = train_tokenizer(512, 0)


async def evaluate(config: RolloutConfig, datasets):
    echo = EchoRouter()
    router = await spawn(echo)
    rollout = await spawn(RolloutActor(config, router=router, buffer=router, dataset=None, tokenizer=TOKENIZER))
    try:
        return await rollout.ask("evaluate", datasets), echo
    finally:
        await rollout.stop()
        await router.stop()


async def test_each_named_eval_set_gets_its_own_metrics_with_n_samples_per_prompt():
    config = RolloutConfig(rm_type="exact", n_samples_per_eval_prompt=3, rollout_max_response_len=2)
    metrics, router = await evaluate(config, {"aime": Prompts(2, [1, 2]), "gsm": Prompts(1, [1, 2])})
    assert metrics["eval/aime/samples"] == 6.0 and metrics["eval/gsm/samples"] == 3.0
    assert {"eval/aime/reward_mean", "eval/gsm/response_len_mean"} <= set(metrics)
    assert len(router.requests) == 9


async def test_a_single_eval_set_keeps_the_unnamed_metrics():
    metrics, _ = await evaluate(RolloutConfig(rm_type="exact", rollout_max_response_len=2), Prompts(2, [1, 2]))
    assert metrics["eval/samples"] == 2.0 and "eval/reward_mean" in metrics


async def test_the_context_length_caps_each_samples_new_tokens():
    config = RolloutConfig(rm_type="exact", rollout_max_response_len=64, eval_max_response_len=64,
                           rollout_max_context_len=10)
    _, router = await evaluate(config, Prompts(1, [1, 2, 3, 4, 5, 6]))
    assert router.requests[0][1]["max_new_tokens"] == 4  # 10 - 6 prompt tokens


async def test_a_native_hooks_sample_gets_its_response_text_for_reward_functions():
    config = RolloutConfig(rm_type="exact", rollout_max_response_len=3, eval_max_response_len=3)
    dataset = Prompts(1, [1, 2])
    dataset.prompts[0].label = TOKENIZER.decode([10, 11, 12], skip_special_tokens=True)
    metrics, _ = await evaluate(config, dataset)
    assert metrics["eval/reward_mean"] == 1.0  # the built-in reward compared the decoded response


async def hook_with_metrics(ctx, sample, sampling_params):
    await ctx.generate_turn(sample, sampling_params)
    sample.metadata["metrics"] = {"tool_calls": sample.index, "rollout_samples": 99, "note": "not a number"}
    return sample


async def test_a_hooks_numeric_sample_metrics_are_averaged_into_eval_metrics_without_hiding_built_ins():
    config = RolloutConfig(rm_type="exact", rollout_max_response_len=2, n_samples_per_eval_prompt=3,
                           custom_generate_function_path=f"{__name__}:hook_with_metrics")
    metrics, _ = await evaluate(config, {"set": Prompts(2, [1, 2])})
    assert metrics["eval/set/tool_calls"] == 1.0  # indexes 0, 1, 2 of each prompt
    assert metrics["eval/set/rollout_samples"] == 99.0 and "eval/set/note" not in metrics


async def test_a_hooks_sample_metrics_are_averaged_into_the_steps_rollout_metrics():
    rollout = RolloutActor(RolloutConfig(rm_type="exact"), router=None, buffer=None, dataset=None, tokenizer=None)
    group = [Prompts(1, [1]).prompts[0] for _ in range(3)]
    samples = [rollout._new_sample(prompt, 0, i) for i, prompt in enumerate(group)]
    for sample, calls in zip(samples, (1, 2, 6)):
        sample.metadata["metrics"] = {"tool_calls": calls, "reward_mean": 5.0}
        sample.reward = 1.0
    rollout._record(samples)
    metrics = rollout.metrics()
    assert metrics["rollout/tool_calls"] == 3.0
    assert metrics["rollout/reward_mean"] == 1.0  # the built-in wins over a hook's metric of the same name
    assert "rollout/tool_calls" not in rollout.metrics()  # per window: the next step starts afresh
