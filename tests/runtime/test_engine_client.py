"""EngineClient against a real aiohttp server on loopback whose answers each test scripts.

Protocol behaviour against a real engine lives in tests/contract/; these tests pin down the
client's own transport rules: what is retried, what is not, and what an error says.
"""

from __future__ import annotations

import asyncio
import dataclasses
import pickle
import socket
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson
import pytest
import pytest_asyncio
from aiohttp import web

from slime_async.engine_client import (
    EngineClient,
    EngineConnectionError,
    EngineError,
    EngineHTTPError,
    EngineTimeout,
    EngineUnreachable,
    RetryPolicy,
)
from slime_async.generate_output import parse_generate_output

NO_WAIT = RetryPolicy(attempts=4, initial_delay=0.0, max_delay=0.0)

DROP = "drop"  # close the connection after reading the request
HANG = "hang"  # never answer


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    body: Any


@dataclass
class Stream:
    """A streamed answer: these chunks as server-sent events, then ``data: [DONE]`` unless
    ``done`` is False; ``drop`` closes the connection after the chunks instead; ``hang`` waits
    for the engine's release after them."""

    chunks: list[Any]
    done: bool = True
    drop: bool = False
    hang: bool = False


@dataclass
class ScriptedEngine:
    """Answers each path from a script: a list of (status, body) or DROP / HANG; the last repeats."""

    scripts: dict[str, list[Any]] = field(default_factory=dict)
    seen: list[Seen] = field(default_factory=list)
    release: asyncio.Event = field(default_factory=asyncio.Event)
    url: str = ""

    def reply(self, path: str, *answers: Any) -> None:
        self.scripts[path] = list(answers)

    def calls(self, path: str) -> list[Seen]:
        return [s for s in self.seen if s.path == path]

    async def handle(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        body = orjson.loads(raw) if raw else None
        self.seen.append(Seen(request.method, request.path, dict(request.headers), body))
        script = self.scripts.get(request.path, [(200, {"ok": True})])
        answer = script.pop(0) if len(script) > 1 else script[0]
        if answer == DROP:
            request.transport.close()
            return web.Response()
        if answer == HANG:
            await self.release.wait()
            return web.Response()
        if isinstance(answer, Stream):
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await response.prepare(request)
            for chunk in answer.chunks:
                await response.write(b"data: " + orjson.dumps(chunk) + b"\n\n")
            if answer.drop:
                request.transport.close()
                return response
            if answer.hang:
                await self.release.wait()
            if answer.done:
                await response.write(b"data: [DONE]\n\n")
            return response
        status, payload = answer
        if isinstance(payload, (dict, list)):
            return web.Response(status=status, body=orjson.dumps(payload), content_type="application/json")
        return web.Response(status=status, text=payload)


async def _serve(engine: ScriptedEngine, sock: socket.socket | None = None) -> web.AppRunner:
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", engine.handle)
    runner = web.AppRunner(app, shutdown_timeout=0.5)
    await runner.setup()
    if sock is None:
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
    else:
        site = web.SockSite(runner, sock)
        await site.start()
        port = sock.getsockname()[1]
    engine.url = f"http://127.0.0.1:{port}"
    return runner


@pytest_asyncio.fixture
async def engine():
    engine = ScriptedEngine()
    runner = await _serve(engine)
    yield engine
    engine.release.set()
    await runner.cleanup()


@pytest_asyncio.fixture
async def client(engine):
    async with EngineClient(engine.url, retry=NO_WAIT) as client:
        yield client


GENERATE_ANSWER = {
    "output_ids": [5, 6],
    "meta_info": {
        "output_token_logprobs": [[-0.5, 5, None], [-1.25, 6, None]],
        "finish_reason": {"type": "length", "length": 2},
        "prompt_tokens": 3,
        "completion_tokens": 2,
        "cached_tokens": 1,
        "weight_version": "7",
    },
}


# ---- request shapes


@pytest.mark.asyncio
async def test_generate_posts_sglang_native_payload(engine, client):
    engine.reply("/generate", (200, GENERATE_ANSWER))
    answer = await client.generate([1, 2, 3], {"max_new_tokens": 2, "temperature": 0.0}, rid="r1")
    assert answer == GENERATE_ANSWER
    (call,) = engine.calls("/generate")
    assert call.method == "POST"
    assert call.body == {
        "input_ids": [1, 2, 3],
        "sampling_params": {"max_new_tokens": 2, "temperature": 0.0},
        "return_logprob": True,
        "rid": "r1",
    }


def stream_of(answer: dict[str, Any], versions: list[str]) -> list[dict[str, Any]]:
    """``answer`` as SGLang streams it by default: one cumulative chunk per token, the i-th built
    under ``versions[i]``, finish_reason only on the last."""
    meta, n = answer["meta_info"], len(answer["output_ids"])
    return [{"output_ids": answer["output_ids"][:i + 1],
             "meta_info": {**meta, "output_token_logprobs": meta["output_token_logprobs"][:i + 1],
                           "completion_tokens": i + 1, "weight_version": versions[i],
                           "finish_reason": meta["finish_reason"] if i + 1 == n else None}}
            for i in range(n)]


@pytest.mark.asyncio
async def test_a_streamed_generate_asks_for_a_stream_and_returns_the_plain_answer_with_chunk_versions(engine, client):
    engine.reply("/generate", Stream(stream_of(GENERATE_ANSWER, ["6", "7"])))
    answer = await client.generate([1, 2, 3], {"max_new_tokens": 2}, rid="r1", stream=True)
    assert engine.calls("/generate")[0].body["stream"] is True
    expected = dataclasses.replace(parse_generate_output(GENERATE_ANSWER), token_versions=["6", "7"])
    assert parse_generate_output(answer) == expected


@pytest.mark.asyncio
async def test_a_streamed_abort_returns_the_tokens_so_far(engine, client):
    chunks = stream_of(GENERATE_ANSWER, ["7", "7"])
    chunks[-1]["meta_info"]["finish_reason"] = {"type": "abort", "message": "Aborted", "status_code": None}
    engine.reply("/generate", Stream(chunks))
    out = parse_generate_output(await client.generate([1], {"max_new_tokens": 8}, stream=True))
    assert (out.output_ids, out.logprobs, out.finish_type) == ([5, 6], [-0.5, -1.25], "abort")


@pytest.mark.parametrize("last, status, message", [
    ({"error": {"message": "prompt too long", "type": "invalid_request_error", "code": 400}}, 400, "prompt too long"),
    ({"output_ids": [], "meta_info": {"completion_tokens": 0, "finish_reason": {
        "type": "abort", "message": "engine step failed", "status_code": 500}}}, 500, "engine step failed"),
])
@pytest.mark.asyncio
async def test_a_failure_in_the_stream_raises_the_http_error_the_plain_call_would(engine, client, last, status, message):
    engine.reply("/generate", Stream(stream_of(GENERATE_ANSWER, ["7", "7"])[:1] + [last]))
    with pytest.raises(EngineHTTPError, match=message) as info:
        await client.generate([1], {"max_new_tokens": 2}, stream=True)
    assert info.value.status == status and engine.url in str(info.value)


@pytest.mark.asyncio
async def test_a_stream_that_breaks_off_is_a_connection_error_and_is_not_retried(engine, client):
    engine.reply("/generate", Stream(stream_of(GENERATE_ANSWER, ["7", "7"])[:1], drop=True))
    with pytest.raises(EngineConnectionError, match="after 1 tokens"):
        await client.generate([1], {"max_new_tokens": 2}, stream=True)
    assert len(engine.calls("/generate")) == 1


@pytest.mark.asyncio
async def test_a_stream_done_before_a_finished_chunk_is_rejected(engine, client):
    engine.reply("/generate", Stream(stream_of(GENERATE_ANSWER, ["7", "7"])[:1]))
    with pytest.raises(EngineHTTPError, match="no chunk had a finish_reason"):
        await client.generate([1], {"max_new_tokens": 2}, stream=True)


@pytest.mark.asyncio
async def test_a_streamed_generate_times_out_mid_stream(engine, client):
    engine.reply("/generate", Stream(stream_of(GENERATE_ANSWER, ["7", "7"])[:1], hang=True))
    with pytest.raises(EngineTimeout, match="1 tokens received"):
        await client.generate([1], {"max_new_tokens": 2}, stream=True, timeout=0.3)


@pytest.mark.asyncio
async def test_an_error_status_or_a_plain_answer_to_a_stream_request_is_taken_as_the_plain_call_takes_it(engine,
                                                                                                       client):
    engine.reply("/generate", (400, {"error": {"message": "input_ids out of range"}}), (200, GENERATE_ANSWER))
    with pytest.raises(EngineHTTPError, match="input_ids out of range"):
        await client.generate([1], {"max_new_tokens": 2}, stream=True)
    assert await client.generate([1], {"max_new_tokens": 2}, stream=True) == GENERATE_ANSWER


@pytest.mark.asyncio
async def test_generate_batch_sends_a_list_of_prompts_and_returns_one_answer_each(engine, client):
    engine.reply("/generate", (200, [GENERATE_ANSWER, GENERATE_ANSWER]))
    answers = await client.generate_batch([[1], [2, 3]], {"max_new_tokens": 2}, rids=["a", "b"])
    assert len(answers) == 2
    assert engine.calls("/generate")[0].body["input_ids"] == [[1], [2, 3]]
    assert engine.calls("/generate")[0].body["rid"] == ["a", "b"]


@pytest.mark.asyncio
async def test_an_unknown_sampling_field_fails_before_sending_and_names_the_field(engine, client):
    # SGLang answers it with an HTTP 500 (a TypeError in its tokenizer manager).
    with pytest.raises(ValueError, match="unknown sampling_params field 'temprature' \\(did you mean 'temperature'\\?\\)"):
        await client.generate([1], {"temprature": 0.5})
    with pytest.raises(ValueError, match="'top_q'"):
        await client.generate_batch([[1], [2]], [{"top_p": 1.0}, {"top_q": 1.0}])
    assert engine.calls("/generate") == []


@pytest.mark.asyncio
async def test_generate_batch_rejects_an_answer_of_the_wrong_length(engine, client):
    engine.reply("/generate", (200, [GENERATE_ANSWER]))
    with pytest.raises(EngineHTTPError, match="batch of 2 prompts answered with a list of 1"):
        await client.generate_batch([[1], [2]], {"max_new_tokens": 2})


@pytest.mark.asyncio
async def test_control_endpoints_use_sglang_methods_and_bodies(engine, client):
    await client.pause_generation("retract")
    await client.continue_generation()
    await client.abort_request(rid="r9")
    await client.abort_request(abort_all=True)
    await client.flush_cache()
    await client.get_loads()
    assert [(s.method, s.path, s.body) for s in engine.seen] == [
        ("POST", "/pause_generation", {"mode": "retract"}),
        ("POST", "/continue_generation", {}),
        ("POST", "/abort_request", {"abort_all": False, "rid": "r9"}),
        ("POST", "/abort_request", {"abort_all": True}),
        ("GET", "/flush_cache", None),
        ("GET", "/v1/loads", None),
    ]


@pytest.mark.asyncio
async def test_weight_update_endpoints_send_sglang_request_fields(engine, client):
    await client.update_weights_from_disk("/ckpt/step_3", weight_version="3", flush_cache=False)
    await client.init_weights_update_group("127.0.0.1", 29500, 1, 2, "g", "gloo")
    await client.update_weights_from_distributed(["w"], ["float32"], [[2, 2]], "g", weight_version="4")
    await client.destroy_weights_update_group("g")
    bodies = {s.path: s.body for s in engine.seen}
    assert bodies["/update_weights_from_disk"] == {"model_path": "/ckpt/step_3", "weight_version": "3",
                                                   "flush_cache": False}
    assert bodies["/init_weights_update_group"] == {
        "master_address": "127.0.0.1",
        "master_port": 29500,
        "rank_offset": 1,
        "world_size": 2,
        "group_name": "g",
        "backend": "gloo",
    }
    assert bodies["/update_weights_from_distributed"] == {
        "names": ["w"],
        "dtypes": ["float32"],
        "shapes": [[2, 2]],
        "group_name": "g",
        "flush_cache": True,
        "weight_version": "4",
    }
    assert bodies["/destroy_weights_update_group"] == {"group_name": "g"}


@pytest.mark.asyncio
async def test_invalid_pause_mode_is_rejected_before_sending(engine, client):
    with pytest.raises(ValueError, match="pause mode"):
        await client.pause_generation("later")  # type: ignore[arg-type]
    assert engine.seen == []


@pytest.mark.asyncio
async def test_get_weight_version_reads_model_info(engine, client):
    # SGLang 0.5.17 answers 404 on /get_weight_version; /model_info carries the version.
    engine.reply("/get_weight_version", (404, {"detail": "deprecated"}))
    engine.reply("/model_info", (200, {"model_path": "/m", "weight_version": "12"}))
    assert await client.get_weight_version() == "12"


@pytest.mark.asyncio
async def test_info_falls_back_to_the_old_endpoint_names_of_older_sglang(engine, client):
    engine.reply("/model_info", (404, {"detail": "Not Found"}))
    engine.reply("/server_info", (404, {"detail": "Not Found"}))
    engine.reply("/get_model_info", (200, {"model_path": "/old"}))
    engine.reply("/get_server_info", (200, {"tp_size": 2}))
    assert (await client.get_model_info())["model_path"] == "/old"
    assert (await client.get_model_info())["model_path"] == "/old"
    assert (await client.get_server_info())["tp_size"] == 2
    # The new name is asked once; after its 404 the client goes straight to the old one.
    assert [s.path for s in engine.seen] == [
        "/model_info", "/get_model_info", "/get_model_info", "/server_info", "/get_server_info",
    ]


# ---- health


@pytest.mark.asyncio
async def test_health_is_false_on_503_and_true_on_200(engine, client):
    engine.reply("/health_generate", (503, ""), (200, ""))
    assert await client.health_generate() is False
    assert await client.health_generate() is True


@pytest.mark.asyncio
async def test_health_is_false_when_nothing_listens():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))  # bound, not listening: connections are refused
        async with EngineClient(f"http://127.0.0.1:{sock.getsockname()[1]}", retry=NO_WAIT) as client:
            assert await client.health() is False


# ---- retries


@pytest.mark.asyncio
async def test_idempotent_call_is_retried_on_5xx_until_it_succeeds(engine, client):
    engine.reply("/model_info", (503, "warming up"), (500, "oops"), (200, {"model_path": "/m"}))
    assert await client.get_model_info() == {"model_path": "/m"}
    assert len(engine.calls("/model_info")) == 3


@pytest.mark.asyncio
async def test_idempotent_call_gives_up_after_the_configured_attempts(engine, client):
    engine.reply("/server_info", (502, "bad gateway"))
    with pytest.raises(EngineHTTPError) as info:
        await client.get_server_info()
    assert info.value.status == 502
    assert len(engine.calls("/server_info")) == NO_WAIT.attempts


@pytest.mark.asyncio
async def test_4xx_is_never_retried(engine, client):
    engine.reply("/update_weights_from_disk", (400, {"success": False, "message": "no such dir"}))
    with pytest.raises(EngineHTTPError) as info:
        await client.update_weights_from_disk("/missing")
    assert info.value.status == 400
    assert len(engine.calls("/update_weights_from_disk")) == 1


@pytest.mark.asyncio
async def test_generate_is_not_retried_after_the_server_accepted_it(engine, client):
    engine.reply("/generate", (500, "scheduler died"), (200, GENERATE_ANSWER))
    with pytest.raises(EngineHTTPError):
        await client.generate([1], {"max_new_tokens": 1})
    assert len(engine.calls("/generate")) == 1


@pytest.mark.asyncio
async def test_generate_is_not_retried_when_the_connection_drops_after_sending(engine, client):
    engine.reply("/generate", DROP, (200, GENERATE_ANSWER))
    with pytest.raises(EngineConnectionError) as info:
        await client.generate([1], {"max_new_tokens": 1})
    assert not isinstance(info.value, EngineUnreachable)
    assert len(engine.calls("/generate")) == 1


@pytest.mark.asyncio
async def test_idempotent_call_is_retried_when_the_connection_drops(engine, client):
    engine.reply("/model_info", DROP, (200, {"model_path": "/m"}))
    assert await client.get_model_info() == {"model_path": "/m"}
    assert len(engine.calls("/model_info")) == 2


class _ListenOnFirstRetry(RetryPolicy):
    """Starts listening on a bound socket when the first attempt has failed, so the retry
    finds a server without any sleep-based timing in the test."""

    def __init__(self, sock: socket.socket, failed: asyncio.Event):
        super().__init__(attempts=3, initial_delay=0.0, max_delay=0.0)
        self.sock = sock
        self.failed = failed

    def delay(self, attempt: int) -> float:
        if not self.failed.is_set():
            self.sock.listen()  # from now on the kernel queues connections for the server
            self.failed.set()
        return 0.0


@pytest.mark.asyncio
async def test_generate_is_retried_when_the_connection_was_refused():
    engine = ScriptedEngine()
    engine.reply("/generate", (200, GENERATE_ANSWER))
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    failed = asyncio.Event()
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    async with EngineClient(url, retry=_ListenOnFirstRetry(sock, failed)) as client:
        call = asyncio.create_task(client.generate([1], {"max_new_tokens": 2}))
        await failed.wait()
        runner = await _serve(engine, sock)
        try:
            assert await call == GENERATE_ANSWER
        finally:
            await runner.cleanup()
    assert len(engine.calls("/generate")) == 1


@pytest.mark.asyncio
async def test_refused_connection_raises_unreachable_naming_the_url():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        async with EngineClient(url, retry=NO_WAIT) as client:
            with pytest.raises(EngineUnreachable) as info:
                await client.generate([1], {"max_new_tokens": 1})
    assert url in str(info.value)
    assert "/generate" in str(info.value)
    assert "cannot connect" in str(info.value)


# ---- timeouts


@pytest.mark.asyncio
async def test_per_call_timeout_raises_engine_timeout_without_retrying(engine, client):
    engine.reply("/generate", HANG)
    with pytest.raises(EngineTimeout) as info:
        await client.generate([1], {"max_new_tokens": 1}, timeout=0.2)
    assert engine.url in str(info.value) and "/generate" in str(info.value)
    assert len(engine.calls("/generate")) == 1


@pytest.mark.asyncio
async def test_client_default_timeout_applies_when_the_call_gives_none(engine):
    engine.reply("/model_info", HANG)
    async with EngineClient(engine.url, timeout=0.2, retry=NO_WAIT) as client:
        with pytest.raises(EngineTimeout):
            await client.get_model_info(timeout=None)


# ---- error messages


@pytest.mark.parametrize(
    "body, expected",
    [
        ({"object": "error", "message": "input_ids out of range", "type": "Bad Request", "code": 400}, "input_ids out of range"),
        ({"error": {"message": "nested message"}}, "nested message"),
        ({"success": False, "message": "cannot load /x"}, "cannot load /x"),
        ({"detail": "Not Found"}, "Not Found"),
        ("plain text failure", "plain text failure"),
    ],
)
@pytest.mark.asyncio
async def test_http_error_names_url_endpoint_status_and_the_server_message(engine, client, body, expected):
    engine.reply("/generate", (400, body))
    with pytest.raises(EngineHTTPError) as info:
        await client.generate([1], {"max_new_tokens": 1})
    text = str(info.value)
    assert engine.url in text
    assert "/generate" in text
    assert "HTTP 400" in text
    assert expected in text
    assert info.value.message == expected


@pytest.mark.asyncio
async def test_update_answered_200_with_success_false_is_an_error(engine, client):
    engine.reply("/update_weights_from_distributed", (200, {"success": False, "message": "shape mismatch for w"}))
    with pytest.raises(EngineHTTPError, match="shape mismatch for w"):
        await client.update_weights_from_distributed(["w"], ["float32"], [[3]])


def test_engine_errors_survive_pickling():
    error = EngineTimeout("http://h:1", "/generate", None, "no answer within 5 s")
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is EngineTimeout
    assert str(copy) == str(error)
    assert isinstance(copy, EngineError)


# ---- auth and sessions


@pytest.mark.asyncio
async def test_api_key_is_sent_as_bearer_token(engine):
    async with EngineClient(engine.url, api_key="s3cret") as client:
        await client.get_model_info()
    assert engine.seen[0].headers["Authorization"] == "Bearer s3cret"


@pytest.mark.asyncio
async def test_no_authorization_header_without_api_key(engine, client):
    await client.get_model_info()
    assert "Authorization" not in engine.seen[0].headers


@pytest.mark.asyncio
async def test_shared_session_is_used_by_many_clients_and_left_open(engine):
    async with aiohttp.ClientSession() as session:
        first = EngineClient(engine.url, session=session)
        second = EngineClient(engine.url, session=session)
        await first.get_model_info()
        await first.close()
        await second.get_model_info()  # still usable: closing a client leaves a shared session open
        assert not session.closed
    assert len(engine.seen) == 2


@pytest.mark.asyncio
async def test_own_session_is_created_lazily_and_closed(engine):
    client = EngineClient(engine.url)
    assert client._session is None
    await client.health()
    session = client._session
    await client.close()
    assert session.closed


# ---- parse_generate_output


def test_parse_generate_output_pairs_tokens_with_logprobs():
    out = parse_generate_output(GENERATE_ANSWER)
    assert out.output_ids == [5, 6]
    assert out.logprobs == [-0.5, -1.25]
    assert out.finish_type == "length"
    assert (out.prompt_tokens, out.completion_tokens, out.cached_tokens) == (3, 2, 1)
    assert out.weight_version == "7"


def test_parse_generate_output_keeps_a_stop_token_that_output_ids_trimmed():
    answer = {
        "output_ids": [5],
        "meta_info": {
            "output_token_logprobs": [[-0.5, 5, None], [-0.1, 2, None]],
            "finish_reason": {"type": "stop", "matched": 2},
        },
    }
    out = parse_generate_output(answer)
    assert out.output_ids == [5, 2]
    assert out.finish_type == "stop"
    assert out.finish_reason == {"type": "stop", "matched": 2}


def test_parse_generate_output_without_logprobs_uses_output_ids():
    out = parse_generate_output({"output_ids": [9, 8], "meta_info": {"finish_reason": {"type": "abort"}}})
    assert out.output_ids == [9, 8]
    assert out.logprobs is None
    assert out.finish_type == "abort"
    assert out.weight_version is None


def test_parse_generate_output_without_tokens_says_what_it_got():
    with pytest.raises(ValueError, match="neither output_ids nor"):
        parse_generate_output({"text": "hi", "meta_info": {}})


def test_parse_generate_output_of_a_request_aborted_while_queued_is_empty_not_an_error():
    # SGLang's answer to a request aborted before prefill carries neither field.
    answer = {"text": "", "meta_info": {"finish_reason": {"type": "abort", "message": "Abort before prefill"},
                                        "prompt_tokens": 3, "completion_tokens": 0}}
    out = parse_generate_output(answer)
    assert (out.output_ids, out.logprobs, out.finish_type) == ([], [], "abort")
