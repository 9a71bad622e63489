"""The generate-hook contract of `GenerateContext.generate_turn`: partial-rollout resumption.

The router is replaced by a scripted stand-in that answers with SGLang-shaped `/generate`
bodies, so each abort/resume case is exact; the real router and engines are exercised by
tests/e2e/test_rl_run.py.
"""

import pytest

from actors.rollout.generate import MAX_RESUMES, GenerateContext, GenerationFailed, default_generate
from slime_async.sample import Sample, Status


def answer(tokens: list[int], finish: str, version: int) -> dict:
    return {"meta_info": {"output_token_logprobs": [[-0.5, t, None] for t in tokens],
                          "finish_reason": {"type": finish}, "weight_version": str(version)}}


class ScriptedRouter:
    def __init__(self, answers: list[dict]):
        self.answers = list(answers)
        self.requests: list[tuple[list[int], dict]] = []

    async def ask(self, method: str, input_ids: list[int], sampling_params: dict, **kwargs) -> dict:
        assert method == "generate"
        self.requests.append((list(input_ids), dict(sampling_params)))
        return self.answers.pop(0)


def context(router: ScriptedRouter) -> GenerateContext:
    return GenerateContext(router=router, tokenizer=None, config=None, vocab_size=100)


def prompt_sample() -> Sample:
    return Sample(group_index=0, index=0, prompt="p", tokens=[1, 2])


async def test_an_aborted_turn_resumes_from_its_tokens_with_the_remaining_budget():
    router = ScriptedRouter([answer([10, 11, 12], "abort", 1), answer([13, 14], "length", 2)])
    sample = await default_generate(context(router), prompt_sample(), {"max_new_tokens": 5})

    assert router.requests[1] == ([1, 2, 10, 11, 12], {"max_new_tokens": 2})
    assert sample.tokens == [1, 2, 10, 11, 12, 13, 14]
    assert sample.token_versions == [1, 1, 1, 2, 2]
    assert sample.rollout_logprobs == [-0.5] * 5 and sample.loss_mask == [1] * 5
    assert sample.metadata == {"resumes": 1, "tokens_kept_on_abort": 3}
    assert sample.status is Status.TRUNCATED


async def test_an_abort_before_any_token_resumes_with_the_whole_budget():
    router = ScriptedRouter([answer([], "abort", 1), answer([20], "stop", 2)])
    sample = await default_generate(context(router), prompt_sample(), {"max_new_tokens": 4})

    assert router.requests[1] == ([1, 2], {"max_new_tokens": 4})
    assert sample.token_versions == [2]
    assert sample.metadata == {"resumes": 1, "tokens_kept_on_abort": 0}
    assert sample.status is Status.COMPLETED


async def test_a_turn_whose_budget_an_abort_used_up_ends_as_length_without_another_request():
    router = ScriptedRouter([answer([10, 11], "abort", 1)])
    finish = await context(router).generate_turn(prompt_sample(), {"max_new_tokens": 2})

    assert finish == "length" and len(router.requests) == 1


async def test_a_turn_aborted_without_end_fails_instead_of_looping():
    router = ScriptedRouter([answer([], "abort", 1)] * MAX_RESUMES)
    with pytest.raises(GenerationFailed, match=f"aborted {MAX_RESUMES} times"):
        await context(router).generate_turn(prompt_sample(), {"max_new_tokens": 4})


async def test_an_out_of_vocabulary_id_fails_the_sample_before_reaching_an_engine():
    router = ScriptedRouter([])
    sample = Sample(group_index=0, index=0, prompt="p", tokens=[1, 100])
    with pytest.raises(GenerationFailed, match=r"outside the vocabulary \[0, 100\)"):
        await context(router).generate_turn(sample, {"max_new_tokens": 4})
    assert router.requests == []


class CharTokenizer:
    """Token id i decodes to chr(i): text stop strings can be written as ids."""

    def decode(self, ids: list[int]) -> str:
        return "".join(map(chr, ids))


def text_context(router: ScriptedRouter) -> GenerateContext:
    return GenerateContext(router=router, tokenizer=CharTokenizer(), config=None, vocab_size=1000)


async def test_a_text_stop_string_ends_the_turn_at_the_token_that_completes_it():
    ids = [ord(c) for c in "x=1</code>tail"]
    router = ScriptedRouter([answer(ids[:4], "length", 1), answer(ids[4:8], "length", 1), answer(ids[8:12], "length", 2)])
    sample = prompt_sample()
    finish = await text_context(router).generate_turn(sample, {"max_new_tokens": 32}, stop=["</code>"], chunk_tokens=4)

    assert finish == "stop"
    assert [request[1]["max_new_tokens"] for request in router.requests] == [4, 4, 4]
    assert router.requests[2][0] == [1, 2] + ids[:8]  # each chunk continues the one before
    assert sample.response_tokens == [ord(c) for c in "x=1</code>"]
    assert sample.token_versions == [1] * 8 + [2, 2] and sample.loss_mask == [1] * 10


async def test_a_turn_with_stop_strings_ends_on_the_engines_stop_or_its_budget_without_a_match():
    router = ScriptedRouter([answer([65, 66], "stop", 1)])
    assert await text_context(router).generate_turn(prompt_sample(), {"max_new_tokens": 8}, stop=["</code>"]) == "stop"
    router = ScriptedRouter([answer([65] * 4, "length", 1), answer([66] * 2, "length", 1)])
    sample = prompt_sample()
    assert await text_context(router).generate_turn(sample, {"max_new_tokens": 6}, stop=["Z"], chunk_tokens=4) == "length"
    assert sample.response_tokens == [65] * 4 + [66] * 2 and len(router.requests) == 2


async def test_an_aborted_chunk_resumes_and_the_stop_string_can_span_the_abort():
    router = ScriptedRouter([answer([ord("<"), ord("/")], "abort", 1), answer([ord(c) for c in "b>zz"], "length", 2)])
    sample = prompt_sample()
    finish = await text_context(router).generate_turn(sample, {"max_new_tokens": 8}, stop=["</b>"], chunk_tokens=4)

    assert finish == "stop" and sample.response_tokens == [ord(c) for c in "</b>"]
    assert sample.token_versions == [1, 1, 2, 2] and sample.metadata["resumes"] == 1
