"""CPU engine scheduling: continuous batching, queueing, prefix reuse, abort and pause modes.

The shared engine (conftest) allows 2 running requests and a 64-token prefix cache. "Long"
requests ask for hundreds of tokens so they are certainly still decoding while a test pokes
at them; every test aborts what it started.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest
import torch

LONG = {"temperature": 0, "max_new_tokens": 1000, "ignore_eos": True}


async def post(http: aiohttp.ClientSession, url: str, path: str, body: dict | None = None) -> Any:
    async with http.post(url + path, json=body or {}) as resp:
        assert resp.status == 200, await resp.text()
        return await resp.json() if resp.content_type == "application/json" else None


async def get(http: aiohttp.ClientSession, url: str, path: str) -> Any:
    async with http.get(url + path) as resp:
        assert resp.status == 200, await resp.text()
        return await resp.json()


async def loads(http: aiohttp.ClientSession, url: str) -> tuple[int, int]:
    entry = (await get(http, url, "/v1/loads"))["loads"][0]
    return entry["num_running_reqs"], entry["num_waiting_reqs"]


async def stats(http: aiohttp.ClientSession, url: str) -> dict[str, int]:
    return (await get(http, url, "/get_server_info"))["internal_states"][0]


async def wait_for_loads(http: aiohttp.ClientSession, url: str, running: int, waiting: int) -> None:
    async with asyncio.timeout(60):
        while await loads(http, url) != (running, waiting):
            await asyncio.sleep(0.01)


async def wait_until_held(http: aiohttp.ClientSession, url: str, held: int) -> None:
    """Until ``held`` requests wait for continue_generation (before the scheduler, as SGLang's
    tokenizer holds them: no queue of /v1/loads counts them)."""
    async with asyncio.timeout(60):
        while (await stats(http, url))["num_held_reqs"] != held:
            await asyncio.sleep(0.01)


def start(http: aiohttp.ClientSession, url: str, prompt: list[int], params: dict, **extra: Any) -> asyncio.Task:
    body = {"input_ids": prompt, "sampling_params": params, **extra}
    return asyncio.create_task(post(http, url, "/generate", body))


@pytest.fixture(autouse=True)
async def clean_engine(engine_url: str) -> Any:
    yield
    async with aiohttp.ClientSession() as http:
        await post(http, engine_url, "/continue_generation")
        await post(http, engine_url, "/abort_request", {"abort_all": True})
        await post(http, engine_url, "/flush_cache")


async def test_request_arriving_mid_decode_joins_the_running_batch(engine_url, http):
    long = start(http, engine_url, [11, 12, 13], LONG, rid="long")
    await wait_for_loads(http, engine_url, running=1, waiting=0)
    short = await post(
        http,
        engine_url,
        "/generate",
        {"input_ids": [21, 22], "sampling_params": {"max_new_tokens": 3, "ignore_eos": True}},
    )
    assert len(short["output_ids"]) == 3
    assert not long.done()  # the short one finished and left while the long one decodes on
    assert (await stats(http, engine_url))["max_running_batch"] == 2
    await post(http, engine_url, "/abort_request", {"rid": "long"})
    assert (await long)["meta_info"]["finish_reason"]["type"] == "abort"


async def test_requests_beyond_max_running_wait_in_the_queue(engine_url, http):
    tasks = [start(http, engine_url, [30 + i, 40], LONG) for i in range(3)]
    await wait_for_loads(http, engine_url, running=2, waiting=1)
    await post(http, engine_url, "/abort_request", {"abort_all": True})
    await asyncio.gather(*tasks)


async def test_abort_by_rid_returns_the_tokens_and_logprobs_so_far(engine_url, http):
    task = start(http, engine_url, [50, 51, 52], LONG, rid="victim", return_logprob=True)
    await wait_for_loads(http, engine_url, running=1, waiting=0)
    await post(http, engine_url, "/abort_request", {"rid": "victim"})
    out = await task
    meta = out["meta_info"]
    assert meta["finish_reason"]["type"] == "abort"
    assert 1 <= meta["completion_tokens"] < 1000
    assert [t for _, t, _ in meta["output_token_logprobs"]] == out["output_ids"]
    assert len(out["output_ids"]) == meta["completion_tokens"]


async def test_abort_all_also_ends_waiting_requests_with_no_tokens(engine_url, http):
    tasks = [start(http, engine_url, [60 + i, 61], LONG, rid=f"r{i}") for i in range(3)]
    await wait_for_loads(http, engine_url, running=2, waiting=1)
    await post(http, engine_url, "/abort_request", {"abort_all": True})
    outs = {o["meta_info"]["id"]: o for o in await asyncio.gather(*tasks)}
    assert all(o["meta_info"]["finish_reason"]["type"] == "abort" for o in outs.values())
    assert outs["r2"]["output_ids"] == []


async def test_a_client_that_disconnects_has_its_request_aborted(engine_url, http):
    aborted_before = (await stats(http, engine_url))["num_aborted"]
    task = start(http, engine_url, [55, 56], LONG)
    await wait_for_loads(http, engine_url, running=1, waiting=0)
    task.cancel()  # closes the connection mid-request
    await wait_for_loads(http, engine_url, running=0, waiting=0)
    assert (await stats(http, engine_url))["num_aborted"] == aborted_before + 1


async def test_pause_abort_returns_running_requests_and_holds_new_ones(engine_url, http):
    running = start(http, engine_url, [70, 71], LONG)
    await wait_for_loads(http, engine_url, running=1, waiting=0)
    await post(http, engine_url, "/pause_generation", {"mode": "abort"})
    assert (await running)["meta_info"]["finish_reason"]["type"] == "abort"
    held = start(http, engine_url, [72, 73], {"max_new_tokens": 2, "ignore_eos": True})
    await wait_until_held(http, engine_url, held=1)
    assert await loads(http, engine_url) == (0, 0)
    await post(http, engine_url, "/continue_generation")
    assert len((await held)["output_ids"]) == 2


async def test_pause_in_place_freezes_the_batch_and_resumes_it_unchanged(engine_url, http):
    params = {**LONG, "max_new_tokens": 300}
    reference = await post(http, engine_url, "/generate", {"input_ids": [80, 81], "sampling_params": params})
    await post(http, engine_url, "/flush_cache")
    task = start(http, engine_url, [80, 81], params)
    await wait_for_loads(http, engine_url, running=1, waiting=0)
    await post(http, engine_url, "/pause_generation", {"mode": "in_place"})
    steps = (await stats(http, engine_url))["num_decode_steps"]
    assert await loads(http, engine_url) == (1, 0)
    assert (await stats(http, engine_url))["num_decode_steps"] == steps
    await post(http, engine_url, "/continue_generation")
    assert (await task)["output_ids"] == reference["output_ids"]


async def test_pause_retract_requeues_running_requests_and_resumes_them(engine_url, http, recompute_logprobs):
    prompt = [90, 91, 92]
    task = start(http, engine_url, prompt, {**LONG, "max_new_tokens": 300}, return_logprob=True)
    await wait_for_loads(http, engine_url, running=1, waiting=0)
    retracted_before = (await stats(http, engine_url))["num_retracted"]
    await post(http, engine_url, "/pause_generation", {"mode": "retract"})
    assert await loads(http, engine_url) == (0, 1)
    # Its KV is freed, not cached: continuing re-prefills prompt + tokens so far (a flush would
    # fail here, the retracted request waits in the queue: test_cpu_engine_preconditions.py).
    await post(http, engine_url, "/continue_generation")
    out = await task
    assert out["meta_info"]["finish_reason"] == {"type": "length", "length": 300}
    assert (await stats(http, engine_url))["num_retracted"] == retracted_before + 1
    got = torch.tensor([lp for lp, _, _ in out["meta_info"]["output_token_logprobs"]])
    assert (got - recompute_logprobs(prompt, out["output_ids"], 1.0)).abs().max().item() < 1e-4


async def test_follow_up_turn_reuses_the_previous_turn_kv(engine_url, http):
    greedy = {"temperature": 0, "max_new_tokens": 5, "ignore_eos": True}
    turn1_prompt = [100, 101, 102, 103, 104, 105]
    turn1 = await post(http, engine_url, "/generate", {"input_ids": turn1_prompt, "sampling_params": greedy})
    turn2_prompt = turn1_prompt + turn1["output_ids"] + [106, 107]
    turn2 = await post(http, engine_url, "/generate", {"input_ids": turn2_prompt, "sampling_params": greedy})
    # Everything turn 1 fed through the model: its prompt and all but its last output token.
    assert turn2["meta_info"]["cached_tokens"] == len(turn1_prompt) + len(turn1["output_ids"]) - 1


async def test_cached_prefix_gives_the_same_tokens_and_logprobs_as_a_cold_start(engine_url, http):
    body = {
        "input_ids": [110, 111, 112, 113, 114],
        "sampling_params": {"temperature": 0.8, "max_new_tokens": 8, "ignore_eos": True, "sampling_seed": 5},
        "return_logprob": True,
    }
    cold = await post(http, engine_url, "/generate", body)
    warm = await post(http, engine_url, "/generate", body)
    assert cold["meta_info"]["cached_tokens"] == 0 and warm["meta_info"]["cached_tokens"] == 4
    assert warm["output_ids"] == cold["output_ids"]
    cold_lp = torch.tensor([lp for lp, _, _ in cold["meta_info"]["output_token_logprobs"]])
    warm_lp = torch.tensor([lp for lp, _, _ in warm["meta_info"]["output_token_logprobs"]])
    assert torch.allclose(cold_lp, warm_lp, atol=1e-5)


async def test_flush_cache_drops_reusable_prefixes(engine_url, http):
    body = {"input_ids": [120, 121, 122, 123], "sampling_params": {"max_new_tokens": 1}}
    await post(http, engine_url, "/generate", body)
    await post(http, engine_url, "/flush_cache")
    assert (await post(http, engine_url, "/generate", body))["meta_info"]["cached_tokens"] == 0


async def test_prefix_cache_evicts_least_recently_used_past_its_token_bound(engine_url, http):
    prompts = [[130 + i] * 25 for i in range(3)]  # 3 x 25 tokens > the 64-token bound
    for prompt in prompts:
        await post(http, engine_url, "/generate", {"input_ids": prompt, "sampling_params": {"max_new_tokens": 1}})
    oldest, newest = prompts[0] + [1], prompts[2] + [1]
    newest_hit = await post(
        http, engine_url, "/generate", {"input_ids": newest, "sampling_params": {"max_new_tokens": 1}}
    )
    oldest_hit = await post(
        http, engine_url, "/generate", {"input_ids": oldest, "sampling_params": {"max_new_tokens": 1}}
    )
    assert newest_hit["meta_info"]["cached_tokens"] == 25
    assert oldest_hit["meta_info"]["cached_tokens"] == 0
