"""OpenAI's Responses API on the router's HTTP front, driven by the stock ``openai`` client: over a
real CPU engine (exact tokens, the SSE event sequence, a failure mid-stream), over a scripted
engine (function-tool round trips with ``previous_response_id`` and with the full item list,
trajectory capture through a session, errors), and through the standalone ``slime-async router``."""

import json

import openai
import pytest

from actors.rollout.generate import GenerateContext
from slime_async.sample import Sample
from tests.front.conftest import ADD_TOOL, standalone_router

ADD = {"type": "function", **ADD_TOOL["function"]}  # Responses' flat function tool
CALL_TEXT = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
QUESTION = "What is 2 + 3?"


def ids_of(model, text):
    return model.encode(text) + [model.tokenizer.convert_tokens_to_ids("<|im_end|>")]


def _client(url):
    return openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)


# ----- a real CPU engine ---------------------------------------------------------------------------


async def test_a_response_carries_the_engines_tokens_and_the_same_prompt_as_chat(cpu_engine, start_front, text_model):
    _, url = await start_front([cpu_engine], text_model)
    client = _client(url)
    answer = await client.responses.create(model="tiny", instructions="Be brief.", input=QUESTION, tools=[ADD],
                                           max_output_tokens=12, temperature=0,
                                           include=["message.output_text.logprobs"])
    chat = await client.chat.completions.create(
        model="tiny", messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": QUESTION}],
        tools=[ADD_TOOL], max_tokens=12, temperature=0)
    extra = answer.model_extra
    assert extra["prompt_token_ids"] == chat.model_extra["prompt_token_ids"]  # one rendering for both APIs
    assert extra["token_ids"] == chat.choices[0].model_extra["token_ids"]  # greedy: the same tokens
    assert answer.usage.input_tokens == len(extra["prompt_token_ids"])
    assert answer.usage.output_tokens == len(extra["token_ids"]) == len(extra["token_weight_versions"])
    [message] = answer.output  # a random model calls no tool
    assert message.type == "message" and answer.output_text == chat.choices[0].message.content
    assert [p.logprob for p in message.content[0].logprobs] == pytest.approx(extra["token_logprobs"])
    assert answer.status == ("incomplete" if chat.choices[0].finish_reason == "length" else "completed")


async def test_a_streamed_response_sends_openais_event_sequence(cpu_engine, start_front, text_model):
    _, url = await start_front([cpu_engine], text_model, router_chunk_tokens=4)
    stream = await _client(url).responses.create(model="tiny", input=QUESTION, max_output_tokens=10, stream=True,
                                                 extra_body={"ignore_eos": True})
    events = [event async for event in stream]  # raw events: the .stream() helper drops extension fields
    final = events[-1].response
    kinds = [e.type for e in events]
    deltas = [e for e in events if e.type == "response.output_text.delta"]
    assert kinds == ["response.created", "response.in_progress", "response.output_item.added",
                     "response.content_part.added", *["response.output_text.delta"] * len(deltas),
                     "response.output_text.done", "response.content_part.done", "response.output_item.done",
                     "response.incomplete"]
    assert [e.sequence_number for e in events] == list(range(len(events))) and len(deltas) >= 2
    ids = [t for e in deltas for t in e.model_extra["token_ids"]]
    assert ids == final.model_extra["token_ids"] and len(ids) == 10
    assert "".join(e.delta for e in deltas) == final.output_text == text_model.decode(ids)
    assert final.status == "incomplete" and final.incomplete_details.reason == "max_output_tokens"
    assert final.usage.output_tokens == 10


async def test_a_failure_mid_stream_is_an_error_event_then_response_failed(cpu_engine, start_front, text_model):
    _, url = await start_front([cpu_engine], text_model)
    stream = await _client(url).responses.create(model="tiny", input=QUESTION, max_output_tokens=4, top_p=0.0,
                                                 stream=True)
    events = [event async for event in stream]
    assert [e.type for e in events][-2:] == ["error", "response.failed"]
    assert "top_p" in events[-2].message and events[-1].response.status == "failed"
    assert events[-1].response.error.code == "invalid_prompt"


# ----- a scripted engine: tools, conversations, trajectories, errors -------------------------------


async def test_a_function_tool_round_trip_through_previous_response_id_is_captured_token_exactly(
        scripted_engine, start_front, text_model):
    scripted_engine.script = [ids_of(text_model, CALL_TEXT), ids_of(text_model, "it is 5")]
    router, url = await start_front([scripted_engine.url], text_model)
    ctx = GenerateContext(router, text_model.tokenizer, config=None, router_url=url)
    sample = Sample(group_index=0, index=0, prompt=QUESTION, tokens=[1], session_id="group-0")
    client = openai.AsyncOpenAI(base_url=ctx.openai_base_url(sample), api_key="unused")
    first = await client.responses.create(model="tiny", input=QUESTION, tools=[ADD])
    [call] = first.output
    assert call.type == "function_call" and call.name == "add" and json.loads(call.arguments) == {"a": 2, "b": 3}
    second = await client.responses.create(model="tiny", previous_response_id=first.id, tools=[ADD], input=[
        {"type": "function_call_output", "call_id": call.call_id, "output": "5"}])
    assert second.output_text == "it is 5" and second.previous_response_id == first.id

    [piece] = await ctx.collect_trajectory(sample)
    prompt1, prompt2 = first.model_extra["prompt_token_ids"], second.model_extra["prompt_token_ids"]
    out1, out2 = first.model_extra["token_ids"], second.model_extra["token_ids"]
    assert prompt2[:len(prompt1) + len(out1)] == prompt1 + out1  # turn 2 extends turn 1 token-exactly
    assert piece.tokens == prompt2 + out2 and piece.prompt_length == len(prompt1)
    glue = len(prompt2) - len(prompt1) - len(out1)
    assert piece.loss_mask == [1] * len(out1) + [0] * glue + [1] * len(out2)
    assert piece.rollout_logprobs == pytest.approx(
        [-(i + 1) / 100 for i in range(len(out1))] + [0.0] * glue + [-(i + 1) / 100 for i in range(len(out2))])
    assert "<tool_response>\n5\n</tool_response>" in text_model.decode(piece.tokens, skip_special_tokens=False)


async def test_the_full_item_list_renders_the_prompt_previous_response_id_does(scripted_engine, start_front,
                                                                              text_model):
    scripted_engine.script = [ids_of(text_model, CALL_TEXT), ids_of(text_model, "it is 5")]
    _, url = await start_front([scripted_engine.url], text_model)
    client = _client(url)
    first = await client.responses.create(model="tiny", input=QUESTION, tools=[ADD], instructions="Use tools.")
    result = {"type": "function_call_output", "call_id": first.output[0].call_id, "output": "5"}
    chained = await client.responses.create(model="tiny", previous_response_id=first.id, input=[result],
                                            tools=[ADD], instructions="Use tools.")
    listed = await client.responses.create(model="tiny", tools=[ADD], instructions="Use tools.", input=[
        {"role": "user", "content": QUESTION}, *[item.model_dump(exclude_none=True) for item in first.output], result])
    assert listed.model_extra["prompt_token_ids"] == chained.model_extra["prompt_token_ids"]
    assert listed.output_text == chained.output_text == "it is 5"


async def test_a_streamed_function_call_sends_its_arguments_events(scripted_engine, start_front, text_model):
    scripted_engine.script = [ids_of(text_model, "Adding. " + CALL_TEXT)]
    _, url = await start_front([scripted_engine.url], text_model, router_chunk_tokens=4)
    async with _client(url).responses.stream(model="tiny", input=QUESTION, tools=[ADD]) as stream:
        events = [event async for event in stream]
        final = await stream.get_final_response()
    assert [e.type for e in events] == [
        "response.created", "response.in_progress",
        "response.output_item.added", "response.content_part.added", "response.output_text.delta",
        "response.output_text.done", "response.content_part.done", "response.output_item.done",
        "response.output_item.added", "response.function_call_arguments.delta",
        "response.function_call_arguments.done", "response.output_item.done", "response.completed"]
    message, call = final.output
    assert message.content[0].text == "Adding." and call.name == "add"
    assert json.loads(call.arguments) == {"a": 2, "b": 3} and events[-3].arguments == call.arguments
    assert final.model_extra["token_ids"] == scripted_engine.script[0] and final.status == "completed"


async def test_a_weight_sync_abort_mid_response_is_resumed_with_per_token_versions(scripted_engine, start_front,
                                                                                   text_model):
    scripted_engine.script = [ids_of(text_model, "the result is five")]
    scripted_engine.abort_after = 3
    _, url = await start_front([scripted_engine.url], text_model)
    answer = await _client(url).responses.create(model="tiny", input=QUESTION, max_output_tokens=50)
    versions = answer.model_extra["token_weight_versions"]
    assert answer.output_text == "the result is five" and answer.status == "completed"
    assert answer.model_extra["token_ids"] == scripted_engine.script[0]
    assert versions[:3] == ["0"] * 3 and set(versions[3:]) == {"1"} and answer.model_extra["weight_version"] == "1"


@pytest.mark.parametrize("fields, param", [
    ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "https://x/y.png"}]}]},
     "input[0].content[0]"),
    ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0].type"),
    ({"previous_response_id": "resp_nope"}, "previous_response_id"),
    ({"top_logprobs": 21}, "top_logprobs"),
    ({"text": {"format": {"type": "json_object"}}}, "text.format"),
    ({"tools": [ADD], "tool_choice": {"type": "function", "name": "sub"}}, "tool_choice"),
    ({"background": True}, "background"),
    ({"max_output_tokens": 0}, "max_output_tokens"),
])
async def test_an_unsupported_or_bad_field_is_a_400_that_names_it(scripted_engine, start_front, text_model,
                                                                 fields, param):
    _, url = await start_front([scripted_engine.url], text_model)
    with pytest.raises(openai.BadRequestError) as error:
        await _client(url).responses.create(**({"model": "tiny", "input": QUESTION} | fields))
    assert error.value.body["param"] == param and error.value.body["type"] == "invalid_request_error"
    assert scripted_engine.requests == []  # refused before anything was generated


async def test_a_response_not_stored_or_from_another_session_is_not_continued(scripted_engine, start_front,
                                                                             text_model):
    scripted_engine.script = [ids_of(text_model, "ok")]
    _, url = await start_front([scripted_engine.url], text_model)
    client, session_a = _client(url), openai.AsyncOpenAI(base_url=url + "/sessions/a/v1", api_key="unused")
    unstored = await client.responses.create(model="tiny", input=QUESTION, store=False)
    with pytest.raises(openai.BadRequestError) as error:
        await client.responses.create(model="tiny", input="and?", previous_response_id=unstored.id)
    assert error.value.body["param"] == "previous_response_id" and "store: false" in error.value.body["message"]
    in_a = await session_a.responses.create(model="tiny", input=QUESTION)
    with pytest.raises(openai.BadRequestError, match="/sessions/a/v1"):
        await client.responses.create(model="tiny", input="and?", previous_response_id=in_a.id)


def test_the_standalone_router_command_serves_responses(cpu_engine, chat_model_dir, text_model):
    with standalone_router(cpu_engine, chat_model_dir, api_key="k") as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="k")
        first = client.responses.create(model=chat_model_dir.name, input=QUESTION, tools=[ADD], max_output_tokens=4)
        assert first.model == chat_model_dir.name and first.status in ("completed", "incomplete")
        events = list(client.responses.create(model=chat_model_dir.name, input="and 3 + 4?", tools=[ADD],
                                              previous_response_id=first.id, max_output_tokens=4, stream=True))
        assert events[-1].type in ("response.completed", "response.incomplete")
        second = events[-1].response
        prompt = text_model.decode(second.model_extra["prompt_token_ids"], skip_special_tokens=False)
        assert QUESTION in prompt and "and 3 + 4?" in prompt and second.previous_response_id == first.id


@pytest.mark.parametrize("streamed", [False, True])
async def test_an_openai_agents_sdk_agent_calls_its_tool_through_the_front(scripted_engine, start_front, text_model,
                                                                         streamed):
    """What the SDK sends (``include``, SDK-shaped history items, ``previous_response_id`` off by
    default: the whole list each turn) and reads (output items, usage, ``response.completed``)."""
    from agents import Agent, ModelSettings, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled

    set_tracing_disabled(True)
    scripted_engine.script = [ids_of(text_model, CALL_TEXT), ids_of(text_model, "it is 5")]
    _, url = await start_front([scripted_engine.url], text_model)
    seen = []

    @function_tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        seen.append((a, b))
        return a + b

    agent = Agent(name="adder", instructions="Use tools.", tools=[add], model_settings=ModelSettings(max_tokens=64),
                  model=OpenAIResponsesModel(model="tiny", openai_client=_client(url)))
    if streamed:
        result = Runner.run_streamed(agent, QUESTION)
        [_ async for _ in result.stream_events()]
    else:
        result = await Runner.run(agent, QUESTION)
    assert seen == [(2, 3)] and result.final_output == "it is 5"
    last_prompt = text_model.decode(scripted_engine.requests[-1]["input_ids"], skip_special_tokens=False)
    assert "Use tools." in last_prompt and "<tool_response>\n5\n</tool_response>" in last_prompt
