"""The HTTP front over scripted fake engines: what a client sees for completions the test chose
(tool calls, weight-sync aborts, stop strings), errors in each API's format, the API key, and
token-exact trajectory capture of an OpenAI-client agent with a tool."""

import asyncio
import json

import aiohttp
import openai
import pytest

from actors.rollout.generate import GenerateContext
from tests.front.conftest import ADD_TOOL

CALL_TEXT = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'


def ids_of(model, text, end_of_turn=True):
    return model.encode(text) + ([model.tokenizer.convert_tokens_to_ids("<|im_end|>")] if end_of_turn else [])


async def test_a_hermes_tool_call_comes_back_as_tool_calls(scripted_engine, start_front, text_model):
    scripted_engine.script = [ids_of(text_model, CALL_TEXT)]
    _, url = await start_front([scripted_engine.url], text_model)
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused")
    answer = await client.chat.completions.create(model="tiny", tools=[ADD_TOOL],
                                                  messages=[{"role": "user", "content": "2 + 3?"}])
    choice = answer.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    [call] = choice.message.tool_calls
    assert call.function.name == "add" and json.loads(call.function.arguments) == {"a": 2, "b": 3}
    assert choice.model_extra["token_ids"] == scripted_engine.script[0]
    # The tools were rendered into the prompt by the chat template.
    prompt_text = text_model.decode(answer.model_extra["prompt_token_ids"], skip_special_tokens=False)
    assert '"name": "add"' in prompt_text and prompt_text.endswith("<|im_start|>assistant\n")


async def test_a_weight_sync_abort_mid_answer_is_resumed_into_one_answer(scripted_engine, start_front, text_model):
    scripted_engine.script = [ids_of(text_model, "the result is five")]
    scripted_engine.abort_after = 3
    _, url = await start_front([scripted_engine.url], text_model)
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused")
    answer = await client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "2 + 3?"}],
                                                  max_tokens=50)
    extra = answer.choices[0].model_extra
    assert answer.choices[0].message.content == "the result is five" and answer.choices[0].finish_reason == "stop"
    assert extra["token_ids"] == scripted_engine.script[0]
    versions = extra["token_weight_versions"]
    assert versions[:3] == ["0"] * 3 and set(versions[3:]) == {"1"}
    # The continuation was asked for with the remaining budget, from prompt + the kept tokens.
    first, second = scripted_engine.requests
    assert second["input_ids"] == first["input_ids"] + scripted_engine.script[0][:3]
    assert second["sampling_params"]["max_new_tokens"] == 47


async def test_a_stop_string_ends_generation_within_one_chunk(scripted_engine, start_front, text_model):
    tokens = text_model.encode("think about it <search> rl </search> and then a very long tail " * 4)
    scripted_engine.script = [tokens]
    _, url = await start_front([scripted_engine.url], text_model, router_chunk_tokens=4)
    async with aiohttp.ClientSession() as http:
        body = {"input_ids": [1, 2, 3], "return_logprob": True,
                "sampling_params": {"max_new_tokens": 200, "stop": ["</search>"], "no_stop_trim": True}}
        async with http.post(url + "/generate", json=body) as response:
            kept = await response.json()
        body["sampling_params"]["no_stop_trim"] = False
        scripted_engine._entry = scripted_engine._emitted = 0
        async with http.post(url + "/generate", json=body) as response:
            trimmed = await response.json()
    assert kept["text"].endswith("</search>") and trimmed["text"] == kept["text"][:-len("</search>")]
    assert kept["meta_info"]["finish_reason"] == {"type": "stop", "matched": "</search>"}
    cut = len(kept["output_ids"])
    assert kept["output_ids"] == tokens[:cut] and text_model.decode(tokens[:cut - 1]).find("</search>") < 0
    assert [entry[1] for entry in kept["meta_info"]["output_token_logprobs"]] == kept["output_ids"]
    # A few 4-token requests, not one of 200.
    assert all(r["sampling_params"]["max_new_tokens"] == 4 for r in scripted_engine.requests)


async def test_errors_come_in_each_apis_own_format(scripted_engine, start_front, text_model):
    _, url = await start_front([scripted_engine.url], text_model)
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused")
    with pytest.raises(openai.BadRequestError) as error:
        await client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}], top_logprobs=21,
                                             logprobs=True)
    assert error.value.body["param"] == "top_logprobs" and error.value.body["type"] == "invalid_request_error"
    async with aiohttp.ClientSession() as http:
        async with http.post(url + "/generate", json={"text": "x", "sampling_params": {"temprature": 1}}) as response:
            assert response.status == 400
            assert "did you mean 'temperature'" in (await response.json())["error"]["message"]
        async with http.get(url + "/v1/no-such-thing") as response:
            body = await response.json()
            assert response.status == 404 and body["error"]["type"] == "not_found_error"


async def test_the_api_key_is_required_when_set(scripted_engine, start_front, text_model):
    scripted_engine.script = [ids_of(text_model, "ok")]
    _, url = await start_front([scripted_engine.url], text_model, router_api_key="sesame")
    with pytest.raises(openai.AuthenticationError):
        await openai.AsyncOpenAI(base_url=url + "/v1", api_key="wrong").models.list()
    models = await openai.AsyncOpenAI(base_url=url + "/v1", api_key="sesame").models.list()
    assert [m.id for m in models.data] == [text_model.name]


async def test_an_openai_agent_with_a_tool_is_captured_token_exactly(scripted_engine, start_front, text_model):
    """Turn 1 calls the tool, turn 2 answers; the collected sample holds exactly the engine's
    tokens as trainable and the tool result and template glue as not."""
    scripted_engine.script = [ids_of(text_model, CALL_TEXT), ids_of(text_model, "it is 5")]
    router, url = await start_front([scripted_engine.url], text_model)
    ctx = GenerateContext(router, text_model.tokenizer, config=None, router_url=url)
    sample = _sample()
    client = openai.AsyncOpenAI(base_url=ctx.openai_base_url(sample), api_key="unused")
    messages = [{"role": "user", "content": "What is 2 + 3?"}]
    first = await client.chat.completions.create(model="tiny", messages=messages, tools=[ADD_TOOL])
    call = first.choices[0].message.tool_calls[0]
    messages.append(first.choices[0].message.model_dump(exclude_none=True))
    arguments = json.loads(call.function.arguments)
    messages.append({"role": "tool", "tool_call_id": call.id, "content": str(arguments["a"] + arguments["b"])})
    second = await client.chat.completions.create(model="tiny", messages=messages, tools=[ADD_TOOL])
    assert second.choices[0].message.content == "it is 5"

    [piece] = await ctx.collect_trajectory(sample)
    prompt1 = first.model_extra["prompt_token_ids"]
    prompt2 = second.model_extra["prompt_token_ids"]
    out1, out2 = (r.choices[0].model_extra["token_ids"] for r in (first, second))
    assert prompt2[:len(prompt1) + len(out1)] == prompt1 + out1  # turn 2 extends turn 1 token-exactly
    assert piece.tokens == prompt2 + out2 and piece.prompt_length == len(prompt1)
    glue = len(prompt2) - len(prompt1) - len(out1)
    assert piece.loss_mask == [1] * len(out1) + [0] * glue + [1] * len(out2)
    engine_logprobs = [-(i + 1) / 100 for i in range(len(out1))] + [0.0] * glue + [
        -(i + 1) / 100 for i in range(len(out2))]
    assert piece.rollout_logprobs == pytest.approx(engine_logprobs)
    assert "<tool_response>\n5\n</tool_response>" in text_model.decode(piece.tokens, skip_special_tokens=False)
    with pytest.raises(Exception, match="no session"):
        await ctx.collect_trajectory(sample)  # collected once; the recording is gone


def _sample():
    from slime_async.sample import Sample

    return Sample(group_index=0, index=0, prompt="What is 2 + 3?", tokens=[1], session_id="group-0")


async def test_a_non_ascii_authorization_header_is_refused_with_401(scripted_engine, start_front, text_model):
    _, url = await start_front([scripted_engine.url], text_model, router_api_key="sesame")
    async with aiohttp.ClientSession() as http:
        async with http.get(url + "/v1/models", headers={"Authorization": "Bearer sésame"}) as response:
            assert response.status == 401
            assert (await response.json())["error"]["code"] == "invalid_api_key"


async def test_when_one_choice_fails_the_other_choices_are_cancelled(text_model):
    from actors.router.completion import CompletionSpec
    from actors.router.config import RouterConfig
    from actors.router.http_front import HttpFront, _Session

    front = HttpFront(RouterConfig(), text_model)
    cancelled = []

    async def fake_complete(session, spec, on_progress=None):
        if spec.prompt_ids == [1]:
            raise RuntimeError("engine gone")
        try:
            await asyncio.Event().wait()  # would generate for an answer nobody reads
        except asyncio.CancelledError:
            cancelled.append(spec.prompt_ids)
            raise

    front._complete = fake_complete
    specs = [CompletionSpec([2], {}, 4), CompletionSpec([1], {}, 4), CompletionSpec([3], {}, 4)]
    with pytest.raises(RuntimeError, match="engine gone"):
        await front._complete_all(_Session("s", recorded=False), specs)
    assert sorted(cancelled) == [[2], [3]]


CALL_PYTHON = '<tool_call>\n{"name": "run_python", "arguments": {"code": "print(2 + 3)"}}\n</tool_call>'


@pytest.mark.parametrize("budget_after_call, ran", [(0, False), (5, True)])
async def test_the_openai_agent_runs_a_tool_only_when_a_turn_is_left_to_read_its_output(
        scripted_engine, start_front, text_model, tmp_path, budget_after_call, ran):
    """A call that spends the last token of the budget would run in the sandbox and be counted,
    but no request would ever show its output: the trajectory would train on a call whose result
    is nowhere in it."""
    from types import SimpleNamespace

    from examples.agentic.openai_agent import agent

    call_ids = ids_of(text_model, CALL_PYTHON)
    scripted_engine.script = [call_ids, ids_of(text_model, "5")]
    router, url = await start_front([scripted_engine.url], text_model)
    settings = tmp_path / "agent.yaml"
    settings.write_text("max_tool_calls: 2\nturn_tokens: 200\n")
    ctx = GenerateContext(router, text_model.tokenizer, config=SimpleNamespace(custom_config_path=str(settings)),
                          router_url=url)
    params = {"max_new_tokens": len(call_ids) + budget_after_call, "temperature": 1.0, "top_p": 1.0, "top_k": -1}
    [piece] = await agent.generate(ctx, _sample(), params)
    shown = "<tool_response>\n5\n</tool_response>" in text_model.decode(piece.tokens, skip_special_tokens=False)
    assert [c["output"] for c in piece.metadata["tool_calls"]] == (["5"] if ran else [])
    assert shown is ran and len(scripted_engine.requests) == (2 if ran else 1)
