"""The engine protocol: what every engine behind the router must do, through EngineClient.

One suite for all engines. It runs against the embedded CPU engine by default and against a
real SGLang server when SLIME_ASYNC_TEST_ENGINE_URL is set (see conftest.py), so a
difference between the two shows up here rather than in a training run.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sys
import uuid
from pathlib import Path

import aiohttp
import pytest
import torch

from actors.engine.external import discover_external_engine
from slime_async.engine_client import EngineClient, EngineHTTPError
from slime_async.generate_output import GenerateOutput, parse_generate_output

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(300)]

PROMPT = [11, 42, 7, 99, 3, 250, 18]
GREEDY = {"temperature": 0.0, "max_new_tokens": 12, "ignore_eos": True}
DISTRIBUTED_UPDATE_TIMEOUT_S = 120


async def generate(client: EngineClient, prompt: list[int], **params) -> GenerateOutput:
    return parse_generate_output(await client.generate(prompt, params))


def recompute_logprobs(hf_model, prompt: list[int], output: list[int], temperature: float) -> list[float]:
    """log softmax(logits / T) of each output token given everything before it (SGLang's semantics)."""
    ids = torch.tensor([prompt + output])
    with torch.no_grad():
        logits = hf_model(ids).logits[0].float()
    # logits[i] predicts token i+1: the output tokens are predicted by positions len(prompt)-1 ...
    predicting = logits[len(prompt) - 1 : len(prompt) - 1 + len(output)] / temperature
    logprobs = torch.log_softmax(predicting, dim=-1)
    return logprobs.gather(1, torch.tensor(output)[:, None]).squeeze(1).tolist()


def running_requests(loads: dict) -> int:
    """Running requests summed over the DP ranks of a `/v1/loads` answer (SGLang 0.5.17 no longer
    sends an `aggregate`)."""
    return sum(int(rank.get("num_running_reqs", 0)) for rank in loads.get("loads") or [])


async def wait_until_running(client: EngineClient, polls: int = 500) -> None:
    """Poll /v1/loads until the engine reports a running request."""
    for _ in range(polls):
        loads = await client.get_loads()
        if running_requests(loads) >= 1:
            return
        await asyncio.sleep(0.01)
    pytest.fail(f"the engine never reported a running request; last /v1/loads: {loads}")


# ---- discovery and health


async def test_engine_is_healthy_and_can_generate(client):
    assert await client.health() is True
    assert await client.health_generate() is True


async def test_engine_is_discoverable_like_an_external_sglang_server(engine_under_test):
    async with aiohttp.ClientSession() as session:
        info = await discover_external_engine(engine_under_test.url, session, api_key=engine_under_test.api_key)
    assert info.url == engine_under_test.url
    assert info.model_path
    assert info.tp_size >= 1


async def test_loads_report_running_and_waiting_requests_per_dp_rank(client):
    loads = await client.get_loads()
    assert len(loads["loads"]) >= 1
    for rank in loads["loads"]:
        assert rank["num_running_reqs"] >= 0
        assert rank["num_waiting_reqs"] >= 0


# ---- generation


async def test_generate_returns_tokens_logprobs_and_counts(client, vocab_size):
    out = await generate(client, PROMPT, **GREEDY)
    assert len(out.output_ids) == GREEDY["max_new_tokens"]
    assert all(0 <= token < vocab_size for token in out.output_ids)
    assert out.logprobs is not None and len(out.logprobs) == len(out.output_ids)
    assert all(lp <= 0.0 for lp in out.logprobs)
    assert out.finish_type == "length"
    assert out.prompt_tokens == len(PROMPT)
    assert out.completion_tokens == len(out.output_ids)
    assert out.weight_version is not None


async def test_generate_batch_answers_each_prompt_like_a_single_request(client):
    prompts = [PROMPT, PROMPT[:3], [5, 6, 7, 8, 9, 10, 11, 12, 13]]
    batch = [parse_generate_output(d) for d in await client.generate_batch(prompts, GREEDY)]
    singles = [await generate(client, p, **GREEDY) for p in prompts]
    assert [b.output_ids for b in batch] == [s.output_ids for s in singles]
    assert [b.prompt_tokens for b in batch] == [len(p) for p in prompts]


async def test_greedy_decoding_is_deterministic_alone_and_under_concurrency(client):
    first = await generate(client, PROMPT, **GREEDY)
    again = await generate(client, PROMPT, **GREEDY)
    concurrent = await asyncio.gather(*(generate(client, PROMPT, **GREEDY) for _ in range(4)))
    assert again.output_ids == first.output_ids
    assert all(c.output_ids == first.output_ids for c in concurrent)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
async def test_logprobs_match_a_transformers_recompute(client, hf_model, engine_under_test, temperature):
    out = await generate(client, PROMPT, temperature=temperature, top_p=1.0, top_k=-1, max_new_tokens=16, ignore_eos=True)
    expected = recompute_logprobs(hf_model, PROMPT, out.output_ids, temperature)
    diffs = [abs(a - b) for a, b in zip(out.logprobs, expected)]
    worst = max(diffs)
    print(f"|engine - transformers| logprob difference at T={temperature}: "
          f"mean {sum(diffs) / len(diffs):.2e}, max {worst:.2e}")
    assert worst <= engine_under_test.logprob_atol, f"engine {out.logprobs} vs transformers {expected}"


async def test_top_logprobs_are_the_most_likely_tokens_most_likely_first(client, hf_model, engine_under_test):
    """``top_logprobs_num``: per output token its k most likely tokens (SGLang's
    ``meta_info.output_top_logprobs``); greedy, so the first is the token sampled."""
    out = await generate(client, PROMPT, **GREEDY)
    answer = parse_generate_output(await client.generate(PROMPT, GREEDY, top_logprobs_num=4))
    assert answer.output_ids == out.output_ids and len(answer.top_logprobs) == len(answer.output_ids)
    with torch.no_grad():
        logits = hf_model(torch.tensor([PROMPT + answer.output_ids])).logits[0, len(PROMPT) - 1:-1].float()
    reference = torch.log_softmax(logits, dim=-1)
    for position, (top, token, logprob) in enumerate(zip(answer.top_logprobs, answer.output_ids, answer.logprobs)):
        values = [value for value, _ in top]
        assert len(top) == 4 and values == sorted(values, reverse=True)
        assert top[0] == (pytest.approx(logprob, abs=1e-6), token)
        expected = [float(reference[position, t]) for _, t in top]
        assert values == pytest.approx(expected, abs=engine_under_test.logprob_atol)


async def test_stop_token_ends_generation_at_its_first_occurrence(client):
    reference = (await generate(client, PROMPT, **GREEDY)).output_ids
    stop = reference[3]
    first = reference.index(stop)
    out = await generate(client, PROMPT, **{**GREEDY, "ignore_eos": False, "stop_token_ids": [stop]})
    assert out.output_ids == reference[: first + 1]  # the stop token is part of the sampled tokens
    assert out.finish_type == "stop"
    assert out.finish_reason.get("matched") == stop


async def test_ignore_eos_also_ignores_stop_tokens(client):
    # SGLang checks stop_token_ids and EOS together, and ignore_eos skips that whole check.
    reference = (await generate(client, PROMPT, **GREEDY)).output_ids
    out = await generate(client, PROMPT, **{**GREEDY, "stop_token_ids": [reference[1]]})
    assert out.output_ids == reference
    assert out.finish_type == "length"


async def test_abort_mid_generation_returns_the_tokens_so_far(client, context_length):
    max_new = context_length - len(PROMPT) - 8
    params = {**GREEDY, "max_new_tokens": max_new}
    rid = uuid.uuid4().hex
    task = asyncio.create_task(client.generate(PROMPT, params, rid=rid))
    await wait_until_running(client)
    await asyncio.sleep(0.2)  # let it decode some tokens (not an assertion on speed)
    await client.abort_request(rid=rid)
    out = parse_generate_output(await task)
    assert out.finish_type == "abort"
    assert 0 < len(out.output_ids) < max_new
    assert len(out.logprobs) == len(out.output_ids)
    # The partial response is exactly the beginning of the full greedy response.
    full = await generate(client, PROMPT, **{**GREEDY, "max_new_tokens": len(out.output_ids)})
    assert out.output_ids == full.output_ids


async def test_abort_all_ends_every_running_request(client, context_length):
    params = {**GREEDY, "max_new_tokens": context_length - len(PROMPT) - 8}
    tasks = [asyncio.create_task(client.generate(PROMPT, params)) for _ in range(3)]
    await wait_until_running(client)
    await client.abort_request(abort_all=True)
    outs = [parse_generate_output(d) for d in await asyncio.gather(*tasks)]
    assert [o.finish_type for o in outs] == ["abort"] * 3


async def test_pause_aborts_running_requests_and_holds_new_ones_until_continue(client, context_length):
    long_params = {**GREEDY, "max_new_tokens": context_length - len(PROMPT) - 8}
    running = asyncio.create_task(client.generate(PROMPT, long_params))
    await wait_until_running(client)
    await client.pause_generation(mode="abort")
    try:
        aborted = parse_generate_output(await running)
        assert aborted.finish_type == "abort"
        held = asyncio.create_task(client.generate(PROMPT, GREEDY))
        await asyncio.sleep(0.5)  # time for a 12-token request to finish if the pause were ignored
        assert not held.done()
    finally:
        await client.continue_generation()
    out = parse_generate_output(await held)
    assert out.finish_type == "length"
    assert len(out.output_ids) == GREEDY["max_new_tokens"]


# ---- weight updates


async def test_update_from_disk_changes_greedy_output_and_weight_version(
    client, perturbed_model_dir, hf_model, restore_weights
):
    before = await generate(client, PROMPT, **GREEDY)
    answer = await client.update_weights_from_disk(str(perturbed_model_dir), weight_version="contract-v2")
    assert answer["success"] is True
    after = await generate(client, PROMPT, **GREEDY)
    assert after.output_ids != before.output_ids
    assert after.weight_version == "contract-v2"
    assert await client.get_weight_version() == "contract-v2"


async def test_update_from_disk_serves_exactly_the_new_checkpoint(
    client, perturbed_model_dir, engine_under_test, restore_weights
):
    from transformers import AutoModelForCausalLM

    perturbed = AutoModelForCausalLM.from_pretrained(perturbed_model_dir, dtype=torch.float32).eval()
    await client.update_weights_from_disk(str(perturbed_model_dir))
    out = await generate(client, PROMPT, temperature=1.0, max_new_tokens=16, ignore_eos=True)
    expected = recompute_logprobs(perturbed, PROMPT, out.output_ids, 1.0)
    assert max(abs(a - b) for a, b in zip(out.logprobs, expected)) <= engine_under_test.logprob_atol


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def _distributed_update(
    client: EngineClient, checkpoint: Path, backend: str, version: str, env: dict[str, str]
) -> None:
    """Play the trainer in a real subprocess and push `checkpoint` through a broadcast group."""
    server_info = await client.get_server_info()
    world_size = 1 + int(server_info.get("tp_size", 1))
    port = _free_port()
    group = f"contract-{uuid.uuid4().hex[:8]}"
    trainer = await asyncio.create_subprocess_exec(
        sys.executable, str(Path(__file__).with_name("broadcast_weights.py")),
        "--model-dir", str(checkpoint), "--init-method", f"tcp://127.0.0.1:{port}",
        "--world-size", str(world_size), "--group-name", group, "--backend", backend,
        "--timeout-s", str(DISTRIBUTED_UPDATE_TIMEOUT_S),
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={**os.environ, **env},
    )
    try:
        # A group that never forms must fail this test with a reason, not hang the suite.
        async with asyncio.timeout(DISTRIBUTED_UPDATE_TIMEOUT_S):
            announcement = json.loads(await trainer.stdout.readline())
            await client.init_weights_update_group("127.0.0.1", port, 1, world_size, group, backend)
            await client.update_weights_from_distributed(
                announcement["names"], announcement["dtypes"], announcement["shapes"], group, weight_version=version
            )
            await client.destroy_weights_update_group(group)
            trainer.stdin.close()
            assert await trainer.wait() == 0
    except TimeoutError:
        trainer.kill()
        await trainer.wait()
        log = (await trainer.stderr.read()).decode(errors="replace")[-3000:]
        pytest.fail(
            f"weight-update group {group!r} ({backend}, tcp://127.0.0.1:{port}, world size {world_size}) "
            f"did not complete within {DISTRIBUTED_UPDATE_TIMEOUT_S} s; trainer side's log:\n{log}"
        )
    finally:
        if trainer.returncode is None:
            trainer.kill()
            await trainer.wait()


async def test_distributed_update_equals_disk_update(client, perturbed_model_dir, engine_under_test, restore_weights):
    await client.update_weights_from_disk(str(perturbed_model_dir), weight_version="disk")
    from_disk = await generate(client, PROMPT, **GREEDY)
    await client.update_weights_from_disk(str(engine_under_test.model_dir))

    await _distributed_update(
        client, perturbed_model_dir, engine_under_test.backend, "broadcast", engine_under_test.trainer_env
    )
    from_broadcast = await generate(client, PROMPT, **GREEDY)

    assert from_broadcast.output_ids == from_disk.output_ids
    assert from_broadcast.logprobs == pytest.approx(from_disk.logprobs, abs=1e-6)
    assert from_broadcast.weight_version == "broadcast"


async def test_failed_update_from_a_missing_dir_keeps_the_old_weights(client, restore_weights):
    before = await generate(client, PROMPT, **GREEDY)
    version = await client.get_weight_version()
    with pytest.raises(EngineHTTPError) as info:
        await client.update_weights_from_disk("/nonexistent/checkpoint", weight_version="never")
    assert info.value.status == 400
    assert (await generate(client, PROMPT, **GREEDY)).output_ids == before.output_ids
    assert await client.get_weight_version() == version


async def test_failed_update_with_other_shapes_keeps_the_old_weights(client, mismatched_model_dir, restore_weights):
    before = await generate(client, PROMPT, **GREEDY)
    with pytest.raises(EngineHTTPError) as info:
        await client.update_weights_from_disk(str(mismatched_model_dir), weight_version="never")
    assert info.value.status == 400
    after = await generate(client, PROMPT, **GREEDY)
    assert after.output_ids == before.output_ids
    # Not bit-equal: the second request may reuse the first one's prefix cache, and a prefill
    # over cached KV rounds differently from a fresh one on some CPUs (seen: 5e-7). Other
    # weights would move the logprobs by orders of magnitude more.
    assert after.logprobs == pytest.approx(before.logprobs, abs=1e-5)
    assert after.weight_version != "never"


# ---- bad input: always a 400 with a message, and the engine keeps serving


async def test_malformed_json_is_a_400(engine_under_test, client):
    headers = {"Content-Type": "application/json"}
    if engine_under_test.api_key:
        headers["Authorization"] = f"Bearer {engine_under_test.api_key}"
    async with aiohttp.ClientSession() as session:
        async with session.post(engine_under_test.url + "/generate", data=b'{"input_ids": [1, 2', headers=headers) as r:
            assert r.status == 400
    assert await client.health_generate() is True


@pytest.mark.parametrize("case", ["negative_max_new_tokens", "prompt_longer_than_context"])
async def test_bad_generate_input_is_a_400_naming_the_problem(client, context_length, case):
    prompt, params = PROMPT, dict(GREEDY)
    if case == "negative_max_new_tokens":
        params["max_new_tokens"] = -1
    else:
        prompt = [PROMPT[0]] * (context_length + 10)
    with pytest.raises(EngineHTTPError) as info:
        await client.generate(prompt, params)
    assert info.value.status == 400
    assert info.value.message
    assert await client.health_generate() is True


async def test_an_unknown_sampling_field_is_rejected_not_ignored(engine_under_test, client):
    # A typo must not silently sample at the default temperature. Sent raw: EngineClient
    # already refuses it before sending. The CPU engine answers 400; SGLang 0.5.17 answers 500
    # (a TypeError from its SamplingParams), which is why the client checks the names itself.
    headers = {"Authorization": f"Bearer {engine_under_test.api_key}"} if engine_under_test.api_key else {}
    body = {"input_ids": PROMPT, "sampling_params": {**GREEDY, "temprature": 0.5}}
    async with aiohttp.ClientSession() as session:
        async with session.post(engine_under_test.url + "/generate", json=body, headers=headers) as r:
            status = r.status
    if engine_under_test.kind == "cpu":
        assert status == 400
    else:
        assert status >= 400
    assert await client.health_generate() is True


# Last on purpose: SGLang 0.5.17 does not check ids against the vocabulary and its scheduler
# dies on a device-side assert (seen on an H200, 2026-11-29), so the rollout checks ids before
# sending. Expected to fail there; it would also fail every test after it.
@pytest.mark.xfail(
    os.environ.get("SLIME_ASYNC_TEST_ENGINE_URL") is not None,
    reason="SGLang 0.5.17 crashes on out-of-vocabulary input ids instead of answering 400",
    strict=False,
)
async def test_token_outside_the_vocabulary_is_a_400(client, vocab_size):
    with pytest.raises(EngineHTTPError) as info:
        await client.generate(PROMPT + [vocab_size + 5], GREEDY)
    assert info.value.status == 400
    assert await client.health_generate() is True
