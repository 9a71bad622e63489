"""CPU engine /generate and discovery endpoints: SGLang's shapes, sampling, logprobs, 400s."""

from __future__ import annotations

import aiohttp
import pytest
import torch

PROMPT = [5, 6, 7, 8, 9]


async def generate(http: aiohttp.ClientSession, url: str, **body) -> dict | list:
    async with http.post(url + "/generate", json=body) as resp:
        assert resp.status == 200, await resp.text()
        return await resp.json()


async def test_generate_returns_sglang_shaped_output(engine_url, http):
    out = await generate(
        http,
        engine_url,
        input_ids=PROMPT,
        sampling_params={"max_new_tokens": 4, "ignore_eos": True},
        return_logprob=True,
    )
    meta = out["meta_info"]
    assert len(out["output_ids"]) == 4
    assert meta["finish_reason"] == {"type": "length", "length": 4}
    assert (meta["prompt_tokens"], meta["completion_tokens"]) == (5, 4)
    assert meta["weight_version"] == "default"
    assert isinstance(meta["cached_tokens"], int) and isinstance(meta["id"], str)
    assert [entry[1] for entry in meta["output_token_logprobs"]] == out["output_ids"]
    assert all(isinstance(lp, float) and lp <= 0 and none is None for lp, _, none in meta["output_token_logprobs"])


async def test_rid_is_returned_as_meta_info_id(engine_url, http):
    out = await generate(http, engine_url, input_ids=PROMPT, rid="my-request", sampling_params={"max_new_tokens": 1})
    assert out["meta_info"]["id"] == "my-request"


async def test_output_logprobs_are_absent_unless_requested(engine_url, http):
    out = await generate(http, engine_url, input_ids=PROMPT, sampling_params={"max_new_tokens": 2})
    assert "output_token_logprobs" not in out["meta_info"]


async def test_batch_of_prompts_returns_one_output_per_prompt_in_order(engine_url, http):
    outs = await generate(
        http,
        engine_url,
        input_ids=[[5, 6], [7, 8, 9], [10]],
        sampling_params=[{"max_new_tokens": n, "ignore_eos": True} for n in (1, 2, 3)],
        rid=["a", "b", "c"],
    )
    assert [o["meta_info"]["id"] for o in outs] == ["a", "b", "c"]
    assert [len(o["output_ids"]) for o in outs] == [1, 2, 3]
    assert [o["meta_info"]["prompt_tokens"] for o in outs] == [2, 3, 1]


async def test_greedy_generation_follows_the_argmax_of_transformers(engine_url, http, hf_model):
    out = await generate(
        http, engine_url, input_ids=PROMPT, sampling_params={"temperature": 0, "max_new_tokens": 6, "ignore_eos": True}
    )
    expected = hf_model.generate(
        torch.tensor([PROMPT]), max_new_tokens=6, do_sample=False, eos_token_id=None, pad_token_id=0
    )[0, len(PROMPT) :].tolist()
    assert out["output_ids"] == expected


async def test_greedy_logprobs_are_log_softmax_of_untempered_logits(engine_url, http, recompute_logprobs):
    out = await generate(
        http,
        engine_url,
        input_ids=PROMPT,
        sampling_params={"temperature": 0, "max_new_tokens": 5, "ignore_eos": True},
        return_logprob=True,
    )
    got = torch.tensor([lp for lp, _, _ in out["meta_info"]["output_token_logprobs"]])
    assert torch.allclose(got, recompute_logprobs(PROMPT, out["output_ids"], 1.0), atol=1e-4)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
async def test_sampled_logprobs_match_a_transformers_recompute(engine_url, http, recompute_logprobs, temperature):
    out = await generate(
        http,
        engine_url,
        input_ids=PROMPT,
        sampling_params={"temperature": temperature, "max_new_tokens": 12, "ignore_eos": True, "sampling_seed": 3},
        return_logprob=True,
    )
    got = torch.tensor([lp for lp, _, _ in out["meta_info"]["output_token_logprobs"]])
    expected = recompute_logprobs(PROMPT, out["output_ids"], temperature)
    assert (got - expected).abs().max().item() < 1e-4


async def test_sampling_seed_makes_sampling_reproducible(engine_url, http):
    params = {"temperature": 1.0, "max_new_tokens": 8, "ignore_eos": True, "sampling_seed": 11}
    first = await generate(http, engine_url, input_ids=PROMPT, sampling_params=params)
    second = await generate(http, engine_url, input_ids=PROMPT, sampling_params=params)
    assert first["output_ids"] == second["output_ids"]


async def test_stop_token_id_ends_generation_with_matched_token(engine_url, http):
    greedy = {"temperature": 0, "max_new_tokens": 8}
    free = await generate(http, engine_url, input_ids=PROMPT, sampling_params=greedy)
    stop = free["output_ids"][2]
    first_hit = free["output_ids"].index(stop)
    out = await generate(http, engine_url, input_ids=PROMPT, sampling_params={**greedy, "stop_token_ids": [stop]})
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    assert out["output_ids"] == free["output_ids"][: first_hit + 1]


async def test_ignore_eos_also_ignores_stop_token_ids(engine_url, http):
    greedy = {"temperature": 0, "max_new_tokens": 8, "ignore_eos": True}
    free = await generate(http, engine_url, input_ids=PROMPT, sampling_params=greedy)
    out = await generate(
        http, engine_url, input_ids=PROMPT, sampling_params={**greedy, "stop_token_ids": [free["output_ids"][1]]}
    )
    assert out["output_ids"] == free["output_ids"]


async def test_length_limit_wins_over_a_stop_token_on_the_last_step(engine_url, http):
    greedy = {"temperature": 0, "max_new_tokens": 3}
    free = await generate(http, engine_url, input_ids=PROMPT, sampling_params=greedy)
    last = free["output_ids"][-1]
    assert last not in free["output_ids"][:-1], "precondition: the last greedy token must be new; change PROMPT"
    out = await generate(http, engine_url, input_ids=PROMPT, sampling_params={**greedy, "stop_token_ids": [last]})
    assert out["meta_info"]["finish_reason"] == {"type": "length", "length": 3}


async def test_max_new_tokens_zero_returns_no_tokens(engine_url, http):
    out = await generate(http, engine_url, input_ids=PROMPT, sampling_params={"max_new_tokens": 0})
    assert out["output_ids"] == []
    assert out["meta_info"]["finish_reason"] == {"type": "length", "length": 0}


async def test_generation_stops_at_the_context_length(engine_url, http):
    prompt = [7] * 1020  # the tiny model's context is 1024
    out = await generate(http, engine_url, input_ids=prompt, sampling_params={"max_new_tokens": 50, "ignore_eos": True})
    assert len(out["output_ids"]) == 4
    assert out["meta_info"]["finish_reason"]["type"] == "length"


async def test_text_prompt_is_tokenized_and_output_text_decoded(engine_url, http):
    out = await generate(http, engine_url, text="1+2=", sampling_params={"max_new_tokens": 3, "ignore_eos": True})
    assert out["meta_info"]["prompt_tokens"] == 4  # digits are single tokens
    assert isinstance(out["text"], str)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"{not json", "malformed JSON"),
        ({"input_ids": [5, 6, 100000]}, "outside the vocabulary"),
        ({"input_ids": [5, -1]}, "outside the vocabulary"),
        ({"input_ids": []}, "non-empty"),
        ({"input_ids": PROMPT, "sampling_params": {"max_new_tokens": -1}}, "max_new_tokens"),
        ({"input_ids": [5] * 2000}, "context length"),
        ({"input_ids": PROMPT, "sampling_params": {"temprature": 0.5}}, "unknown sampling_params field 'temprature'"),
        ({"input_ids": PROMPT, "sampling_params": {"stop": ["x"]}}, "not supported"),
        ({"input_ids": PROMPT, "sampling_params": {"top_p": 0}}, "top_p"),
        ({"input_ids": [[5], [6]], "rid": ["only-one"]}, "rid has 1 entries"),
        ({"input_ids": PROMPT, "sampling_params": {"stop_token_ids": [[1]]}}, "stop_token_ids"),
        ({"input_ids": PROMPT, "return_logprob": True, "logprob_start_len": -2}, "logprob_start_len must be -1 or"),
    ],
    ids=[
        "malformed",
        "vocab",
        "negative-id",
        "empty",
        "max-new-tokens",
        "too-long",
        "unknown-field",
        "unsupported-field",
        "top-p",
        "batch-length",
        "stop-ids",
        "negative-logprob-start",
    ],
)
async def test_bad_generate_request_gets_400_with_a_message(engine_url, http, body, message):
    kwargs = {"data": body} if isinstance(body, bytes) else {"json": body}
    async with http.post(engine_url + "/generate", **kwargs) as resp:
        assert resp.status == 400
        assert message in (await resp.json())["error"]["message"]


async def test_health_generate_runs_a_generation(engine_url, http):
    async with http.get(engine_url + "/health_generate") as resp:
        assert resp.status == 200


async def test_model_info_reports_path_and_weight_version(engine_url, http, tiny_model_dir):
    async with http.get(engine_url + "/get_model_info") as resp:
        info = await resp.json()
    assert info["model_path"] == str(tiny_model_dir)
    assert info["weight_version"] == "default"
    assert info["is_generation"] is True


async def test_server_info_reports_tp_size_and_weight_version(engine_url, http):
    async with http.get(engine_url + "/get_server_info") as resp:
        info = await resp.json()
    assert info["tp_size"] == 1
    assert info["weight_version"] == "default"


async def test_get_weight_version_reports_the_served_version(engine_url, http):
    async with http.get(engine_url + "/get_weight_version") as resp:
        assert await resp.json() == {"weight_version": "default"}


async def test_v1_loads_reports_running_and_waiting_counts(engine_url, http):
    async with http.get(engine_url + "/v1/loads") as resp:
        loads = await resp.json()
    assert loads["dp_rank_count"] == 1
    entry = loads["loads"][0]
    assert entry["num_running_reqs"] == 0 and entry["num_waiting_reqs"] == 0
    assert loads["aggregate"]["total_reqs"] == 0


@pytest.mark.parametrize("temperature", [0.0, 0.7])
async def test_top_logprobs_are_the_most_likely_tokens_of_the_sampled_distribution(engine_url, http, hf_model,
                                                                                    temperature):
    """SGLang's ``top_logprobs_num``: per output token ``meta_info.output_top_logprobs`` holds the k
    most likely [logprob, token_id, null] of the distribution the token's logprob comes from."""
    params = {"temperature": temperature, "max_new_tokens": 5, "ignore_eos": True}
    out = await generate(http, engine_url, input_ids=PROMPT, sampling_params=params, return_logprob=True,
                         top_logprobs_num=3)
    tops = out["meta_info"]["output_top_logprobs"]
    with torch.no_grad():
        logits = hf_model(torch.tensor([PROMPT + out["output_ids"]])).logits[0, len(PROMPT) - 1:-1].float()
    expected = torch.log_softmax(logits / (temperature or 1.0), dim=-1).topk(3)
    assert len(tops) == len(out["output_ids"]) and out["meta_info"]["input_top_logprobs"] == []
    for top, values, ids in zip(tops, expected.values, expected.indices):
        assert [token for _, token, _ in top] == ids.tolist() and all(text is None for _, _, text in top)
        assert [logprob for logprob, _, _ in top] == pytest.approx(values.tolist(), abs=1e-4)
    if temperature == 0.0:  # greedy: the most likely token is the one sampled
        assert [top[0][1] for top in tops] == out["output_ids"]
        assert [top[0][0] for top in tops] == [lp for lp, _, _ in out["meta_info"]["output_token_logprobs"]]


async def test_top_logprobs_are_absent_unless_asked_for_and_a_bad_count_is_a_400(engine_url, http):
    out = await generate(http, engine_url, input_ids=PROMPT, sampling_params={"max_new_tokens": 2},
                         return_logprob=True)
    assert "output_top_logprobs" not in out["meta_info"]
    async with http.post(engine_url + "/generate", json={"input_ids": PROMPT, "top_logprobs_num": -1}) as resp:
        assert resp.status == 400 and "top_logprobs_num" in (await resp.json())["error"]["message"]
