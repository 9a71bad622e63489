"""The embedded CPU engine serving SmolLM2-135M-Instruct (fp32) agrees with transformers.

Four chat prompts go to one engine process as one batch, so they decode together with
different lengths (left-padded KV, masks) while the reference runs each alone:
- greedy: the continuation equals ``generate(do_sample=False)`` token for token, EOS included;
- sampled at temperature 1: each reported logprob is within 1e-4 of log_softmax(logits / T) at
  the chosen token, recomputed by one full transformers forward over prompt + continuation.
"""

from __future__ import annotations

import json
import tempfile
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from actors.engine.cpu.local import start_local_engine, stop_local_engine

pytestmark = [pytest.mark.realmodel, pytest.mark.timeout(600)]

PROMPTS = {
    "arithmetic": "What is 17 + 25? Explain your steps.",
    "instruction": "Write a short poem about the sea.",
    "fact": "Why is the sky blue?",
    "list": "List five fruits and their colors.",
}
MAX_NEW_TOKENS = 40
TEMPERATURE = 1.0
LOGPROB_TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def engine_url(smollm2_dir: Path) -> Iterator[str]:
    log_path = Path(tempfile.mkdtemp(prefix="cpu-engine-real-")) / "engine.log"
    process, url = start_local_engine(smollm2_dir, log_path, timeout=240)
    try:
        yield url
    finally:
        stop_local_engine(process)


def generate_batch(url: str, input_ids: list[list[int]], sampling_params: dict) -> list[dict]:
    body = {"input_ids": input_ids, "sampling_params": [sampling_params] * len(input_ids), "return_logprob": True}
    request = urllib.request.Request(url + "/generate", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=300) as response:
        return json.loads(response.read())


@pytest.fixture(scope="module")
def prompt_ids(chat_ids) -> dict[str, list[int]]:
    return {name: chat_ids([{"role": "user", "content": text}], True) for name, text in PROMPTS.items()}


@pytest.fixture(scope="module")
def greedy(engine_url, prompt_ids) -> dict[str, dict]:
    outs = generate_batch(engine_url, list(prompt_ids.values()), {"temperature": 0, "max_new_tokens": MAX_NEW_TOKENS})
    return dict(zip(prompt_ids, outs))


@pytest.fixture(scope="module")
def sampled(engine_url, prompt_ids) -> dict[str, dict]:
    outs = generate_batch(
        engine_url, list(prompt_ids.values()),
        {"temperature": TEMPERATURE, "max_new_tokens": MAX_NEW_TOKENS, "ignore_eos": True, "sampling_seed": 7},
    )
    return dict(zip(prompt_ids, outs))


@pytest.mark.parametrize("name", PROMPTS)
def test_greedy_continuation_equals_transformers_generate(greedy, prompt_ids, hf_model, tokenizer, name):
    prompt = prompt_ids[name]
    with torch.no_grad():
        expected = hf_model.generate(
            torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            max_new_tokens=MAX_NEW_TOKENS, do_sample=False,
        )[0, len(prompt):].tolist()
    got = greedy[name]["output_ids"]
    print(f"{name}: {len(got)} tokens {tokenizer.decode(got)!r}")
    assert got == expected, f"engine {tokenizer.decode(got)!r}\n transformers {tokenizer.decode(expected)!r}"


@pytest.mark.parametrize("name", PROMPTS)
def test_sampled_logprobs_match_a_transformers_recompute_within_1e_4(sampled, prompt_ids, hf_model, name):
    prompt, out = prompt_ids[name], sampled[name]
    output = out["output_ids"]
    assert len(output) == MAX_NEW_TOKENS
    assert [token for _, token, _ in out["meta_info"]["output_token_logprobs"]] == output
    got = torch.tensor([logprob for logprob, _, _ in out["meta_info"]["output_token_logprobs"]])
    with torch.no_grad():
        logits = hf_model(torch.tensor([prompt + output])).logits[0]
    positions = torch.arange(len(prompt) - 1, len(prompt) + len(output) - 1)
    expected = torch.log_softmax(logits[positions] / TEMPERATURE, dim=-1)[torch.arange(len(output)), output]
    max_diff = (got - expected).abs().max().item()
    report = f"{name}: max |Δ logprob| = {max_diff:.3e} over {len(output)} sampled tokens"
    print(report)
    assert max_diff <= LOGPROB_TOLERANCE, report
