"""The HTTP front over a real CPU engine, driven by the stock ``openai`` client and by plain HTTP
as slime's plug-ins use SGLang's /generate; and the standalone ``slime-async router`` command."""

import aiohttp
import openai
import pytest

from slime_async.engine_client import EngineClient
from slime_async.stop_strings import find_stop
from tests.front.conftest import ADD_TOOL, standalone_router

QUESTION = [{"role": "user", "content": "What is 2 + 3?"}]


async def test_chat_answers_with_exactly_the_engines_tokens_and_logprobs(cpu_engine, start_front, text_model):
    _, url = await start_front([cpu_engine], text_model)
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused")
    answer = await client.chat.completions.create(model="tiny", messages=QUESTION, max_tokens=12, temperature=0,
                                                  logprobs=True)
    choice = answer.choices[0]
    prompt = answer.model_extra["prompt_token_ids"]
    assert prompt == text_model.encode(text_model.render_chat(QUESTION))
    async with EngineClient(cpu_engine) as engine:
        direct = await engine.generate(prompt, {"temperature": 0.0, "max_new_tokens": 12})
    engine_ids = [entry[1] for entry in direct["meta_info"]["output_token_logprobs"]]
    engine_logprobs = [entry[0] for entry in direct["meta_info"]["output_token_logprobs"]]
    assert choice.model_extra["token_ids"] == engine_ids
    assert choice.model_extra["token_logprobs"] == pytest.approx(engine_logprobs, abs=1e-5)
    assert [entry.logprob for entry in choice.logprobs.content] == pytest.approx(engine_logprobs, abs=1e-5)
    assert choice.message.content == text_model.decode(engine_ids) or choice.finish_reason == "stop"
    assert answer.usage.prompt_tokens == len(prompt) and answer.usage.completion_tokens == len(engine_ids)
    assert answer.model_extra["weight_version"] == direct["meta_info"]["weight_version"]


async def test_chat_with_tools_renders_them_through_the_template(cpu_engine, start_front, text_model):
    _, url = await start_front([cpu_engine], text_model)
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused")
    answer = await client.chat.completions.create(model="tiny", messages=QUESTION, tools=[ADD_TOOL], max_tokens=8,
                                                  n=2)
    prompt_text = text_model.decode(answer.model_extra["prompt_token_ids"], skip_special_tokens=False)
    assert prompt_text.startswith("<|im_start|>system\n# Tools\n<tools>\n") and '"name": "add"' in prompt_text
    assert len(answer.choices) == 2
    for choice in answer.choices:  # a random model writes no call: its text is the content
        assert choice.finish_reason in ("stop", "length") and isinstance(choice.message.content, str)


async def test_streamed_chat_deltas_add_up_to_the_tokens_generated(cpu_engine, start_front, text_model):
    _, url = await start_front([cpu_engine], text_model, router_chunk_tokens=4)
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused")
    stream = await client.chat.completions.create(model="tiny", messages=QUESTION, max_tokens=10, stream=True,
                                                  stream_options={"include_usage": True},
                                                  extra_body={"ignore_eos": True})
    chunks = [chunk async for chunk in stream]
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    ids = [t for c in chunks if c.choices for t in (c.choices[0].model_extra or {}).get("token_ids") or []]
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(ids) == 10 and content == text_model.decode(ids) and finishes == ["length"]
    assert len([c for c in chunks if c.choices and c.choices[0].delta.content]) >= 2  # several 4-token chunks
    assert chunks[-1].usage.completion_tokens == 10


async def test_generate_answers_text_prompts_in_sglangs_format(cpu_engine, start_front, text_model):
    _, url = await start_front([cpu_engine], text_model)
    async with aiohttp.ClientSession() as http:
        body = {"text": "1+2=", "sampling_params": {"max_new_tokens": 6, "temperature": 0}, "return_logprob": True}
        async with http.post(url + "/generate", json=body) as response:
            answer = await response.json()
    meta = answer["meta_info"]
    assert meta["prompt_tokens"] == len(text_model.encode_prompt("1+2="))
    assert [entry[1] for entry in meta["output_token_logprobs"]] == answer["output_ids"]
    assert answer["text"] == text_model.decode(answer["output_ids"]) or meta["finish_reason"]["type"] == "stop"
    assert meta["completion_tokens"] == len(answer["output_ids"]) and meta["weight_version"] is not None


async def test_generate_passes_prompt_logprobs_through_as_the_engine_answers_them(cpu_engine, start_front,
                                                                                   text_model):
    # On-policy distillation's scoring request (max_new_tokens 0), and prompt logprobs beside a generation.
    _, url = await start_front([cpu_engine], text_model)
    prompt = text_model.encode_prompt("12+30=42")
    scoring = {"input_ids": prompt, "sampling_params": {"max_new_tokens": 0, "temperature": 1.0},
               "return_logprob": True, "logprob_start_len": 2}
    generating = {**scoring, "sampling_params": {"max_new_tokens": 3, "temperature": 0}}
    async with aiohttp.ClientSession() as http, EngineClient(cpu_engine) as engine:
        for body in (scoring, generating):
            async with http.post(url + "/generate", json=body) as response:
                answer = await response.json()
            direct = await engine.generate(prompt, body["sampling_params"], logprob_start_len=2)
            entries = answer["meta_info"]["input_token_logprobs"]
            assert [entry[1] for entry in entries] == prompt[2:] and entries[0][0] is None
            assert [e[0] for e in entries[1:]] == pytest.approx(
                [e[0] for e in direct["meta_info"]["input_token_logprobs"][1:]], abs=1e-5)
            assert len(answer["output_ids"]) == body["sampling_params"]["max_new_tokens"]
        async with http.post(url + "/generate", json={**scoring, "logprob_start_len": len(prompt) + 1}) as response:
            assert response.status == 400 and "logprob_start_len" in (await response.json())["error"]["message"]


async def test_generate_honours_a_text_stop_string_with_and_without_no_stop_trim(cpu_engine, start_front, text_model):
    _, url = await start_front([cpu_engine], text_model)
    params = {"max_new_tokens": 24, "temperature": 0, "ignore_eos": True}
    async with aiohttp.ClientSession() as http:
        async def generate(**extra):
            body = {"text": "Using the numbers", "sampling_params": params | extra, "return_logprob": True}
            async with http.post(url + "/generate", json=body) as response:
                assert response.status == 200, await response.text()
                return await response.json()

        reference = await generate()
        ids = reference["output_ids"]
        stop, expected_cut = _stop_completing_mid_answer(ids, text_model.decode)
        kept = await generate(stop=stop, no_stop_trim=True)
        trimmed = await generate(stop=[stop])
    for answer in (kept, trimmed):
        assert answer["output_ids"] == ids[:expected_cut]
        assert answer["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    full = text_model.decode(ids[:expected_cut])
    assert kept["text"] == full and stop in kept["text"]
    assert trimmed["text"] == full[:full.find(stop)]


async def test_what_sglang_does_not_check_is_refused_by_the_front_naming_the_field(cpu_engine, start_front,
                                                                                      text_model):
    # SGLang 0.5.17 does not check them and its scheduler dies on one (slime_async/token_ids.py); the
    # messages name the position in the client's request, so they come from the front, not the engine.
    _, url = await start_front([cpu_engine], text_model)
    vocab = text_model.vocab_size
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.BadRequestError, match=rf"prompt\[1\]={vocab} is outside the vocabulary \[0, {vocab}\)"):
        await client.completions.create(model=text_model.name, prompt=[5, vocab], max_tokens=2)
    async with aiohttp.ClientSession() as http:
        body = {"input_ids": [[5, 6], [7, -1]], "sampling_params": {"max_new_tokens": 2}}
        async with http.post(url + "/generate", json=body) as response:
            message = (await response.json())["error"]["message"]
            assert response.status == 400 and message == f"input_ids[1][1]=-1 is outside the vocabulary [0, {vocab})"
        for field, value, named in (
                ("top_logprobs_num", vocab + 1, f"top_logprobs_num must be an integer in [0, {vocab}]"),
                ("logprob_start_len", -2, "logprob_start_len must be -1 or a position")):
            body = {"input_ids": [5, 6], "return_logprob": True, field: value}
            async with http.post(url + "/generate", json=body) as response:
                assert response.status == 400 and named in (await response.json())["error"]["message"]


async def test_completions_and_models(cpu_engine, start_front, text_model):
    _, url = await start_front([cpu_engine], text_model, router_served_model_name="tiny-qwen")
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused")
    assert [m.id for m in (await client.models.list()).data] == ["tiny-qwen"]
    answer = await client.completions.create(model="tiny-qwen", prompt=["1+1=", "2+2="], max_tokens=4, n=2,
                                             logprobs=0)
    assert len(answer.choices) == 4 and answer.model == "tiny-qwen"
    for choice in answer.choices:
        assert len(choice.logprobs.token_logprobs) == len(choice.model_extra["token_ids"]) <= 4


def _stop_completing_mid_answer(ids, decode):
    """A two-character stop string whose first occurrence in ``decode(ids)`` is completed by a
    token in the middle of the answer, and that token's position + 1."""
    for k in range(4, len(ids)):
        stop = decode(ids[:k])[-2:]
        if len(stop.strip()) == 2 and find_stop(ids, decode, [stop]) == (k, stop):
            return stop, k
    raise AssertionError("no usable stop string in the reference answer")


def test_the_standalone_router_command_serves_the_openai_client(cpu_engine, chat_model_dir):
    with standalone_router(cpu_engine, chat_model_dir, api_key="k") as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="k")
        answer = client.chat.completions.create(model=chat_model_dir.name, messages=QUESTION, max_tokens=4)
        assert answer.choices[0].finish_reason in ("stop", "length") and answer.model == chat_model_dir.name


async def test_chat_top_logprobs_are_the_engines_alternatives_streamed_or_not(cpu_engine, start_front, text_model):
    _, url = await start_front([cpu_engine], text_model, router_chunk_tokens=4)
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused")
    ask = {"model": "tiny", "messages": QUESTION, "max_tokens": 6, "temperature": 0, "logprobs": True,
           "top_logprobs": 3, "extra_body": {"ignore_eos": True}}
    answer = await client.chat.completions.create(**ask)
    content = answer.choices[0].logprobs.content
    async with EngineClient(cpu_engine) as engine:
        direct = await engine.generate(answer.model_extra["prompt_token_ids"],
                                       {"temperature": 0.0, "max_new_tokens": 6, "ignore_eos": True},
                                       top_logprobs_num=3)
    engine_tops = direct["meta_info"]["output_top_logprobs"]
    assert [[alt.token for alt in entry.top_logprobs] for entry in content] == [
        [text_model.token_text(t) for _, t, _ in top] for top in engine_tops]
    assert [alt.logprob for entry in content for alt in entry.top_logprobs] == pytest.approx(
        [lp for top in engine_tops for lp, _, _ in top], abs=1e-5)
    assert all(entry.top_logprobs[0].token == entry.token and entry.top_logprobs[0].bytes == list(entry.token.encode())
               for entry in content)  # greedy: the most likely is the one chosen
    stream = await client.chat.completions.create(**ask, stream=True)
    streamed = [entry async for chunk in stream if chunk.choices and chunk.choices[0].logprobs
                for entry in chunk.choices[0].logprobs.content]
    # (the stream's 4-token requests reuse cached KV: logprobs equal up to float rounding)
    assert [[alt.token for alt in e.top_logprobs] for e in streamed] == [[alt.token for alt in e.top_logprobs]
                                                                           for e in content]
    assert [alt.logprob for e in streamed for alt in e.top_logprobs] == pytest.approx(
        [alt.logprob for e in content for alt in e.top_logprobs], abs=1e-5)


async def test_responses_and_completions_return_top_logprobs(cpu_engine, start_front, text_model):
    _, url = await start_front([cpu_engine], text_model)
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused")
    response = await client.responses.create(model="tiny", input="What is 2 + 3?", max_output_tokens=5, temperature=0,
                                             top_logprobs=2, include=["message.output_text.logprobs"],
                                             extra_body={"ignore_eos": True})
    logprobs = response.output[0].content[0].logprobs
    assert len(logprobs) == 5 and all(len(entry.top_logprobs) == 2 for entry in logprobs)
    assert [entry.top_logprobs[0].logprob for entry in logprobs] == pytest.approx(
        response.model_extra["token_logprobs"], abs=1e-6)
    completion = await client.completions.create(model="tiny", prompt="1+2=", max_tokens=4, temperature=0, logprobs=2,
                                                 extra_body={"ignore_eos": True})
    tops = completion.choices[0].logprobs.top_logprobs
    assert len(tops) == 4 and all(1 <= len(top) <= 2 for top in tops)
    assert [max(top.values()) for top in tops] == pytest.approx(completion.choices[0].logprobs.token_logprobs, abs=1e-6)
