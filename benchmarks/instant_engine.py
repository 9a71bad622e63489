"""An engine double that answers at once, for measuring what the router's front costs on its own.

It speaks SGLang's native ``/generate`` as the router uses it (``input_ids`` and
``sampling_params.max_new_tokens`` in; ``output_ids`` and ``meta_info`` with
``output_token_logprobs``, ``finish_reason``, ``prompt_tokens``, ``completion_tokens``,
``cached_tokens``, ``weight_version`` out; a list of ``input_ids`` is a batch) plus the discovery
routes the router reads (``/health_generate``, ``/get_model_info``, ``/server_info``,
``/v1/loads``). No model runs: the answer is one of two fixed texts an agent would get, tokenized
once at start with the model's own tokenizer:

- to a prompt that does not end in a tool result, a hermes tool call of ``add``;
- to one that does, a short final answer (with multi-byte characters, so decoding sees them).

Chunked requests continue where the last one stopped: a request whose ``input_ids`` end with the
generation prompt and the first j tokens of an answer gets the tokens after them. It is stateless, so any number of
sessions can run through it concurrently. Answers end with ``<|im_end|>`` (finish ``stop``, the
stop token kept in ``output_ids`` as SGLang does).

    python -m benchmarks.instant_engine --model-path DIR [--port 0]   # prints "engine listening on URL"
"""

from __future__ import annotations

import argparse
import asyncio
import time
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web

TOOL_CALL_TEXT = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call><|im_end|>'
ANSWER_TEXT = ("The tool says 2 + 3 = 5, so the answer is 5 — five, cinq, fünf ✓. "
               "Ask me for another sum whenever you like.<|im_end|>")
GENERATION_PROMPT = "<|im_start|>assistant\n"
TOOL_RESULT_END = "</tool_response><|im_end|>\n" + GENERATION_PROMPT


class InstantEngine:
    def __init__(self, tokenizer: Any, weight_version: str = "0", answer_tokens: int | None = None):
        """``answer_tokens``: make the final answer that long (its text repeated), for long outputs."""
        encode = lambda text: list(tokenizer.encode(text, add_special_tokens=False))  # noqa: E731
        self.tool_call, self.answer = encode(TOOL_CALL_TEXT), encode(ANSWER_TEXT)
        if answer_tokens is not None:
            body = self.answer[:-1]
            self.answer = (body * (answer_tokens // len(body) + 1))[:answer_tokens - 1] + self.answer[-1:]
        self.after_tool = encode(TOOL_RESULT_END)
        self.generation_prompt = encode(GENERATION_PROMPT)
        self.weight_version = weight_version
        self.requests = 0
        self._runner: web.AppRunner | None = None
        self.url: str | None = None

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        app = web.Application(client_max_size=256 * 1024 * 1024)
        app.router.add_post("/generate", self._generate)
        for path in ("/health", "/health_generate"):
            app.router.add_get(path, self._health)
        for path in ("/get_model_info", "/model_info"):
            app.router.add_get(path, self._model_info)
        for path in ("/get_server_info", "/server_info"):
            app.router.add_get(path, self._server_info)
        app.router.add_get("/v1/loads", self._loads)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port)
        await site.start()
        self.url = f"http://{host}:{self._runner.addresses[0][1]}"
        return self.url

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def answer_for(self, input_ids: list[int], max_new_tokens: int | None) -> dict[str, Any]:
        started = time.monotonic()
        answer, done = self._continuation(input_ids)
        budget = len(answer) - done if max_new_tokens is None else max_new_tokens
        ids = answer[done:done + budget]
        finished = done + len(ids) == len(answer)
        finish = {"type": "stop", "matched": answer[-1]} if finished else {"type": "length", "length": budget}
        logprobs = [[-0.01 * (done + i + 1), t, None] for i, t in enumerate(ids)]
        self.requests += 1
        return {"output_ids": ids, "meta_info": {
            "id": f"instant-{self.requests}", "finish_reason": finish, "prompt_tokens": len(input_ids),
            "completion_tokens": len(ids), "cached_tokens": 0, "weight_version": self.weight_version,
            "e2e_latency": time.monotonic() - started, "output_token_logprobs": logprobs}}

    def _continuation(self, input_ids: list[int]) -> tuple[list[int], int]:
        """(the answer, how many of its tokens ``input_ids`` already ends with): what follows the
        last generation prompt, when it is the start of an answer, else a new answer."""
        prompt, n = self.generation_prompt, len(self.generation_prompt)
        start = next((i + n for i in range(len(input_ids) - n, -1, -1) if input_ids[i:i + n] == prompt), len(input_ids))
        done = len(input_ids) - start
        for answer in (self.tool_call, self.answer):
            if 0 < done < len(answer) and input_ids[start:] == answer[:done]:
                return answer, done
        tail = self.after_tool
        return (self.answer if input_ids[-len(tail):] == tail else self.tool_call), 0

    async def _generate(self, request: web.Request) -> web.Response:
        body = orjson.loads(await request.read())
        budget = (body.get("sampling_params") or {}).get("max_new_tokens")
        ids = body["input_ids"]
        if ids and isinstance(ids[0], list):
            return _json([self.answer_for(one, budget) for one in ids])
        return _json(self.answer_for(ids, budget))

    async def _health(self, _request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def _model_info(self, _request: web.Request) -> web.Response:
        return _json({"model_path": "instant", "is_generation": True, "weight_version": self.weight_version})

    async def _server_info(self, _request: web.Request) -> web.Response:
        return _json({"model_path": "instant", "max_running_requests": None, "max_total_num_tokens": None,
                      "weight_version": self.weight_version, "stream_interval": 1})

    async def _loads(self, _request: web.Request) -> web.Response:
        return _json({"loads": [{"dp_rank": 0, "num_running_reqs": 0, "num_waiting_reqs": 0}]})


def _json(payload: Any) -> web.Response:
    return web.Response(body=orjson.dumps(payload), content_type="application/json")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-path", type=Path, required=True, help="HF directory whose tokenizer to use")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--answer-tokens", type=int, default=None, help="final answers this long (long outputs)")
    args = parser.parse_args(argv)
    from transformers import AutoTokenizer

    engine = InstantEngine(AutoTokenizer.from_pretrained(str(args.model_path)), answer_tokens=args.answer_tokens)

    async def serve() -> None:
        print(f"engine listening on {await engine.start(args.host, args.port)}", flush=True)
        await asyncio.Event().wait()  # until killed

    try:
        asyncio.run(serve())
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
