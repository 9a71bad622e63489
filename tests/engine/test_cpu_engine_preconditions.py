"""The control requests SGLang 0.5.17's scheduler dies on (actors/engine/cpu/preconditions.py).

By default the CPU engine refuses each before anything changes: HTTP 400 with SGLang's error and
why, counted by name in /server_info ``precondition_violations`` (the shared refusing engine,
`lenient_engine_url`). With --strict-sglang-preconditions it does what SGLang does: logs the
error as SGLang's scheduler does and the process exits (a private engine per test). The
sequences SGLang survives are in tests/contract/test_engine_preconditions.py.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import torch
from safetensors.torch import load_file

from actors.engine.cpu.config import parse_args
from actors.engine.cpu.local import start_local_engine, stop_local_engine
from actors.engine.cpu.preconditions import EXIT_CODE, STRICT_ENV
from slime_async.net import free_port
from slime_async.weights.tensor_ipc import serialize_named_tensors
from actors.weight_sync.delta import DeltaSender, DeltaSyncError, Snapshot

CONTRACT = Path(__file__).resolve().parents[1] / "contract"
LONG = {"temperature": 0, "max_new_tokens": 900, "ignore_eos": True}
GREEDY = {"temperature": 0, "max_new_tokens": 8, "ignore_eos": True}
FLUSH_FAILED = "AssertionError: Cache flush failed after updating weights"


async def call(http: aiohttp.ClientSession, url: str, path: str, body: dict | None = None,
               method: str = "POST") -> tuple[int, Any]:
    async with http.request(method, url + path, json=body) as resp:
        return resp.status, await (resp.json() if resp.content_type == "application/json" else resp.text())


async def server_info(http: aiohttp.ClientSession, url: str) -> dict:
    return (await call(http, url, "/server_info", method="GET"))[1]


async def violations(http: aiohttp.ClientSession, url: str) -> dict[str, int]:
    return (await server_info(http, url))["precondition_violations"]


async def loads(http: aiohttp.ClientSession, url: str) -> tuple[int, int]:
    entry = (await call(http, url, "/v1/loads", method="GET"))[1]["loads"][0]
    return entry["num_running_reqs"], entry["num_waiting_reqs"]


async def wait_for_loads(http: aiohttp.ClientSession, url: str, running: int, waiting: int) -> None:
    async with asyncio.timeout(60):
        while await loads(http, url) != (running, waiting):
            await asyncio.sleep(0.01)


def start(http: aiohttp.ClientSession, url: str, prompt: list[int]) -> asyncio.Task:
    return asyncio.create_task(call(http, url, "/generate", {"input_ids": prompt, "sampling_params": LONG}))


async def greedy(http: aiohttp.ClientSession, url: str) -> list[int]:
    status, out = await call(http, url, "/generate", {"input_ids": [5, 6, 7], "sampling_params": GREEDY})
    assert status == 200, out
    return out["output_ids"]


@pytest.fixture
async def url(lenient_engine_url: str) -> AsyncIterator[str]:
    """The refusing engine; afterwards nothing paused, running or cached there."""
    yield lenient_engine_url
    async with aiohttp.ClientSession() as http:
        await call(http, lenient_engine_url, "/continue_generation")
        await call(http, lenient_engine_url, "/abort_request", {"abort_all": True})
        status, body = await call(http, lenient_engine_url, "/flush_cache?timeout=60", method="GET")
        assert status == 200, body


async def paused_in_place(http: aiohttp.ClientSession, url: str) -> asyncio.Task:
    """One request decoding, then paused in place: what an in_place weight sync leaves."""
    task = start(http, url, [40, 41, 42])
    await wait_for_loads(http, url, running=1, waiting=0)
    await call(http, url, "/pause_generation", {"mode": "in_place"})
    return task


def assert_refused(status: int, body: dict, *texts: str) -> None:
    assert status == 400 and body["success"] is False, body
    for text in texts:
        assert text in body["message"], body["message"]


# ---- a flushing update while the scheduler is not idle ----------------------------------------


async def busy_in_place(http, url):
    return [await paused_in_place(http, url)], "1 running and 0 waiting"


async def busy_retracted(http, url):
    task = start(http, url, [43, 44])
    await wait_for_loads(http, url, running=1, waiting=0)
    await call(http, url, "/pause_generation", {"mode": "retract"})
    return [task], "0 running and 1 waiting"


async def busy_queued(http, url):
    tasks = [start(http, url, [45 + i, 50]) for i in range(3)]  # the engine runs 2 at once
    await wait_for_loads(http, url, running=2, waiting=1)
    await call(http, url, "/pause_generation", {"mode": "in_place"})
    return tasks, "2 running and 1 waiting"


async def busy_aborted_in_place(http, url):
    task = await paused_in_place(http, url)
    await call(http, url, "/abort_request", {"abort_all": True})
    assert await loads(http, url) == (1, 0)  # as in SGLang: it leaves at the next step, after continue
    return [task], "1 running and 0 waiting"


@pytest.mark.parametrize("busy", [busy_in_place, busy_retracted, busy_queued, busy_aborted_in_place],
                         ids=["paused in place", "retracted", "queued", "aborted while paused in place"])
async def test_a_flushing_disk_update_while_the_scheduler_is_not_idle_is_refused_before_loading(
        url, http, other_weights_dir, busy):
    before_weights, before = await greedy(http, url), await violations(http, url)
    tasks, why = await busy(http, url)
    status, body = await call(http, url, "/update_weights_from_disk",
                              {"model_path": str(other_weights_dir), "weight_version": "never"})
    assert_refused(status, body, FLUSH_FAILED, why)
    assert not any(task.done() for task in tasks)
    assert (await violations(http, url))["flush_cache_after_weight_update"] == \
        before["flush_cache_after_weight_update"] + 1
    await call(http, url, "/abort_request", {"abort_all": True})
    await call(http, url, "/continue_generation")
    await asyncio.gather(*tasks)
    assert (await call(http, url, "/get_weight_version", method="GET"))[1]["weight_version"] == "default"
    assert await greedy(http, url) == before_weights


async def test_an_abort_while_paused_in_place_answers_the_request_only_at_continue(url, http):
    task = await paused_in_place(http, url)
    await call(http, url, "/abort_request", {"abort_all": True})
    assert await loads(http, url) == (1, 0) and not task.done()
    await call(http, url, "/continue_generation")
    async with asyncio.timeout(60):
        status, out = await task
    assert status == 200 and out["meta_info"]["finish_reason"]["type"] == "abort"


async def test_a_flushing_tensor_update_while_paused_in_place_is_refused(url, http, tiny_model_dir):
    weights = load_file(str(tiny_model_dir / "model.safetensors"))
    payload = serialize_named_tensors(sorted(weights.items()))
    await paused_in_place(http, url)
    status, body = await call(http, url, "/update_weights_from_tensor", {"serialized_named_tensors": [payload]})
    assert_refused(status, body, FLUSH_FAILED, "1 running and 0 waiting")


async def test_a_delta_load_while_paused_in_place_is_refused(url, http, other_weights_dir):
    await paused_in_place(http, url)
    with pytest.raises(DeltaSyncError, match=rf"\(400\): {FLUSH_FAILED}.*1 running and 0 waiting"):
        await DeltaSender().push(http, url, Snapshot.from_hf_dir("delta-never", other_weights_dir), None)


async def test_a_flushing_distributed_update_while_paused_in_place_is_refused_after_the_broadcast(
        url, http, other_weights_dir):
    port, group = free_port(), "preconditions"
    trainer = await asyncio.create_subprocess_exec(
        sys.executable, str(CONTRACT / "broadcast_weights.py"), "--model-dir", str(other_weights_dir),
        "--init-method", f"tcp://127.0.0.1:{port}", "--world-size", "2", "--group-name", group,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE)
    try:
        async with asyncio.timeout(120):
            announcement = json.loads(await trainer.stdout.readline())
            init = {"master_address": "127.0.0.1", "master_port": port, "rank_offset": 1, "world_size": 2,
                    "group_name": group, "backend": "gloo"}
            assert (await call(http, url, "/init_weights_update_group", init))[0] == 200
            await paused_in_place(http, url)
            status, body = await call(http, url, "/update_weights_from_distributed",
                                      {**announcement, "group_name": group})
            trainer.stdin.close()
            assert await trainer.wait() == 0  # every tensor was received: the group stays in step
    finally:
        if trainer.returncode is None:
            trainer.kill()
            await trainer.wait()
        await call(http, url, "/destroy_weights_update_group", {"group_name": group})
    assert_refused(status, body, FLUSH_FAILED, "1 running and 0 waiting")


# ---- memory occupation, weight-update groups, tensor payloads ---------------------------------


async def test_a_release_while_a_request_is_paused_in_place_is_refused(url, http):
    before = await violations(http, url)
    await paused_in_place(http, url)
    status, body = await call(http, url, "/release_memory_occupation", {})
    assert_refused(status, body, "AssertionError: release_memory_occupation should be called only when server "
                   "is idle.", "1 running and 0 waiting")
    assert (await server_info(http, url))["memory_occupation"]["released"] == []
    assert (await violations(http, url))["release_memory_occupation_idle"] == \
        before["release_memory_occupation_idle"] + 1


async def test_a_resume_of_memory_not_released_is_refused_with_sglangs_key_error(url, http):
    before = await violations(http, url)
    status, body = await call(http, url, "/resume_memory_occupation", {})  # no tags: all, kv_cache first
    assert_refused(status, body, "KeyError: 'kv_cache'", "memory not released")
    assert (await violations(http, url))["resume_memory_occupation_released"] == \
        before["resume_memory_occupation_released"] + 1


async def test_an_update_from_a_group_never_initialised_is_refused(url, http):
    before = await violations(http, url)
    update = {"names": ["lm_head.weight"], "dtypes": ["float32"], "shapes": [[4, 4]], "group_name": "nope"}
    status, body = await call(http, url, "/update_weights_from_distributed", update)
    assert_refused(status, body, "AssertionError: Group nope not in []. Please call `init_weights_update_group` "
                   "first.")
    assert (await violations(http, url))["weights_update_group_exists"] == before["weights_update_group_exists"] + 1


async def test_a_group_with_an_empty_name_is_refused(url, http):
    before = await violations(http, url)
    init = {"master_address": "127.0.0.1", "master_port": free_port(), "rank_offset": 1, "world_size": 2,
            "group_name": "", "backend": "gloo"}
    status, body = await call(http, url, "/init_weights_update_group", init)
    assert_refused(status, body, "AssertionError: Group name cannot be empty")
    assert (await violations(http, url))["weights_update_group_name"] == before["weights_update_group_name"] + 1


async def test_a_tensor_update_without_a_payload_for_its_rank_is_refused(url, http):
    before = await violations(http, url)
    status, body = await call(http, url, "/update_weights_from_tensor", {"serialized_named_tensors": []})
    assert_refused(status, body, "IndexError: list index out of range")
    assert (await violations(http, url))["update_weights_from_tensor_payloads"] == \
        before["update_weights_from_tensor_payloads"] + 1


async def test_a_tensor_update_sglangs_loader_raises_on_is_refused(url, http):
    before = await violations(http, url)
    payload = serialize_named_tensors([("model.norm.weight", torch.ones(64))])
    status, body = await call(http, url, "/update_weights_from_tensor",
                              {"serialized_named_tensors": [payload], "load_format": "my.loader"})
    assert_refused(status, body, "NotImplementedError: Unknown load_format=my.loader")
    assert (await violations(http, url))["update_weights_from_tensor_load"] == \
        before["update_weights_from_tensor_load"] + 1


# ---- /flush_cache --------------------------------------------------------------------------------


async def test_a_flush_while_a_deferred_one_waits_for_a_caller_that_hung_up_is_told_another_is_in_progress(
        url, http):
    # SGLang's tokenizer sends one flush at a time; a caller that hangs up leaves its deferred flush
    # pending in the scheduler, and the next flush finds it there.
    task = start(http, url, [60, 61])
    await wait_for_loads(http, url, running=1, waiting=0)
    async with aiohttp.ClientSession() as gone:
        deferred = asyncio.create_task(call(gone, url, "/flush_cache?timeout=600", method="GET"))
        async with asyncio.timeout(60):
            while not (await server_info(http, url))["internal_states"][0]["flush_pending"]:
                await asyncio.sleep(0.01)
        deferred.cancel()
    assert await call(http, url, "/flush_cache", method="GET") == (400, "Another flush_cache is already in progress.")
    await call(http, url, "/abort_request", {"abort_all": True})
    await task
    async with asyncio.timeout(60):  # the abandoned flush went through once idle
        while (await server_info(http, url))["internal_states"][0]["flush_pending"]:
            await asyncio.sleep(0.01)


# ---- strict: the process exits where SGLang's dies ----------------------------------------------


async def strict_flush_after_update(http, url, other_weights_dir, left):
    left.append(await paused_in_place(http, url))
    await call(http, url, "/update_weights_from_disk", {"model_path": str(other_weights_dir)})


async def strict_no_payload(http, url, _, left):
    await call(http, url, "/update_weights_from_tensor", {"serialized_named_tensors": []})


# Every precondition above is refused through Preconditions.violated (each test sees its count go up
# there), which is where strict mode exits instead: two engines show the exit, one with a request in
# the running batch, one idle (an engine start is ~6 s of the suite each).
@pytest.mark.parametrize(("sequence", "error"), [
    (strict_flush_after_update, FLUSH_FAILED),
    (strict_no_payload, "IndexError: list index out of range"),
], ids=lambda value: value.__name__.removeprefix("strict_") if callable(value) else None)
async def test_a_strict_engine_exits_with_sglangs_error_where_sglang_dies(
        tiny_model_dir, other_weights_dir, tmp_path, sequence, error):
    log = tmp_path / "engine.log"
    process, url = await asyncio.to_thread(start_local_engine, tiny_model_dir, log, "--strict-sglang-preconditions",
                                           timeout=120)
    try:
        left: list[asyncio.Task] = []  # requests of the sequence, which fail with the engine
        async with aiohttp.ClientSession() as http:
            with pytest.raises(aiohttp.ClientError):  # the server goes away mid-answer, as SGLang's
                await sequence(http, url, other_weights_dir, left)
            await asyncio.gather(*left, return_exceptions=True)
        returncode = await asyncio.to_thread(process.wait, 60)
    finally:
        stop_local_engine(process)
    text = log.read_text()
    assert returncode == EXIT_CODE, text[-3000:]
    assert "Scheduler hit an exception: Traceback" in text and error in text, text[-3000:]


async def test_the_suites_engines_are_strict_and_the_refusing_one_is_not(engine_url, lenient_engine_url, http):
    # tests/conftest.py: a control-plane bug kills the engine in a test, as SGLang dies on a GPU.
    assert (await server_info(http, engine_url))["strict_sglang_preconditions"] is True
    assert (await server_info(http, lenient_engine_url))["strict_sglang_preconditions"] is False


def test_the_strict_flag_defaults_to_the_environment_and_an_explicit_flag_wins(monkeypatch):
    monkeypatch.setenv(STRICT_ENV, "1")
    assert parse_args(["--model-path", "m"]).strict_sglang_preconditions is True
    assert parse_args(["--model-path", "m", "--no-strict-sglang-preconditions"]).strict_sglang_preconditions is False
    monkeypatch.setenv(STRICT_ENV, "0")
    assert parse_args(["--model-path", "m"]).strict_sglang_preconditions is False
    assert parse_args(["--model-path", "m", "--strict-sglang-preconditions"]).strict_sglang_preconditions is True
    monkeypatch.setenv(STRICT_ENV, "maybe")
    with pytest.raises(SystemExit):  # argparse's error, naming the variable
        parse_args(["--model-path", "m"])
