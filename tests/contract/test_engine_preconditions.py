"""Control sequences around a weight update that SGLang 0.5.17 survives, and its cache flush.

A flush needs a fully idle scheduler: nothing running (requests paused in place count) and
nothing queued (retracted requests wait in the queue). /flush_cache never kills the server: it
answers 400 "Flush cache failed." when busy, and with ?timeout=T waits for idle. The sequences
below are the ones the runtime may send; the ones SGLang dies on are refused by the CPU engine
(tests/engine/test_cpu_engine_preconditions.py). Against the CPU engine (which the suite runs
strict: it would exit where SGLang dies) or a real SGLang server (conftest.py).
"""

from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import pytest

from slime_async.engine_client import EngineClient
from slime_async.generate_output import parse_generate_output

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(300)]

PROMPT = [11, 42, 7, 99, 3, 250, 18]
GREEDY = {"temperature": 0.0, "max_new_tokens": 12, "ignore_eos": True}
# Long enough to be still decoding when the test pauses it, short enough to finish afterwards.
FINITE = {"temperature": 0.0, "max_new_tokens": 600, "ignore_eos": True}
FLUSHED = ("Cache flushed.\nPlease check backend logs for more details. "
           "(When there are running or waiting requests, the operation will not be performed.)\n")


async def _raw(engine_under_test, method: str, path: str, body: dict | None = None,
               params: dict | None = None) -> tuple[int, Any]:
    """One call without EngineClient's checks and retries: (status, JSON or text)."""
    headers = {"Authorization": f"Bearer {engine_under_test.api_key}"} if engine_under_test.api_key else {}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as session:
        async with session.request(method, engine_under_test.url + path, json=body, params=params,
                                   headers=headers) as response:
            if response.content_type == "application/json":
                return response.status, await response.json()
            return response.status, await response.text()


async def _flush(engine_under_test, timeout: float | None = None) -> tuple[int, str]:
    return await _raw(engine_under_test, "GET", "/flush_cache", params={"timeout": str(timeout)} if timeout else None)


async def _running(client: EngineClient) -> int:
    return sum(int(rank.get("num_running_reqs", 0)) for rank in (await client.get_loads()).get("loads") or [])


@asynccontextmanager
async def _long_request(client: EngineClient, params: dict):
    """A request decoding once this enters; afterwards generation continues and nothing is left running."""
    task = asyncio.create_task(client.generate(PROMPT, params))
    try:
        async with asyncio.timeout(60):
            while not await _running(client):
                await asyncio.sleep(0.01)
        yield task
    finally:
        await client.continue_generation()
        await client.abort_request(abort_all=True)
        await asyncio.wait({task}, timeout=60)


def _long(context_length: int) -> dict:
    return {**GREEDY, "max_new_tokens": context_length - len(PROMPT) - 8}


async def test_an_idle_flush_answers_200_with_sglangs_body(engine_under_test):
    assert await _flush(engine_under_test) == (200, FLUSHED)


async def test_a_flush_fails_while_a_request_is_paused_in_place(client, engine_under_test, context_length):
    async with _long_request(client, _long(context_length)):
        await client.pause_generation("in_place")
        assert await _flush(engine_under_test) == (400, "Flush cache failed.\n")


async def test_a_flush_after_a_retract_fails_until_the_retracted_request_is_aborted(
        client, engine_under_test, context_length):
    async with _long_request(client, _long(context_length)) as task:
        await client.pause_generation("retract")
        assert await _flush(engine_under_test) == (400, "Flush cache failed.\n")  # it waits in the queue
        await client.abort_request(abort_all=True)  # the queue is emptied at once, even while paused
        async with asyncio.timeout(60):
            assert parse_generate_output(await task).finish_type == "abort"
        assert await _flush(engine_under_test, timeout=60) == (200, FLUSHED)


async def test_a_deferred_flush_times_out_while_a_request_runs(client, engine_under_test, context_length):
    async with _long_request(client, _long(context_length)):
        assert await _flush(engine_under_test, timeout=0.05) == (400, "Timed out waiting for idle state.")


async def test_abort_then_a_deferred_flush_then_a_flushing_update_then_continue_serves_the_new_weights(
        client, engine_under_test, context_length, perturbed_model_dir, restore_weights):
    before = parse_generate_output(await client.generate(PROMPT, GREEDY))
    async with _long_request(client, _long(context_length)) as task:
        await client.pause_generation("abort")  # answers once the aborted requests have answered
        assert parse_generate_output(await task).finish_type == "abort"
        assert await _flush(engine_under_test, timeout=60) == (200, FLUSHED)
        status, answer = await _raw(engine_under_test, "POST", "/update_weights_from_disk",
                                    {"model_path": str(perturbed_model_dir), "weight_version": "after-abort"})
        assert status == 200 and answer["success"], answer
    after = parse_generate_output(await client.generate(PROMPT, GREEDY))
    assert after.output_ids != before.output_ids and after.weight_version == "after-abort"


async def test_pause_in_place_then_an_update_without_flush_then_continue_finishes_the_request(
        client, engine_under_test, perturbed_model_dir, restore_weights):
    async with _long_request(client, FINITE) as task:
        await client.pause_generation("in_place")
        assert await _running(client) == 1
        status, answer = await _raw(engine_under_test, "POST", "/update_weights_from_disk",
                                    {"model_path": str(perturbed_model_dir), "weight_version": "in-place",
                                     "flush_cache": False})
        assert status == 200 and answer["success"], answer
        await client.continue_generation()
        async with asyncio.timeout(120):
            out = parse_generate_output(await task)
    assert out.finish_type == "length" and len(out.output_ids) == FINITE["max_new_tokens"]
    assert out.weight_version == "in-place"  # the version current when its answer was built
    # The old weights' KV may still be cached: the flush the runtime sends once it can be idle.
    assert await _flush(engine_under_test, timeout=60) == (200, FLUSHED)
