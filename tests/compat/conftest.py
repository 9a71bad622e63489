"""Fixtures for the slime compat tests: a local tokenizer and a stand-in for the router's front."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from aiohttp import web

from examples.models.tiny import train_tokenizer

sys.path.insert(0, str(Path(__file__).parent))  # slime_style_plugin is imported as a top-level module


@pytest.fixture(scope="session")
def tokenizer():
    return train_tokenizer(512, 0)


class StandInFront:
    """SGLang's native ``POST /generate`` (``text`` or ``input_ids``), answered from a script.

    Each answer is ``(finish_type, text)``: the text is tokenized to the output ids (cut to
    ``max_new_tokens``), with logprob ``-0.1 * (k + 1)`` for the k-th token and weight version 2.
    The requests it saw are kept for assertions.
    """

    def __init__(self, tokenizer, answers: list[tuple[str, str]]):
        self.tokenizer = tokenizer
        self.answers = list(answers)
        self.requests: list[dict] = []
        self.url = ""

    async def generate(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.requests.append(body)
        text_in, ids_in = body.get("text"), body.get("input_ids")
        if not (isinstance(text_in, str) or isinstance(ids_in, list)) or not body.get("return_logprob"):
            return web.json_response({"error": {"message": "expected text or input_ids, and return_logprob"}},
                                     status=400)
        prompt_ids = ids_in if ids_in is not None else self.tokenizer(text_in, add_special_tokens=False)["input_ids"]
        prompt_tokens = len(prompt_ids)
        finish, text = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"][: body["sampling_params"]["max_new_tokens"]]
        return web.json_response({
            "text": self.tokenizer.decode(ids),
            "output_ids": ids,
            "meta_info": {
                "output_token_logprobs": [[-0.1 * (k + 1), t, None] for k, t in enumerate(ids)],
                "finish_reason": {"type": finish},
                "weight_version": "2",
                "prompt_tokens": prompt_tokens,
            },
        })


@pytest.fixture
async def front_factory(tokenizer):
    runners = []

    async def start(answers: list[tuple[str, str]]) -> StandInFront:
        front = StandInFront(tokenizer, answers)
        app = web.Application()
        app.router.add_post("/generate", front.generate)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        front.url = f"http://127.0.0.1:{port}"
        runners.append(runner)
        return front

    yield start
    for runner in runners:
        await runner.cleanup()
