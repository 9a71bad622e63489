"""The Agents SDK example's agent (``openai-agents``: ``Agent`` + ``@function_tool`` + ``Runner.run``)
against the real HTTP front, unchanged: a scripted engine makes the model call its tool and answer,
a real CPU engine samples a turn; the captured trajectory must be token-exact (the model's tokens
trainable with the engine's logprobs, the tool's output and the glue loss mask 0) and must be the
very text the warm start's rendered episode trains (make_task.py), so the SDK really sent its own
request through the front and nothing else answered."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

pytest.importorskip("agents", reason="the agents-sdk extra (openai-agents) is not installed")

from actors.rollout.generate import GenerateContext  # noqa: E402
from examples.agentic.agents_sdk import agent  # noqa: E402
from examples.agentic.agents_sdk.make_task import sdk_conversation, sdk_tools  # noqa: E402
from examples.agentic.code_interpreter import task  # noqa: E402
from examples.agentic.openai_agent.make_task import cut_episode  # noqa: E402
from slime_async.engine_client import EngineClient  # noqa: E402
from slime_async.sample import Sample, Status  # noqa: E402

PROBLEM = task.Problem("583*81-203", 47020)
PARAMS = {"max_new_tokens": 400, "temperature": 1.0, "top_p": 1.0, "top_k": -1}


def ids_of(model, text: str) -> list[int]:
    return model.encode(text) + [model.tokenizer.convert_tokens_to_ids("<|im_end|>")]


def context(router, model, url: str, tmp_path, model_api: str, turn_tokens: int = 200) -> GenerateContext:
    settings = tmp_path / "agent.yaml"
    settings.write_text(f"model_api: {model_api}\nmax_tool_calls: 2\nturn_tokens: {turn_tokens}\n")
    return GenerateContext(router, model.tokenizer, config=SimpleNamespace(custom_config_path=str(settings)),
                           router_url=url)


def sample() -> Sample:
    return Sample(group_index=0, index=0, prompt=PROBLEM.question, label=str(PROBLEM.answer), tokens=[1],
                  session_id="group-0")


@pytest.mark.parametrize("model_api", ["chat_completions", "responses"])
async def test_the_sdk_agents_tool_episode_is_captured_as_the_warm_start_renders_it(
        scripted_engine, start_front, text_model, tmp_path, model_api):
    prompt, segments = cut_episode(text_model.tokenizer, sdk_conversation(PROBLEM), sdk_tools(model_api))
    call, answer = (s["text"].removesuffix("<|im_end|>") for s in segments if s["train"])
    scripted_engine.script = [ids_of(text_model, call), ids_of(text_model, answer)]
    router, url = await start_front([scripted_engine.url], text_model)
    ctx = context(router, text_model, url, tmp_path, model_api)

    [piece] = await agent.generate(ctx, sample(), PARAMS)

    # The SDK ran the tool in the real sandbox and answered with the box, which the reward grades.
    assert [c["output"] for c in piece.metadata["tool_calls"]] == ["47020"]
    assert piece.metadata["final_output"] == "\\boxed{47020}"
    assert await agent.reward(ctx, piece) == 1.0
    assert len(scripted_engine.requests) == 2  # both model calls went through the front
    # The trajectory is the rendered episode: the SDK's system turn and tool schema, the call, the
    # tool's output, the answer; only the model's two turns are trainable.
    decode = lambda ids: text_model.tokenizer.decode(ids, skip_special_tokens=False)  # noqa: E731
    assert decode(piece.tokens) == prompt + "".join(s["text"] for s in segments)
    assert decode(piece.tokens[:piece.prompt_length]) == prompt
    response = piece.tokens[piece.prompt_length:]
    trained = [t for t, m in zip(response, piece.loss_mask) if m]
    assert trained == scripted_engine.script[0] + scripted_engine.script[1]
    glue = [t for t, m in zip(response, piece.loss_mask) if not m]
    assert decode(glue) == "".join(s["text"] for s in segments if not s["train"])
    assert "47020" in decode(glue)  # the tool's output is there, loss mask 0
    expected = [-(i + 1) / 100 for i in range(len(scripted_engine.script[0]))] + [0.0] * len(glue) + [
        -(i + 1) / 100 for i in range(len(scripted_engine.script[1]))]
    assert piece.rollout_logprobs == pytest.approx(expected)


@pytest.mark.parametrize("model_api", ["chat_completions", "responses"])
async def test_the_sdk_agents_turn_carries_the_real_engines_tokens_and_logprobs(
        cpu_engine, start_front, text_model, tmp_path, model_api):
    router, url = await start_front([cpu_engine], text_model)
    ctx = context(router, text_model, url, tmp_path, model_api)
    greedy = dict(PARAMS, temperature=0.0)

    [piece] = await agent.generate(ctx, sample(), greedy)  # a random model writes no call: one turn

    prompt = piece.tokens[:piece.prompt_length]
    assert text_model.tokenizer.decode(prompt, skip_special_tokens=False) == cut_episode(
        text_model.tokenizer, sdk_conversation(PROBLEM), sdk_tools(model_api))[0]
    async with EngineClient(cpu_engine) as engine:
        direct = await engine.generate(prompt, {"temperature": 0.0, "max_new_tokens": 200})
    entries = direct["meta_info"]["output_token_logprobs"]
    assert piece.tokens[piece.prompt_length:] == [e[1] for e in entries]
    assert piece.loss_mask == [1] * len(entries)
    assert piece.rollout_logprobs == pytest.approx([e[0] for e in entries], abs=1e-5)
    assert piece.metadata["tool_calls"] == [] and piece.metadata["metrics"]["turns"] == 1


async def test_a_responses_turn_cut_by_its_budget_is_a_truncated_sample_with_its_tokens(
        scripted_engine, start_front, text_model, tmp_path):
    # The SDK raises ModelBehaviorError on an "incomplete" response; the hook keeps the episode.
    prompt, segments = cut_episode(text_model.tokenizer, sdk_conversation(PROBLEM), sdk_tools("responses"))
    call = next(s["text"] for s in segments if s["train"]).removesuffix("<|im_end|>")
    scripted_engine.script = [ids_of(text_model, call)]
    router, url = await start_front([scripted_engine.url], text_model)
    ctx = context(router, text_model, url, tmp_path, "responses", turn_tokens=5)

    [piece] = await agent.generate(ctx, sample(), PARAMS)

    assert piece.status is Status.TRUNCATED
    assert piece.tokens[piece.prompt_length:] == scripted_engine.script[0][:5]  # the cut turn's tokens train
    assert piece.loss_mask == [1] * 5
    assert piece.metadata["final_output"] is None and await agent.reward(ctx, piece) == 0.0
    assert piece.metadata["metrics"] == {"tool_calls": 0, "tool_errors": 0, "turns": 1, "incomplete": 1.0}
