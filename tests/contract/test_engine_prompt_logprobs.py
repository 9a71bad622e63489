"""Prompt logprobs (SGLang's ``input_token_logprobs``): what a teacher engine answers when it
scores a student's sample (on-policy distillation). Same engines as test_engine_protocol.py.

SGLang 0.5.17's layout: ``[logprob, token_id, null]`` per input position from
``logprob_start_len`` on, the first logprob null; ``logprob_start_len`` -1 (the default) or the
input's length gives no input entry, generating or not; past the input the request is refused;
``max_new_tokens`` 0 returns no output token (finish_reason length 0). Measured against SGLang on a
GPU: benchmarks/gpu/results/sglang_input_contract/.
"""

from __future__ import annotations

import logging

import pytest
import torch

from actors.rollout.teacher import TeacherScorer
from slime_async.engine_client import EngineClient, EngineHTTPError
from slime_async.sample import Sample

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(300)]

PROMPT = [11, 42, 7, 99, 3, 250, 18]


def forward_logprobs(hf_model, ids: list[int]) -> list[float]:
    """log softmax(logits)[next token] at each position: entry j scores ids[j + 1]."""
    with torch.no_grad():
        logits = hf_model(torch.tensor([ids])).logits[0].float()
    logprobs = torch.log_softmax(logits[:-1], dim=-1)
    return logprobs.gather(1, torch.tensor(ids[1:])[:, None]).squeeze(1).tolist()


async def score(client: EngineClient, ids: list[int], start: int | None, max_new_tokens: int = 0,
                temperature: float = 1.0) -> dict:
    return await client.generate(ids, {"temperature": temperature, "max_new_tokens": max_new_tokens,
                                       "ignore_eos": True}, logprob_start_len=start)


async def test_scoring_from_zero_gives_every_input_token_the_first_null(client, hf_model, engine_under_test):
    answer = await score(client, PROMPT, 0)
    entries = answer["meta_info"]["input_token_logprobs"]
    assert [entry[1] for entry in entries] == PROMPT
    assert entries[0][0] is None and all(entry[2] is None for entry in entries)
    expected = forward_logprobs(hf_model, PROMPT)
    assert [entry[0] for entry in entries[1:]] == pytest.approx(expected, abs=engine_under_test.logprob_atol)
    # max_new_tokens 0: a prefill only, no output token
    assert answer["output_ids"] == []
    assert answer["meta_info"]["completion_tokens"] == 0
    assert answer["meta_info"]["finish_reason"]["type"] == "length"
    assert answer["meta_info"]["output_token_logprobs"] == []


@pytest.mark.parametrize("temperature", [0.5, 2.0])
async def test_the_sampling_temperature_does_not_scale_input_token_logprobs(client, hf_model, engine_under_test,
                                                                            temperature):
    # SGLang 0.5.17 normalises input logprobs "w/o temperature, top-p" (its logits processor; the
    # temperature scaling there is gated by a flag /generate never sets): log_softmax of the raw
    # logits, whatever sampling_params say. An OPD teacher engine therefore scores at temperature 1.
    answer = await score(client, PROMPT, 0, temperature=temperature)
    values = [entry[0] for entry in answer["meta_info"]["input_token_logprobs"][1:]]
    assert values == pytest.approx(forward_logprobs(hf_model, PROMPT), abs=engine_under_test.logprob_atol)


async def test_a_later_start_returns_the_tail_its_first_logprob_null(client, hf_model, engine_under_test):
    answer = await score(client, PROMPT, 4)
    entries = answer["meta_info"]["input_token_logprobs"]
    assert [entry[1] for entry in entries] == PROMPT[4:]
    assert entries[0][0] is None
    expected = forward_logprobs(hf_model, PROMPT)[4:]  # scores of PROMPT[5], PROMPT[6]
    assert [entry[0] for entry in entries[1:]] == pytest.approx(expected, abs=engine_under_test.logprob_atol)


async def test_a_cached_prefix_does_not_hide_the_positions_asked_for(client, hf_model, engine_under_test):
    # The first call leaves PROMPT in the prefix cache; the second must still score every token.
    await score(client, PROMPT, -1, max_new_tokens=1)
    answer = await score(client, PROMPT + [5, 6], 0)
    values = [entry[0] for entry in answer["meta_info"]["input_token_logprobs"][1:]]
    assert values == pytest.approx(forward_logprobs(hf_model, PROMPT + [5, 6]), abs=engine_under_test.logprob_atol)


async def test_the_default_start_gives_no_input_entry_generating_or_not(client):
    answer = await score(client, PROMPT, None, max_new_tokens=2)
    assert answer["meta_info"]["input_token_logprobs"] == []
    assert len(answer["output_ids"]) == 2
    prefill_only = await score(client, PROMPT, None)
    assert prefill_only["meta_info"]["input_token_logprobs"] == []


async def test_a_start_at_the_input_length_gives_no_entry_and_past_it_is_refused(client):
    at_end = await score(client, PROMPT, len(PROMPT), max_new_tokens=1)
    assert at_end["meta_info"]["input_token_logprobs"] == [] and len(at_end["output_ids"]) == 1
    last = await score(client, PROMPT, len(PROMPT) - 1)
    assert last["meta_info"]["input_token_logprobs"] == [[None, PROMPT[-1], None]]
    with pytest.raises(EngineHTTPError, match="logprob_start_len"):
        await score(client, PROMPT, len(PROMPT) + 1, max_new_tokens=1)


async def test_the_opd_teacher_scorer_gets_the_response_tokens_logprobs(engine_under_test, client, hf_model,
                                                                        vocab_size, caplog):
    # What the rollout does with a teacher engine (actors/rollout/teacher.py), here on this engine.
    response = [5, 6, 7]
    sample = Sample(group_index=0, index=0, tokens=PROMPT + response, response_length=3, loss_mask=[1, 1, 1],
                    rollout_logprobs=[0.0] * 3, token_versions=[0] * 3)
    broken = Sample(group_index=0, index=1, tokens=PROMPT + [vocab_size + 5], response_length=1, loss_mask=[1],
                    rollout_logprobs=[0.0], token_versions=[0])
    scorer = TeacherScorer(engine_under_test.url, vocab_size=vocab_size, api_key=engine_under_test.api_key)
    try:
        await scorer.score(sample)
        with caplog.at_level(logging.WARNING, logger="actors.rollout.teacher"):
            # An id past the vocabulary kills an SGLang scheduler: never sent; counted, trains without the term.
            await scorer.score(broken)
        assert f"not sent: tokens[{len(PROMPT)}]={vocab_size + 5} is outside the vocabulary" in caplog.text
        assert await client.health_generate()
    finally:
        await scorer.close()
    expected = forward_logprobs(hf_model, PROMPT + response)[-3:]
    assert sample.teacher_logprobs == pytest.approx(expected, abs=engine_under_test.logprob_atol)
    assert broken.teacher_logprobs is None
    metrics = scorer.take()
    assert metrics["rollout/opd_scored_fraction"] == pytest.approx(3 / 4)
    assert metrics["rollout/opd_teacher_errors"] == 1.0 and metrics["rollout/opd_teacher_time"] > 0
    # Nothing scored since: no ratio of nothing (it is not 0), the error count stays.
    assert scorer.take() == {"rollout/opd_teacher_time": 0.0, "rollout/opd_teacher_errors": 1.0}
