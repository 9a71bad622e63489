"""Anthropic's Messages API on the HTTP front, driven by the stock ``anthropic`` client: over
scripted engines (tool calls, stop sequences, errors, the API key, token-exact trajectory
capture) and over a real CPU engine (exact tokens, streaming, ``slime-async router``)."""

import aiohttp
import anthropic
import pytest
import pytest_asyncio

from actors.rollout.generate import GenerateContext
from slime_async.engine_client import EngineClient
from slime_async.sample import Sample
from tests.front.conftest import standalone_router
from tests.front.test_front_http import CALL_TEXT, ids_of

ADD = {"name": "add", "description": "Add two integers.",
       "input_schema": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                        "required": ["a", "b"]}}
QUESTION = [{"role": "user", "content": "What is 2 + 3?"}]


@pytest_asyncio.fixture
async def clients():
    """``client = clients(base_url, api_key=...)``: stock async clients, closed after the test."""
    made = []

    def make(url: str, api_key: str = "unused") -> anthropic.AsyncAnthropic:
        made.append(anthropic.AsyncAnthropic(base_url=url, api_key=api_key, max_retries=0))
        return made[-1]

    yield make
    for client in made:
        await client.close()


async def test_a_tool_use_comes_back_as_a_tool_use_block(scripted_engine, start_front, text_model, clients):
    scripted_engine.script = [ids_of(text_model, CALL_TEXT)]
    _, url = await start_front([scripted_engine.url], text_model)
    answer = await clients(url).messages.create(model="tiny", max_tokens=64, messages=QUESTION, tools=[ADD],
                                                system="You add numbers.")
    assert answer.stop_reason == "tool_use" and answer.stop_sequence is None
    [block] = answer.content
    assert block.type == "tool_use" and block.name == "add" and block.input == {"a": 2, "b": 3}
    assert block.id.startswith("toolu_")
    assert answer.model_extra["token_ids"] == scripted_engine.script[0]
    prompt_text = text_model.decode(answer.model_extra["prompt_token_ids"], skip_special_tokens=False)
    # The system prompt and the tool (as an OpenAI-style function) were rendered by the template.
    assert prompt_text.startswith("<|im_start|>system\nYou add numbers.\n\n# Tools\n<tools>\n")
    assert '{"type": "function", "function": {"name": "add"' in prompt_text
    assert answer.usage.input_tokens == len(answer.model_extra["prompt_token_ids"])
    assert answer.usage.output_tokens == len(scripted_engine.script[0])


async def test_a_tool_round_trip_through_a_session_is_captured_token_exactly(scripted_engine, start_front,
                                                                             text_model, clients):
    """tool_use → tool_result → answer over ``ctx.anthropic_base_url(sample)``: the collected
    sample is one token-exact trajectory, the model's tokens trainable, the tool result not."""
    scripted_engine.script = [ids_of(text_model, CALL_TEXT), ids_of(text_model, "it is 5")]
    router, url = await start_front([scripted_engine.url], text_model)
    ctx = GenerateContext(router, text_model.tokenizer, config=None, router_url=url)
    sample = Sample(group_index=0, index=0, prompt="What is 2 + 3?", tokens=[1], session_id="group-0")
    assert ctx.anthropic_base_url(sample) + "/v1" == ctx.openai_base_url(sample)
    client = clients(ctx.anthropic_base_url(sample))
    messages = list(QUESTION)
    first = await client.messages.create(model="tiny", max_tokens=64, messages=messages, tools=[ADD])
    [call] = [block for block in first.content if block.type == "tool_use"]
    messages.append({"role": "assistant", "content": [block.model_dump(exclude_none=True) for block in first.content]})
    messages.append({"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": call.id, "content": [{"type": "text", "text": "5"}]}]})
    second = await client.messages.create(model="tiny", max_tokens=64, messages=messages, tools=[ADD])
    assert [block.text for block in second.content] == ["it is 5"] and second.stop_reason == "end_turn"

    [piece] = await ctx.collect_trajectory(sample)
    prompt1, prompt2 = first.model_extra["prompt_token_ids"], second.model_extra["prompt_token_ids"]
    out1, out2 = first.model_extra["token_ids"], second.model_extra["token_ids"]
    assert prompt2[:len(prompt1) + len(out1)] == prompt1 + out1  # turn 2 extends turn 1 token by token
    assert piece.tokens == prompt2 + out2 and piece.prompt_length == len(prompt1)
    glue = len(prompt2) - len(prompt1) - len(out1)
    assert piece.loss_mask == [1] * len(out1) + [0] * glue + [1] * len(out2)
    assert "<tool_response>\n5\n</tool_response>" in text_model.decode(piece.tokens, skip_special_tokens=False)


async def test_a_stop_sequence_ends_the_answer_and_is_named(scripted_engine, start_front, text_model, clients):
    tokens = text_model.encode("think about it <search> rl </search> and then a very long tail " * 4)
    scripted_engine.script = [tokens]
    _, url = await start_front([scripted_engine.url], text_model, router_chunk_tokens=4)
    answer = await clients(url).messages.create(model="tiny", max_tokens=200, messages=QUESTION,
                                                stop_sequences=["</search>"])
    assert answer.stop_reason == "stop_sequence" and answer.stop_sequence == "</search>"
    assert answer.content[0].text == "think about it <search> rl "
    assert all(r["sampling_params"]["max_new_tokens"] == 4 for r in scripted_engine.requests)


async def test_a_streamed_tool_use_is_accumulated_by_the_client(scripted_engine, start_front, text_model, clients):
    scripted_engine.script = [ids_of(text_model, "Let me add. " + CALL_TEXT)]
    _, url = await start_front([scripted_engine.url], text_model, router_chunk_tokens=4)
    async with clients(url).messages.stream(model="tiny", max_tokens=64, messages=QUESTION, tools=[ADD]) as stream:
        events = [event async for event in stream]
        final = await stream.get_final_message()
    assert [b.type for b in final.content] == ["text", "tool_use"] and final.stop_reason == "tool_use"
    assert final.content[0].text == "Let me add." and final.content[1].input == {"a": 2, "b": 3}
    kinds = [e.type for e in events]
    assert "input_json" in kinds and kinds.count("content_block_stop") == 2


async def test_errors_come_in_anthropics_format(scripted_engine, start_front, text_model, clients):
    _, url = await start_front([scripted_engine.url], text_model)
    client = clients(url)
    with pytest.raises(anthropic.BadRequestError) as error:
        # The client itself insists on max_tokens; its raw post sends the body as given.
        await client.post("/v1/messages", body={"model": "tiny", "messages": QUESTION}, cast_to=anthropic.types.Message)
    assert error.value.body == {"type": "error", "error": {"type": "invalid_request_error",
                                                           "message": "max_tokens: field required"}}
    with pytest.raises(anthropic.BadRequestError, match="tool_choice.name"):
        await client.messages.create(model="tiny", messages=QUESTION, max_tokens=4, tools=[ADD],
                                     tool_choice={"type": "tool", "name": "multiply"})
    with pytest.raises(anthropic.BadRequestError, match="messages.0.content.0"):
        await client.messages.create(model="tiny", max_tokens=4, messages=[
            {"role": "user", "content": [{"type": "image", "source": {"type": "url", "url": "http://x/y.png"}}]}])
    async with aiohttp.ClientSession() as http:
        async with http.post(url + "/v1/messages", data=b"{not json") as response:
            body = await response.json()
            assert response.status == 400 and body["type"] == "error"
            assert body["error"]["type"] == "invalid_request_error"


async def test_the_api_key_is_taken_as_x_api_key_or_bearer(scripted_engine, start_front, text_model, clients):
    scripted_engine.script = [ids_of(text_model, "ok")]
    _, url = await start_front([scripted_engine.url], text_model, router_api_key="sesame")
    with pytest.raises(anthropic.AuthenticationError) as error:
        await clients(url, api_key="wrong").messages.create(model="tiny", max_tokens=4, messages=QUESTION)
    assert error.value.body["error"]["type"] == "authentication_error"
    answer = await clients(url, api_key="sesame").messages.create(model="tiny", max_tokens=4, messages=QUESTION)
    assert answer.content[0].text == "ok"
    async with aiohttp.ClientSession() as http:
        count = {"model": "tiny", "messages": QUESTION}
        async with http.post(url + "/v1/messages/count_tokens", json=count, headers={"x-api-key": "sesame"}) as r:
            assert r.status == 200 and (await r.json())["input_tokens"] == len(answer.model_extra["prompt_token_ids"])


async def test_messages_answer_with_exactly_the_engines_tokens(cpu_engine, start_front, text_model, clients):
    _, url = await start_front([cpu_engine], text_model)
    answer = await clients(url).messages.create(model="tiny", max_tokens=12, messages=QUESTION,
                                                    extra_body={"temperature": 0})  # the client has no field for it
    prompt = answer.model_extra["prompt_token_ids"]
    assert prompt == text_model.encode(text_model.render_chat(QUESTION))
    async with EngineClient(cpu_engine) as engine:
        direct = await engine.generate(prompt, {"temperature": 0.0, "max_new_tokens": 12})
    engine_ids = [entry[1] for entry in direct["meta_info"]["output_token_logprobs"]]
    assert answer.model_extra["token_ids"] == engine_ids
    assert answer.model_extra["token_logprobs"] == pytest.approx(
        [entry[0] for entry in direct["meta_info"]["output_token_logprobs"]], abs=1e-5)
    assert answer.stop_reason == ("max_tokens" if len(engine_ids) == 12 else "end_turn")
    assert answer.content[0].text == text_model.decode(engine_ids)


async def test_a_streamed_answer_is_the_same_text_in_anthropics_events(cpu_engine, start_front, text_model, clients):
    _, url = await start_front([cpu_engine], text_model, router_chunk_tokens=4)
    client = clients(url)
    stream = await client.messages.create(model="tiny", max_tokens=10, messages=QUESTION, stream=True,
                                          extra_body={"ignore_eos": True, "temperature": 0})
    events = [event async for event in stream]
    kinds = [e.type for e in events]
    assert kinds[:2] == ["message_start", "content_block_start"] and kinds[-2:] == ["message_delta", "message_stop"]
    text = "".join(e.delta.text for e in events if e.type == "content_block_delta")
    delta = events[-2]
    assert delta.delta.stop_reason == "max_tokens" and delta.usage.output_tokens == 10
    assert text == text_model.decode(delta.model_extra["token_ids"]) and kinds.count("content_block_delta") >= 2
    async with client.messages.stream(model="tiny", max_tokens=10, messages=QUESTION,
                                      extra_body={"ignore_eos": True, "temperature": 0}) as helper:
        final = await helper.get_final_message()
    assert final.content[0].text == text and final.usage.output_tokens == 10  # greedy: the same answer


def test_the_standalone_router_command_serves_the_anthropic_client(cpu_engine, chat_model_dir):
    with standalone_router(cpu_engine, chat_model_dir, api_key="k") as url:
        with anthropic.Anthropic(base_url=url, api_key="k", max_retries=0) as client:
            answer = client.messages.create(model="any", max_tokens=4, messages=QUESTION, tools=[ADD])
            with client.messages.stream(model="any", max_tokens=4, messages=QUESTION) as stream:
                streamed = stream.get_final_message()
    assert answer.stop_reason in ("end_turn", "max_tokens", "tool_use") and answer.model == chat_model_dir.name
    assert streamed.content[0].type == "text" and 1 <= streamed.usage.output_tokens <= 4
    assert streamed.stop_reason in ("end_turn", "max_tokens")
