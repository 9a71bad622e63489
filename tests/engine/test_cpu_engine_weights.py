"""CPU engine weight updates (disk and gloo broadcast) and start-up failures.

They use the shared engine and put its original weights and version back after each test
(fixture `weights_engine_url`), so the other engine tests find it untouched. The distributed
tests start a real second process that plays trainer rank 0: it joins the weight-update
group with `init_custom_process_group` and broadcasts tensors in the order of `names`.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

from slime_async.net import free_port
from examples.models.tiny import build_tiny_model

REPO_ROOT = Path(__file__).resolve().parents[2]
PROMPT = [5, 6, 7, 8, 9]
GREEDY = {"temperature": 0, "max_new_tokens": 10, "ignore_eos": True}

TRAINER_SCRIPT = """
import json, sys
import torch
import torch.distributed as dist
from safetensors.torch import load_file
from slime_async.weights.process_group import init_custom_process_group, destroy_custom_process_group

port, weights_file, plan_file = sys.argv[1], sys.argv[2], sys.argv[3]
plan = json.load(open(plan_file))
weights = load_file(weights_file)
group = init_custom_process_group("gloo", f"tcp://127.0.0.1:{port}", 2, 0, plan["group_name"])
for update in plan["updates"]:
    for name, dtype, shape in zip(update["names"], update["dtypes"], update["shapes"]):
        # Send what was announced, even when the announcement is wrong (that is the test).
        tensor = weights.get(name, torch.zeros(shape)).reshape(-1)[: torch.Size(shape).numel()]
        dist.broadcast(tensor.reshape(shape).to(getattr(torch, dtype)).contiguous(), src=0, group=group)
destroy_custom_process_group(group)
print("trainer done", flush=True)
# Skip interpreter teardown: the gloo TCPStore this rank hosts can abort in its destructor while
# the engine's client connection is still closing (exit code -6 after "trainer done", seen on
# this machine). A real trainer keeps running after a destroy; only this script exits at once.
import os
os._exit(0)
"""


@pytest.fixture
async def weights_engine_url(engine_url: str, tiny_model_dir: Path) -> AsyncIterator[str]:
    """The shared engine; afterwards it serves the original weights as version "default" again."""
    yield engine_url
    async with aiohttp.ClientSession() as http:
        restore = {"model_path": str(tiny_model_dir), "weight_version": "default"}
        status, body = await post(http, engine_url, "/update_weights_from_disk", restore)
        assert status == 200, body


async def post(http: aiohttp.ClientSession, url: str, path: str, body: dict) -> tuple[int, Any]:
    async with http.post(url + path, json=body) as resp:
        return resp.status, await resp.json()


async def greedy(http: aiohttp.ClientSession, url: str) -> dict:
    status, out = await post(http, url, "/generate", {"input_ids": PROMPT, "sampling_params": GREEDY})
    assert status == 200, out
    return out


def reference_greedy(model_dir: Path) -> list[int]:
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    out = model.generate(torch.tensor([PROMPT]), max_new_tokens=10, do_sample=False, eos_token_id=None, pad_token_id=0)
    return out[0, len(PROMPT) :].tolist()


def copy_with_tensors(src: Path, dst: Path, change: Any) -> Path:
    """A model dir like `src` whose tensors went through `change(dict) -> dict`."""
    shutil.copytree(src, dst)
    tensors = change(load_file(src / "model.safetensors"))
    save_file(tensors, dst / "model.safetensors")
    return dst


@pytest.fixture(scope="module")
def bad_checkpoints(tmp_path_factory: pytest.TempPathFactory, other_weights_dir: Path) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("bad-checkpoints")
    first = next(iter(load_file(other_weights_dir / "model.safetensors")))
    return {
        "missing dir": root / "does-not-exist",
        "wrong shape": build_tiny_model(root / "wider", hidden_size=32),
        "unknown name": copy_with_tensors(
            other_weights_dir, root / "extra", lambda t: {**t, "model.extra.weight": torch.ones(2)}
        ),
        "missing tensor": copy_with_tensors(
            other_weights_dir, root / "partial", lambda t: {k: v for k, v in t.items() if k != first}
        ),
        "integer dtype": copy_with_tensors(
            other_weights_dir, root / "ints", lambda t: {**t, first: t[first].to(torch.int32)}
        ),
    }


async def test_disk_update_changes_greedy_output_and_weight_version(
    weights_engine_url, http, tiny_model_dir, other_weights_dir
):
    status, body = await post(
        http,
        weights_engine_url,
        "/update_weights_from_disk",
        {"model_path": str(other_weights_dir), "weight_version": "v1"},
    )
    assert status == 200 and body["success"] is True, body
    out = await greedy(http, weights_engine_url)
    assert out["output_ids"] == reference_greedy(other_weights_dir)
    assert out["meta_info"]["weight_version"] == "v1"
    async with http.get(weights_engine_url + "/get_model_info") as resp:
        assert (await resp.json())["model_path"] == str(other_weights_dir)
    # Loading the original back restores its exact behaviour.
    await post(
        http,
        weights_engine_url,
        "/update_weights_from_disk",
        {"model_path": str(tiny_model_dir), "weight_version": "v2"},
    )
    assert (await greedy(http, weights_engine_url))["output_ids"] == reference_greedy(tiny_model_dir)


async def running_requests(http: aiohttp.ClientSession, url: str) -> int:
    async with http.get(url + "/v1/loads") as resp:
        return (await resp.json())["loads"][0]["num_running_reqs"]


async def wait_until_running(http: aiohttp.ClientSession, url: str) -> None:
    async with asyncio.timeout(60):
        while await running_requests(http, url) < 1:
            await asyncio.sleep(0.01)


async def flush_cache(http: aiohttp.ClientSession, url: str) -> None:
    async with http.post(url + "/flush_cache") as resp:
        assert resp.status == 200


LONG = {"temperature": 0, "max_new_tokens": 600, "ignore_eos": True}


async def test_an_update_waits_for_running_requests_so_no_response_mixes_versions(
    weights_engine_url, http, other_weights_dir
):
    # SGLang's rule: /update_weights_from_disk takes the write side of model_update_lock, which
    # every /generate holds the read side of until it answers (unless generation is paused).
    url, prompt = weights_engine_url, [60, 61, 62]
    async with http.get(url + "/get_weight_version") as resp:
        old_version = (await resp.json())["weight_version"]
    old_long = (await post(http, url, "/generate", {"input_ids": prompt, "sampling_params": LONG}))[1]
    old_short = (await greedy(http, url))["output_ids"]
    await flush_cache(http, url)

    running = asyncio.create_task(post(http, url, "/generate", {"input_ids": prompt, "sampling_params": LONG}))
    await wait_until_running(http, url)
    update = asyncio.create_task(
        post(http, url, "/update_weights_from_disk", {"model_path": str(other_weights_dir), "weight_version": "v-new"})
    )
    queued = asyncio.create_task(greedy(http, url))
    done, _ = await asyncio.wait({running, update}, return_when=asyncio.FIRST_COMPLETED)
    assert running in done  # the update could not finish while the request was generating

    _, out = await running
    assert out["output_ids"] == old_long["output_ids"]
    assert out["meta_info"]["weight_version"] == old_version
    status, body = await update
    assert status == 200 and body["success"] is True, body
    # Sent while the update was pending: served entirely before it or entirely after it.
    q = await queued
    served = (q["meta_info"]["weight_version"], q["output_ids"])
    assert served in [(old_version, old_short), ("v-new", reference_greedy(other_weights_dir))]


async def load_weights(http: aiohttp.ClientSession, url: str, model_dir: Path, flush_cache: bool = True) -> None:
    body = {"model_path": str(model_dir), "flush_cache": flush_cache}
    status, answer = await post(http, url, "/update_weights_from_disk", body)
    assert status == 200 and answer["success"] is True, answer


async def swap_under_a_running_request(
    http: aiohttp.ClientSession, url: str, request: dict, model_dir: Path
) -> tuple[int, Any]:
    """Start `request`, pause it in place once it runs, load `model_dir` (without the flush SGLang
    would die on: the request is still running), continue; its answer."""
    running = asyncio.create_task(post(http, url, "/generate", request))
    await wait_until_running(http, url)
    await post(http, url, "/pause_generation", {"mode": "in_place"})
    try:
        await load_weights(http, url, model_dir, flush_cache=False)
        assert not running.done() and await running_requests(http, url) == 1  # held, not answered
    finally:
        async with http.post(url + "/continue_generation", json={}) as resp:
            assert resp.status == 200
    async with asyncio.timeout(60):  # a request never answered is a failure, not a hang
        return await running


async def test_an_update_while_paused_in_place_applies_at_once_and_the_request_continues_on_it(
    weights_engine_url, http, other_weights_dir
):
    url, prompt = weights_engine_url, [63, 64, 65]
    old_long = (await post(http, url, "/generate", {"input_ids": prompt, "sampling_params": LONG}))[1]
    await flush_cache(http, url)
    _, out = await swap_under_a_running_request(
        http, url, {"input_ids": prompt, "sampling_params": LONG}, other_weights_dir)
    assert len(out["output_ids"]) == LONG["max_new_tokens"]
    assert out["output_ids"] != old_long["output_ids"]  # the tokens after the swap come from new weights


async def test_kv_of_a_sequence_paused_across_a_swap_stays_cached_until_the_flush_that_follows_it(
    start_engine, tiny_model_dir, http, other_weights_dir
):
    # As in SGLang: a swap while requests are paused in place cannot flush (it would die), so the
    # KV they computed under the old weights enters the cache when they finish, and stays there
    # until the deferred flush the runtime sends once the engine can be idle.
    prompt = [70, 71, 72]
    with start_engine(tiny_model_dir, "--prefix-cache-max-tokens", "4096") as url:  # room for the sequence
        _, first = await swap_under_a_running_request(
            http, url, {"input_ids": prompt, "sampling_params": LONG}, other_weights_dir)
        next_turn = {"input_ids": prompt + first["output_ids"] + [5], "sampling_params": GREEDY}
        _, stale = await post(http, url, "/generate", next_turn)
        async with http.get(url + "/flush_cache", params={"timeout": "60"}) as resp:
            assert resp.status == 200, await resp.text()
        _, fresh = await post(http, url, "/generate", next_turn)
    assert stale["meta_info"]["cached_tokens"] == len(prompt) + len(first["output_ids"]) - 1
    assert fresh["meta_info"]["cached_tokens"] == 0


@pytest.fixture(scope="module")
def nan_weights_dir(tmp_path_factory: pytest.TempPathFactory, other_weights_dir: Path) -> Path:
    """Right names and shapes, every value NaN: what a trainer that diverged would send."""
    return copy_with_tensors(other_weights_dir, tmp_path_factory.mktemp("nan") / "model",
                             lambda t: {k: torch.full_like(v, float("nan")) for k, v in t.items()})


SAMPLED = {"temperature": 1.0, "max_new_tokens": 600, "ignore_eos": True}


async def test_a_failing_prefill_answers_500_and_the_engine_serves_on(
    weights_engine_url, http, nan_weights_dir, other_weights_dir
):
    url = weights_engine_url
    await load_weights(http, url, nan_weights_dir)
    async with asyncio.timeout(60):  # the bug this guards against is a request never answered
        status, body = await post(http, url, "/generate", {"input_ids": PROMPT, "sampling_params": SAMPLED})
    assert status == 500 and "engine step failed" in body["error"]["message"], body
    # Nothing holds the update lock: good weights load and serve again.
    await load_weights(http, url, other_weights_dir)
    assert (await greedy(http, url))["output_ids"] == reference_greedy(other_weights_dir)


async def test_a_failing_decode_answers_500_instead_of_ending_the_engine(
    weights_engine_url, http, nan_weights_dir, other_weights_dir
):
    url = weights_engine_url
    await flush_cache(http, url)
    # The next decode step after the swap samples from NaN logits.
    status, body = await swap_under_a_running_request(
        http, url, {"input_ids": PROMPT, "sampling_params": SAMPLED}, nan_weights_dir)
    assert status == 500 and "engine step failed" in body["error"]["message"], body
    await load_weights(http, url, other_weights_dir)
    assert (await greedy(http, url))["output_ids"] == reference_greedy(other_weights_dir)


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("missing dir", "does not exist"),
        ("wrong shape", "shape mismatch"),
        ("unknown name", "unknown parameter name 'model.extra.weight'"),
        ("missing tensor", "lacks 1 parameter"),
        ("integer dtype", "non-floating dtype"),
    ],
)
async def test_failed_disk_update_is_rejected_and_old_weights_keep_serving(
    weights_engine_url, http, bad_checkpoints, case, message
):
    before = await greedy(http, weights_engine_url)
    status, body = await post(
        http,
        weights_engine_url,
        "/update_weights_from_disk",
        {"model_path": str(bad_checkpoints[case]), "weight_version": "bad"},
    )
    assert status == 400 and body["success"] is False
    assert message in body["message"]
    after = await greedy(http, weights_engine_url)
    assert after["output_ids"] == before["output_ids"]
    assert after["meta_info"]["weight_version"] == before["meta_info"]["weight_version"]




async def broadcast_updates(
    http: aiohttp.ClientSession, url: str, tmp_path: Path, weights_dir: Path, group_name: str, updates: list[dict]
) -> list[tuple[int, Any, dict]]:
    """Run a trainer process through init -> the updates in order -> destroy.

    Returns, per update, the HTTP status, the answer and a greedy generation made right after.
    """
    port = free_port()
    (tmp_path / "trainer.py").write_text(TRAINER_SCRIPT)
    (tmp_path / "plan.json").write_text(json.dumps({"group_name": group_name, "updates": updates}))
    trainer = await asyncio.create_subprocess_exec(
        sys.executable,
        str(tmp_path / "trainer.py"),
        str(port),
        str(weights_dir / "model.safetensors"),
        str(tmp_path / "plan.json"),
        cwd=REPO_ROOT,
        env={"PYTHONPATH": str(REPO_ROOT), "PATH": "/usr/bin:/bin"},
    )
    try:
        init = {
            "master_address": "127.0.0.1",
            "master_port": port,
            "rank_offset": 1,
            "world_size": 2,
            "group_name": group_name,
            "backend": "gloo",
        }
        status, body = await post(http, url, "/init_weights_update_group", init)
        assert status == 200 and body["success"], body
        results = []
        for update in updates:
            status, body = await post(
                http, url, "/update_weights_from_distributed", {**update, "group_name": group_name}
            )
            results.append((status, body, await greedy(http, url)))
        status, body = await post(http, url, "/destroy_weights_update_group", {"group_name": group_name})
        assert status == 200 and body["success"], body
        async with asyncio.timeout(60):
            assert await trainer.wait() == 0
        return results
    finally:
        if trainer.returncode is None:
            trainer.kill()
            await trainer.wait()


def full_update(weights_dir: Path, weight_version: str) -> dict:
    tensors = load_file(weights_dir / "model.safetensors")
    return {
        "names": list(tensors),
        "dtypes": ["float32"] * len(tensors),
        "shapes": [list(t.shape) for t in tensors.values()],
        "weight_version": weight_version,
    }


def faulty_update(weights_dir: Path, fault: str) -> dict:
    """A full update whose last tensor is wrongly announced (after good ones were received)."""
    update = full_update(weights_dir, f"never-{fault}")
    last = len(update["names"]) - 1
    if fault == "shape":
        update["shapes"][last] = [update["shapes"][last][0] - 1, *update["shapes"][last][1:]]
    elif fault == "dtype":
        update["dtypes"][last] = "bfloat16"
    else:
        update["names"][last] = "model.not_a_weight"
    return update


async def test_distributed_update_broadcasts_new_weights_from_trainer_rank_0(
    weights_engine_url, http, tmp_path, other_weights_dir
):
    [(status, body, _)] = await broadcast_updates(
        http, weights_engine_url, tmp_path, other_weights_dir, "dist-ok", [full_update(other_weights_dir, "dist-1")]
    )
    assert status == 200 and body["success"] is True, body
    out = await greedy(http, weights_engine_url)
    assert out["output_ids"] == reference_greedy(other_weights_dir)
    assert out["meta_info"]["weight_version"] == "dist-1"


async def test_rejected_distributed_updates_keep_old_weights_and_the_group_in_step(
    weights_engine_url, http, tmp_path, other_weights_dir
):
    before = await greedy(http, weights_engine_url)
    faults = {"shape": "shape mismatch", "dtype": "dtype mismatch", "name": "unknown parameter name"}
    updates = [faulty_update(other_weights_dir, fault) for fault in faults]
    # A good update after the rejected ones arrives intact only if every rejected broadcast
    # was still received (drained), i.e. the group stayed in step.
    updates.append(full_update(other_weights_dir, "after-faults"))
    results = await broadcast_updates(http, weights_engine_url, tmp_path, other_weights_dir, "dist-bad", updates)
    for (status, body, served), message in zip(results, faults.values()):
        assert status == 400 and body["success"] is False and message in body["message"], body
        assert served["output_ids"] == before["output_ids"]
        assert served["meta_info"]["weight_version"] == before["meta_info"]["weight_version"]
    status, body, served = results[-1]
    assert status == 200, body
    assert served["output_ids"] == reference_greedy(other_weights_dir)
    assert served["meta_info"]["weight_version"] == "after-faults"


@pytest.mark.parametrize("make_dir", ["missing", "no-config"])
def test_engine_start_fails_naming_a_bad_model_dir(tmp_path, make_dir):
    model_dir = tmp_path / "model"
    if make_dir == "no-config":
        model_dir.mkdir()
    proc = subprocess.run(
        [sys.executable, "-m", "actors.engine.cpu", "--model-path", str(model_dir), "--port", "0"],
        cwd=REPO_ROOT,
        env={"PYTHONPATH": str(REPO_ROOT), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert str(model_dir) in proc.stderr
