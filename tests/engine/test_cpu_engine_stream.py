"""CPU engine streamed /generate (``stream: true``): SGLang 0.5.17's framing and chunk semantics
(entrypoints/http_server.py ``generate_request``, tokenizer_manager ``_handle_batch_output`` with
incremental_streaming_output off), abort mid-stream, and the client that assembles the chunks.

Against the shared engine (2 running requests), and one of its own with --incremental-streaming-output
whose weights a test changes; every test ends what it started.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from typing import Any

import aiohttp
import orjson
import pytest

from slime_async.engine_client import EngineClient
from slime_async.generate_output import SSEDecoder, StreamAssembler, parse_generate_output

PROMPT = [5, 6, 7]
SHORT = {"temperature": 0, "max_new_tokens": 8, "ignore_eos": True}
LONG = {"temperature": 0, "max_new_tokens": 1000, "ignore_eos": True}


class RawStream:
    """One streamed /generate read event by event (``data`` payloads, decoded JSON or b"[DONE]")."""

    def __init__(self, response: aiohttp.ClientResponse):
        self.response = response
        self._decoder = SSEDecoder()
        self._pending: list[bytes] = []

    async def next(self) -> Any:
        while not self._pending:
            data = await self.response.content.readany()
            if not data:
                raise EOFError("the stream ended")
            self._pending = self._decoder.feed(data)
        event = self._pending.pop(0)
        return event if event == b"[DONE]" else orjson.loads(event)

    async def rest(self) -> list[Any]:
        events = []
        while not events or events[-1] != b"[DONE]":
            events.append(await self.next())
        return events


async def open_stream(http: aiohttp.ClientSession, url: str, params: dict, rid: str | None = None) -> RawStream:
    body: dict[str, Any] = {"input_ids": PROMPT, "sampling_params": params, "return_logprob": True, "stream": True}
    if rid is not None:
        body["rid"] = rid
    response = await http.post(url + "/generate", json=body)
    assert response.status == 200, await response.text()
    assert response.content_type == "text/event-stream"
    return RawStream(response)


async def plain(http: aiohttp.ClientSession, url: str, params: dict) -> dict:
    body = {"input_ids": PROMPT, "sampling_params": params, "return_logprob": True}
    async with http.post(url + "/generate", json=body) as response:
        assert response.status == 200, await response.text()
        return await response.json()


async def server_stats(http: aiohttp.ClientSession, url: str) -> dict:
    async with http.get(url + "/server_info") as response:
        return (await response.json())["internal_states"][0]


@pytest.fixture
async def stream_http(engine_url: str) -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
        yield session
        async with session.post(engine_url + "/abort_request", json={"abort_all": True}):
            pass


async def test_a_stream_is_data_framed_cumulative_chunks_then_the_plain_answer_then_done(engine_url, stream_http):
    async with aiohttp.ClientSession() as raw:
        async with raw.post(engine_url + "/generate", json={"input_ids": PROMPT, "sampling_params": SHORT,
                                                            "return_logprob": True, "stream": True}) as response:
            body = await response.read()
    events = body.split(b"\n\n")
    assert events[-2:] == [b"data: [DONE]", b""] and all(e.startswith(b"data: ") for e in events[:-1])
    chunks = [orjson.loads(e[len(b"data: "):]) for e in events[:-2]]
    for before, after in zip(chunks, chunks[1:]):  # each chunk holds everything so far
        assert after["output_ids"][:len(before["output_ids"])] == before["output_ids"]
        assert before["meta_info"]["finish_reason"] is None
    for c in chunks:
        meta = c["meta_info"]
        assert meta["completion_tokens"] == len(c["output_ids"]) == len(meta["output_token_logprobs"])
        assert [entry[1] for entry in meta["output_token_logprobs"]] == c["output_ids"]
        assert meta["weight_version"] == "default"
    answer = await plain(stream_http, engine_url, SHORT)
    assert chunks[-1]["output_ids"] == answer["output_ids"]
    assert chunks[-1]["meta_info"]["finish_reason"] == answer["meta_info"]["finish_reason"] == {
        "type": "length", "length": 8}
    assert chunks[-1]["meta_info"]["weight_version_segments"] == [["default", 8]]


async def test_the_client_assembles_a_stream_into_the_plain_answer(engine_url):
    async with EngineClient(engine_url) as client:
        streamed = parse_generate_output(await client.generate(PROMPT, SHORT, stream=True))
        answer = parse_generate_output(await client.generate(PROMPT, SHORT))
    assert (streamed.output_ids, streamed.finish_type, streamed.token_versions) == (
        answer.output_ids, answer.finish_type, answer.token_versions)
    assert streamed.logprobs == pytest.approx(answer.logprobs, abs=1e-5)


async def test_an_aborted_stream_ends_with_the_tokens_and_logprobs_so_far(engine_url, stream_http):
    stream = await open_stream(stream_http, engine_url, LONG, rid="streamed-victim")
    first = await stream.next()
    assert first["meta_info"]["finish_reason"] is None and first["output_ids"]
    async with stream_http.post(engine_url + "/abort_request", json={"rid": "streamed-victim"}) as response:
        assert response.status == 200
    *chunks, done = await stream.rest()
    last = chunks[-1]
    assert done == b"[DONE]"
    assert last["meta_info"]["finish_reason"]["type"] == "abort"
    n = len(last["output_ids"])
    assert len(first["output_ids"]) <= n < LONG["max_new_tokens"]
    assert [entry[1] for entry in last["meta_info"]["output_token_logprobs"]] == last["output_ids"]
    greedy = (await plain(stream_http, engine_url, {**LONG, "max_new_tokens": n}))["output_ids"]
    assert last["output_ids"] == greedy  # a prefix to resume from, like the plain call's abort


async def test_a_client_that_leaves_a_stream_has_its_request_aborted(engine_url, stream_http):
    aborted = (await server_stats(stream_http, engine_url))["num_aborted"]
    stream = await open_stream(stream_http, engine_url, LONG)
    await stream.next()
    stream.response.close()  # hangs up mid-stream
    async with asyncio.timeout(60):
        while (await server_stats(stream_http, engine_url))["num_aborted"] == aborted:
            await asyncio.sleep(0.01)


async def test_a_stream_takes_one_prompt(engine_url, stream_http):
    body = {"input_ids": [PROMPT, PROMPT], "sampling_params": SHORT, "stream": True}
    async with stream_http.post(engine_url + "/generate", json=body) as response:
        assert response.status == 400
        assert "single prompt" in (await response.json())["error"]["message"]


# ---- an engine of its own: --incremental-streaming-output, and weights that change


@pytest.fixture(scope="module")
def incremental_engine(start_engine, tiny_model_dir) -> Iterator[str]:
    with start_engine(tiny_model_dir, "--incremental-streaming-output") as url:
        yield url


async def test_incremental_chunks_hold_only_their_new_tokens_and_assemble_into_the_plain_answer(
        incremental_engine, stream_http):
    url = incremental_engine
    stream = await open_stream(stream_http, url, SHORT)
    *chunks, done = await stream.rest()
    assert done == b"[DONE]"
    counts = [c["meta_info"]["completion_tokens"] for c in chunks]
    assert [len(c["output_ids"]) for c in chunks] == [b - a for a, b in zip([0, *counts], counts)]
    assert [t for c in chunks for t in c["output_ids"]] == (await plain(stream_http, url, SHORT))["output_ids"]
    async with EngineClient(url) as client:
        streamed = parse_generate_output(await client.generate(PROMPT, SHORT, stream=True))
        answer = parse_generate_output(await client.generate(PROMPT, SHORT))
    assert (streamed.output_ids, streamed.finish_type) == (answer.output_ids, answer.finish_type)
    assert streamed.logprobs == pytest.approx(answer.logprobs, abs=1e-5)


async def test_the_versions_the_chunks_name_agree_token_for_token_with_the_engines_own_split(
        incremental_engine, stream_http, other_weights_dir):
    # An in-place weight update mid-stream; the engine's weight_version_segments are the truth.
    url = incremental_engine
    stream = await open_stream(stream_http, url, {**LONG, "max_new_tokens": 600})
    chunks = [await stream.next()]
    while chunks[-1]["meta_info"]["completion_tokens"] < 8:
        chunks.append(await stream.next())
    for path, body in [("/pause_generation", {"mode": "in_place"}),
                       ("/update_weights_from_disk", {"model_path": str(other_weights_dir), "weight_version": "1",
                                                      "flush_cache": False}),
                       ("/continue_generation", {})]:
        async with stream_http.post(url + path, json=body) as response:
            assert response.status == 200, await response.text()
    *rest, done = await stream.rest()
    chunks += rest
    truth = chunks[-1]["meta_info"].pop("weight_version_segments")
    assert [version for version, _ in truth] == ["default", "1"] and 8 <= truth[0][1] < 600
    assembler = StreamAssembler()
    for chunk in chunks:
        assembler.add(chunk)
    assert assembler.answer()["meta_info"]["weight_version_segments"] == truth


async def test_a_stream_with_top_logprobs_assembles_into_the_plain_answers(engine_url):
    async with EngineClient(engine_url) as client:
        streamed = parse_generate_output(await client.generate(PROMPT, SHORT, stream=True, top_logprobs_num=2))
        answer = parse_generate_output(await client.generate(PROMPT, SHORT, top_logprobs_num=2))
    assert [[t for _, t in top] for top in streamed.top_logprobs] == [[t for _, t in top] for top in answer.top_logprobs]
    assert [lp for top in streamed.top_logprobs for lp, _ in top] == pytest.approx(
        [lp for top in answer.top_logprobs for lp, _ in top], abs=1e-5)
    assert len(streamed.top_logprobs) == len(streamed.output_ids) == SHORT["max_new_tokens"]
