"""Acceptance (issue #26): a trajectory captured through the front that spans an in-place weight
update carries each token's true version.

An agent on the stock ``openai`` client talks to the front in one recorded session over a real
CPU engine. Its second turn is generating when the update lands: the engine is armed to pause
in place at its 5th output token (``/debug/pause_in_place_at``: no race with the generation),
then the router's in-place pause, new weights from disk (version 1, no cache flush), and the
router's resume, as a weight sync in mode ``in_place`` does. The captured Sample must say
version 0 for the first 5 tokens of that turn and 1 after; the logprobs, recomputed with
transformers from the two checkpoints, show that the labels are the weights that really produced
each token (the tokens after the update are the new weights' continuation over the old KV).
"""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import openai
import pytest
import torch
from transformers import AutoModelForCausalLM

from actors.engine.cpu.local import start_local_engine, stop_local_engine
from examples.models.tiny import build_tiny_model
from slime_async.sample import Sample
from slime_async.trajectory import to_samples
from tests.front.conftest import with_tool_template

PAUSE_AT = 5  # output tokens of the second turn generated on the old weights
TURN_TOKENS = (4, 12, 3)


@pytest.fixture(scope="module")
def next_weights_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Same shapes and tokenizer as ``chat_model_dir``, other weights: policy version 1."""
    return with_tool_template(build_tiny_model(tmp_path_factory.mktemp("front-tiny-seed1"), arch="qwen2", seed=1))


@pytest.fixture(scope="module")
def private_engine(chat_model_dir: Path) -> Iterator[str]:
    """This module changes the engine's weights: its own engine, not the shared one."""
    log_path = Path(tempfile.mkdtemp(prefix="front-in-place-")) / "engine.log"
    process, url = start_local_engine(chat_model_dir, log_path, timeout=180)
    try:
        yield url
    finally:
        stop_local_engine(process)


async def _turn(client: openai.AsyncOpenAI, messages: list[dict], max_tokens: int) -> dict:
    answer = await client.chat.completions.create(model="tiny", messages=messages, max_tokens=max_tokens,
                                                  temperature=0, extra_body={"ignore_eos": True})
    choice = answer.choices[0]
    messages += [{"role": "assistant", "content": choice.message.content},
                 {"role": "user", "content": "Go on."}]
    return {"prompt": answer.model_extra["prompt_token_ids"], **choice.model_extra}


async def _post(http: aiohttp.ClientSession, url: str, body: dict) -> dict:
    async with http.post(url, json=body) as response:
        assert response.status == 200, await response.text()
        return await response.json()


async def test_a_turn_spanning_an_in_place_update_records_each_tokens_true_version(
        private_engine, chat_model_dir, next_weights_dir, text_model, start_front):
    router, url = await start_front([private_engine], text_model)
    client = openai.AsyncOpenAI(base_url=f"{url}/sessions/agent-1/v1", api_key="unused", max_retries=0)
    messages = [{"role": "user", "content": "What is 2 + 3?"}]
    async with aiohttp.ClientSession() as http:
        first = await _turn(client, messages, TURN_TOKENS[0])
        async with http.post(private_engine + "/debug/pause_in_place_at", json={"output_tokens": PAUSE_AT}) as armed:
            assert armed.status == 200  # the headers come once armed: now the turn may start
            spanning = asyncio.create_task(_turn(client, messages, TURN_TOKENS[1]))
            paused = await armed.json()  # the body once the engine paused in place
        assert paused["output_tokens"] == PAUSE_AT
        await router.ask("pause", "in_place")
        update = await _post(http, private_engine + "/update_weights_from_disk",
                             {"model_path": str(next_weights_dir), "weight_version": "1", "flush_cache": False})
        assert update["success"], update
        assert (await router.ask("resume", "1")) == {private_engine: "up"}
        second = await spanning
        third = await _turn(client, messages, TURN_TOKENS[2])
    turns = await router.ask("take_trajectory", "agent-1")

    assert first["token_weight_versions"] == ["default"] * TURN_TOKENS[0]
    assert second["token_weight_versions"] == ["default"] * PAUSE_AT + ["1"] * (TURN_TOKENS[1] - PAUSE_AT)
    assert third["token_weight_versions"] == ["1"] * TURN_TOKENS[2]
    pieces = to_samples(turns, Sample(group_index=0, index=0, prompt="p", tokens=[], session_id="agent-1"))
    trained = [(token, version) for piece in pieces
               for token, mask, version in zip(piece.response_tokens, piece.loss_mask, piece.token_versions) if mask]
    answers = [first, second, third]
    assert [token for token, _ in trained] == [t for answer in answers for t in answer["token_ids"]]
    assert [version for _, version in trained] == [0] * (TURN_TOKENS[0] + PAUSE_AT) + [1] * (
        TURN_TOKENS[1] - PAUSE_AT + TURN_TOKENS[2])
    old_lp, new_lp = _true_logprobs(chat_model_dir, next_weights_dir, second["prompt"], second["token_ids"])
    assert second["token_logprobs"][:PAUSE_AT] == pytest.approx(old_lp, abs=1e-4)
    assert second["token_logprobs"][PAUSE_AT:] == pytest.approx(new_lp, abs=1e-4)
    assert second["token_logprobs"][PAUSE_AT] != pytest.approx(_old_only(chat_model_dir, second), abs=1e-3)


@torch.no_grad()
def _true_logprobs(old_dir: Path, new_dir: Path, prompt: list[int], output: list[int]
                   ) -> tuple[list[float], list[float]]:
    """Logprobs of ``output`` as the engine computes them across an in-place update at PAUSE_AT:
    the first PAUSE_AT tokens from the old weights; each later one from the new weights over the
    KV the old weights left (prompt + output[:PAUSE_AT - 1]; output[PAUSE_AT - 1] is first read
    after the update)."""
    old = AutoModelForCausalLM.from_pretrained(old_dir, torch_dtype=torch.float32).eval()
    new = AutoModelForCausalLM.from_pretrained(new_dir, torch_dtype=torch.float32).eval()
    ids = torch.tensor([prompt + output])
    before = old(ids[:, :len(prompt) + PAUSE_AT - 1], use_cache=True)
    after = new(ids[:, len(prompt) + PAUSE_AT - 1:-1], past_key_values=before.past_key_values)
    old_rows = before.logits[0, len(prompt) - 1:].log_softmax(-1)
    new_rows = after.logits[0].log_softmax(-1)
    return ([float(old_rows[i, t]) for i, t in enumerate(output[:PAUSE_AT])],
            [float(new_rows[i, t]) for i, t in enumerate(output[PAUSE_AT:])])


@torch.no_grad()
def _old_only(old_dir: Path, answer: dict) -> float:
    """The logprob the old weights give the first token after the update (it must differ)."""
    old = AutoModelForCausalLM.from_pretrained(old_dir, torch_dtype=torch.float32).eval()
    ids = torch.tensor([answer["prompt"] + answer["token_ids"]])
    row = old(ids).logits[0, len(answer["prompt"]) + PAUSE_AT - 1].log_softmax(-1)
    return float(row[answer["token_ids"][PAUSE_AT]])


async def test_arming_a_pause_without_a_token_count_is_refused_naming_the_field(private_engine):
    async with aiohttp.ClientSession() as http:
        async with http.post(private_engine + "/debug/pause_in_place_at", json={"output_tokens": 0}) as response:
            assert response.status == 400
            assert "output_tokens" in (await response.json())["error"]["message"]
