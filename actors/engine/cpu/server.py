"""HTTP routes of the embedded CPU engine: SGLang's native API over the scheduler.

`python -m actors.engine.cpu --model-path DIR [--host 127.0.0.1] [--port N]` serves an
HF-format causal LM on CPU with the endpoints, request and response shapes of SGLang's
http_server (the subset slime-async relies on, see DESIGN.md "Engines"). This module only
parses, validates and shapes JSON; the weight-update and memory routes are in weights.py,
batching lives in scheduler.py and the model in model_runner.py. Bad input is answered with
HTTP 400 and `{"error": {"message": ...}}` as SGLang does. Control requests SGLang's scheduler
dies on are refused with its error, or end the process with --strict-sglang-preconditions
(preconditions.py).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import aiorwlock
import orjson
import torch
from aiohttp import web

from actors.engine.cpu.config import EngineArgs, ModelDirError, parse_args
from actors.engine.cpu.http_json import error_response as _error
from actors.engine.cpu.http_json import json_response as _json
from actors.engine.cpu.http_json import read_json as _read_json
from actors.engine.cpu.http_json import require as _require
from actors.engine.cpu.memory import MemoryOccupation
from actors.engine.cpu.model_runner import ModelRunner
from actors.engine.cpu.preconditions import Preconditions
from actors.engine.cpu.protocol import (BadRequest, GenerateItem, SamplingParams, generate_output, parse_generate,
                                       stream_chunk)
from actors.engine.cpu.scheduler import PAUSE_MODES, REFUSED, Request, Scheduler, SchedulerConfig
from actors.engine.cpu.streaming import StreamedTokens, sse_event
from actors.engine.cpu.weights import WeightRoutes
from slime_async.net import serve_until_signalled
from slime_async.runtime import run as run_event_loop

logger = logging.getLogger("cpu_engine")

VERSION = "slime-async-cpu-engine/0.1"
HEALTH_CHECK_TIMEOUT_S = 20.0
# SGLang's /flush_cache answers (entrypoints/http_server.py).
FLUSHED = ("Cache flushed.\nPlease check backend logs for more details. "
           "(When there are running or waiting requests, the operation will not be performed.)\n")
FLUSH_FAILED = "Flush cache failed.\n"


class EngineServer(WeightRoutes):
    """Routes of one engine; owns the scheduler, the weight-update groups and the preconditions."""

    def __init__(self, args: EngineArgs, runner: ModelRunner, tokenizer: Any | None) -> None:
        self.args = args
        self.runner = runner
        self.tokenizer = tokenizer
        self.model_path = runner.model_path
        self.weight_version = args.weight_version
        # What SGLang dies on: refused and counted, or (strict) the end of this process.
        self.preconditions = Preconditions(strict=args.strict_sglang_preconditions)
        # Colocated training: which memory regions are released (actors/engine/cpu/memory.py);
        # the scheduler asks it before every admission.
        self.memory = MemoryOccupation(runner, self.preconditions)
        self.scheduler = Scheduler(
            runner,
            SchedulerConfig(
                max_running_requests=args.max_running_requests,
                max_total_tokens=args.max_total_tokens,
                prefix_cache_max_tokens=args.prefix_cache_max_tokens,
            ),
            refusal=self.memory.refusal,
            preconditions=self.preconditions,
        )
        self.scheduler.weight_version = self.weight_version  # before its thread starts
        # Tells this process from a restart on the same port: a restarted engine has lost its
        # weight-update group, and the trainer builds a new one when the id changes.
        self.instance_id = uuid.uuid4().hex
        # SGLang's model_update_lock: every /generate holds the read side until it answers, a
        # weight swap takes the write side unless generation is paused. Writer-preferring, so
        # requests that arrive while a swap waits queue behind it.
        self._model_update_lock = aiorwlock.RWLock()
        # Held across "is it paused?" and the swap that follows, so a continue cannot slip in.
        self._pause_lock = asyncio.Lock()
        # SGLang's tokenizer sends one /flush_cache at a time (its communicator queues callers).
        self._flush_lock = asyncio.Lock()
        self._init_weight_routes()

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.add_routes(
            [
                web.post("/generate", self.generate),
                web.put("/generate", self.generate),
                web.get("/health", self.health),
                web.get("/health_generate", self.health_generate),
                web.get("/get_model_info", self.get_model_info),
                web.get("/model_info", self.get_model_info),
                web.get("/get_server_info", self.get_server_info),
                web.get("/server_info", self.get_server_info),
                web.get("/get_weight_version", self.get_weight_version),
                web.get("/v1/loads", self.v1_loads),
                web.get("/get_load", self.get_load),
                web.get("/flush_cache", self.flush_cache),
                web.post("/flush_cache", self.flush_cache),
                web.post("/abort_request", self.abort_request),
                web.post("/pause_generation", self.pause_generation),
                web.post("/continue_generation", self.continue_generation),
                web.post("/debug/pause_in_place_at", self.pause_in_place_at),
                web.post("/update_weight_version", self.update_weight_version),
                *self.weight_routes(),
            ]
        )
        app.on_startup.append(self._on_startup)
        app.on_cleanup.append(self._on_cleanup)
        return app

    async def _on_startup(self, _app: web.Application) -> None:
        self.scheduler.start()

    async def _on_cleanup(self, _app: web.Application) -> None:
        await asyncio.to_thread(self.scheduler.stop)
        self._close_groups()

    async def _control(self, fn: Any) -> Any:
        return await asyncio.wrap_future(self.scheduler.call(fn))

    # ---- generation ---------------------------------------------------------------------

    async def generate(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await _read_json(request)
            items, is_batch, stream = parse_generate(body, self.runner.vocab_size, self.runner.context_len,
                                                     self.tokenizer)
        except BadRequest as exc:
            return _error(str(exc))
        # Early and cheap; the scheduler asks again at admission, which a release cannot race.
        refusal = self.memory.refusal()
        if refusal is not None:
            return _error(refusal, status=503)
        if stream:
            return await self._generate_stream(request, items[0])
        started = time.monotonic()
        try:
            async with self._model_update_lock.reader_lock:
                finished = await asyncio.gather(*(self._run(item) for item in items))
        except asyncio.CancelledError:
            # The client went away: stop spending compute on its requests, as SGLang does.
            rids = [item.rid for item in items]
            self.scheduler.call(lambda: [self.scheduler.abort(rid) for rid in rids])
            raise
        failed = next((req for req in finished if (req.finish_reason or {}).get("status_code") == 500), None)
        if failed is not None:  # an engine failure, not an abort to resume from
            return _error(failed.finish_reason["message"], status=500)
        refused = next((req for req in finished if (req.finish_reason or {}).get("err_type") == REFUSED), None)
        if refused is not None:  # released between the early check and admission
            return _error(refused.finish_reason["message"], status=503)
        outputs = [generate_output(req, self.weight_version, started, self.tokenizer,
                                   segments=self.args.weight_version_segments) for req in finished]
        return _json(outputs if is_batch else outputs[0])

    async def _generate_stream(self, request: web.Request, item: GenerateItem) -> web.StreamResponse:
        """SGLang's streamed /generate (http_server ``generate_request``): ``data: <chunk>\n\n``
        per chunk, cumulative unless --incremental-streaming-output (``protocol.stream_chunk``),
        then the finished answer as the last chunk and ``data: [DONE]\n\n``. A chunk is built when its token arrives, under the version
        current then; chunks the client has not taken yet are coalesced into the latest, as
        SGLang's ``_wait_one_response`` does. A failure after the headers (an engine error, weights
        released since the early check) is the last chunk's finish_reason, with its status_code."""
        started = time.monotonic()
        tokens = StreamedTokens()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        future: asyncio.Future | None = None
        try:
            await response.prepare(request)
            async with self._model_update_lock.reader_lock:
                loop = asyncio.get_running_loop()

                def on_token(req: Request, token: int, logprob: float) -> None:  # scheduler thread
                    top = req.output_top_logprobs[-1] if req.output_top_logprobs else []
                    loop.call_soon_threadsafe(lambda: tokens.add(req, token, logprob, top, self.weight_version))

                future = self._run(item, on_token)
                future.add_done_callback(lambda _: tokens.finish(self.weight_version))
                sent = 0
                incremental = self.args.incremental_streaming_output
                while not future.done():
                    await tokens.changed.wait()
                    tokens.changed.clear()
                    if future.done() or len(tokens.ids) == sent:
                        continue
                    chunk = stream_chunk(tokens.req, tokens.ids, tokens.logprobs, tokens.top_logprobs, tokens.version,
                                         started, self.tokenizer, start=sent if incremental else 0)
                    sent = len(tokens.ids)
                    await response.write(sse_event(chunk))
                finished = future.result()
            await response.write(sse_event(generate_output(finished, tokens.version, started, self.tokenizer,
                                                           segments=self.args.weight_version_segments,
                                                           start=sent if incremental else 0)))
            await response.write(b"data: [DONE]\n\n")
        except (asyncio.CancelledError, ConnectionResetError) as gone:
            # The client went away: stop spending compute on its request, as SGLang does.
            if future is not None and not future.done():
                self.scheduler.call(lambda: self.scheduler.abort(item.rid))
            if isinstance(gone, asyncio.CancelledError):
                raise
        return response

    def _run(self, item: GenerateItem, on_token: Any = None) -> asyncio.Future:
        loop = asyncio.get_running_loop()
        future: asyncio.Future = loop.create_future()

        def on_finish(req: Request) -> None:  # scheduler thread
            loop.call_soon_threadsafe(lambda: future.done() or future.set_result(req))

        self.scheduler.submit(Request(item.rid, item.input_ids, item.params, item.return_logprob, on_finish,
                                      top_logprobs_num=item.top_logprobs_num, on_token=on_token,
                                      logprob_start_len=item.logprob_start_len,
                                      return_routed_experts=item.return_routed_experts))
        return future

    # ---- health and discovery -----------------------------------------------------------

    async def health(self, _request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def health_generate(self, _request: web.Request) -> web.Response:
        if self.memory.refusal() is not None:
            return web.Response(status=503, text=self.memory.refusal())
        loads = await self._control(self.scheduler.loads)
        if loads["num_running_reqs"] or loads["paused"]:
            return web.Response(status=200)  # busy means alive; do not queue behind the batch
        item = GenerateItem(
            f"HEALTH_CHECK_{uuid.uuid4().hex}", [0], SamplingParams(temperature=0.0, max_new_tokens=1), False
        )
        try:
            # SGLang's health check is a /generate: it holds the read side too, so a weight swap
            # never finds it in the scheduler (where a flush after the update would fail).
            async with asyncio.timeout(HEALTH_CHECK_TIMEOUT_S), self._model_update_lock.reader_lock:
                req = await self._run(item)
        except TimeoutError:
            return web.Response(status=503)
        return web.Response(status=200 if len(req.output_ids) == 1 else 503)

    async def get_model_info(self, _request: web.Request) -> web.Response:
        return _json(
            {
                "model_path": self.model_path,
                "tokenizer_path": self.runner.model_path if self.tokenizer is not None else None,
                "is_generation": True,
                "preferred_sampling_params": None,
                "weight_version": self.weight_version,
                "has_image_understanding": False,
                "has_audio_understanding": False,
                "model_type": getattr(self.runner.config, "model_type", None),
                "architectures": getattr(self.runner.config, "architectures", None),
            }
        )

    async def get_server_info(self, _request: web.Request) -> web.Response:
        def internal_state() -> dict[str, Any]:
            loads = self.scheduler.loads()
            return {**vars(self.scheduler.stats), "last_gen_throughput": loads["gen_throughput"],
                    "num_held_reqs": loads["num_held_reqs"], "pause_mode": loads["pause_mode"],
                    "flush_pending": loads["flush_pending"], "prefix_cache_tokens": loads["prefix_cache_tokens"]}

        stats = await self._control(internal_state)
        return _json(
            {
                "model_path": self.model_path,
                "tokenizer_path": self.runner.model_path,
                "host": self.args.host,
                "port": self.args.port,
                "tp_size": 1,
                "dp_size": 1,
                "pp_size": 1,
                "dtype": self.args.dtype,
                "random_seed": self.args.seed,
                "max_running_requests": self.args.max_running_requests,
                "max_total_num_tokens": self.args.max_total_tokens,
                "context_length": self.runner.context_len,
                "weight_version": self.weight_version,
                # How its streams relate tokens to chunks (SGLang's server args of the same names):
                # a chunk per token, each built as its token is sampled (no overlapped step).
                "stream_interval": 1,
                "disable_overlap_schedule": True,
                "incremental_streaming_output": self.args.incremental_streaming_output,
                "enable_return_routed_experts": self.args.enable_return_routed_experts,
                "engine": "cpu",
                "memory_occupation": self.memory.describe(),
                "instance_id": self.instance_id,
                "pid": os.getpid(),
                "weights_update_group_inits": self.group_inits,
                # Requests SGLang 0.5.17 would have died on, refused (preconditions.py), by name.
                "strict_sglang_preconditions": self.preconditions.strict,
                "precondition_violations": self.preconditions.counts(),
                "internal_states": [stats],
                "version": VERSION,
            }
        )

    async def get_weight_version(self, _request: web.Request) -> web.Response:
        return _json({"weight_version": self.weight_version})

    async def v1_loads(self, _request: web.Request) -> web.Response:
        load = await self._control(self.scheduler.loads)
        stats = self.scheduler.stats
        entry = {
            "dp_rank": 0,
            "num_running_reqs": load["num_running_reqs"],
            "num_waiting_reqs": load["num_waiting_reqs"],
            "num_used_tokens": load["num_used_tokens"],
            "max_total_num_tokens": load["max_total_num_tokens"],
            "max_running_requests": load["max_running_requests"],
            "token_usage": load["token_usage"],
            "gen_throughput": load["gen_throughput"],
            "cache_hit_rate": round(stats.cache_hit_tokens / stats.prompt_tokens, 4) if stats.prompt_tokens else 0.0,
            "utilization": round(load["num_running_reqs"] / load["max_running_requests"], 4),
        }
        entry["num_total_reqs"] = entry["num_running_reqs"] + entry["num_waiting_reqs"]
        return _json(
            {
                "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "version": VERSION,
                "dp_rank_count": 1,
                "loads": [entry],
                "aggregate": {
                    "total_running_reqs": entry["num_running_reqs"],
                    "total_waiting_reqs": entry["num_waiting_reqs"],
                    "total_reqs": entry["num_total_reqs"],
                    "avg_token_usage": entry["token_usage"],
                    "avg_throughput": entry["gen_throughput"],
                    "avg_utilization": entry["utilization"],
                },
            }
        )

    async def get_load(self, _request: web.Request) -> web.Response:
        load = await self._control(self.scheduler.loads)
        return _json(
            [
                {
                    "dp_rank": 0,
                    "num_reqs": load["num_running_reqs"] + load["num_waiting_reqs"],
                    "num_waiting_reqs": load["num_waiting_reqs"],
                    "num_tokens": load["num_used_tokens"],
                }
            ]
        )

    # ---- control ------------------------------------------------------------------------

    async def flush_cache(self, request: web.Request) -> web.Response:
        """SGLang's /flush_cache: never fatal; 400 "Flush cache failed." unless the scheduler is
        fully idle. ``?timeout=T`` defers the flush until it is idle (at most T seconds), which
        callers use as an idle barrier before a release or a flushing update."""
        try:
            wait_s = float(request.query.get("timeout", 0.0))
        except ValueError:
            return _error(f"flush_cache: timeout must be a number of seconds, got {request.query['timeout']!r}")
        if not wait_s >= 0:
            return _error(f"flush_cache: timeout must be >= 0, got {request.query['timeout']!r}")
        async with self._flush_lock:
            answer = await self._control(lambda: self.scheduler.request_flush(wait_s))
            # A caller that hangs up leaves its deferred flush pending in the scheduler, as in
            # SGLang: the next one is told "Another flush_cache is already in progress."
            success, message = await asyncio.shield(asyncio.wrap_future(answer))
        if success:
            return web.Response(text=FLUSHED, status=200)
        return web.Response(text=message or FLUSH_FAILED, status=400)

    async def abort_request(self, request: web.Request) -> web.Response:
        try:
            body = await _read_json(request, allow_empty=True) or {}
        except BadRequest as exc:
            return _error(str(exc))
        rid, abort_all = body.get("rid") or None, bool(body.get("abort_all", False))
        if rid is None and not abort_all:
            return _error("abort_request needs rid or abort_all=true")
        rids = rid if isinstance(rid, list) else [rid]
        await self._control(lambda: [self.scheduler.abort(r, abort_all) for r in rids])
        return web.Response(status=200)

    async def pause_generation(self, request: web.Request) -> web.Response:
        try:
            body = await _read_json(request, allow_empty=True) or {}
        except BadRequest as exc:
            return _error(str(exc))
        mode = body.get("mode", "abort")
        if mode not in PAUSE_MODES:
            return _error(f"Invalid mode: {mode!r}. Expected one of {list(PAUSE_MODES)}.")
        async with self._pause_lock:
            await self._control(lambda: self.scheduler.pause(mode))
        return _json({"message": "Generation paused successfully.", "status": "ok"})

    async def pause_in_place_at(self, request: web.Request) -> web.StreamResponse:
        """Not SGLang's (a test aid, Scheduler.arm_pause_at): ``{"output_tokens": N}`` pauses in
        place once a running request has N output tokens. The answer's headers come once the pause
        is armed (send the generation after them), its body ``{"rid", "output_tokens"}`` once it
        has paused; a client that hangs up disarms it. Continue with /continue_generation."""
        try:
            output_tokens = _require(await _read_json(request), "output_tokens", int)
        except BadRequest as exc:
            return _error(str(exc))
        if output_tokens < 1:
            return _error(f"field 'output_tokens' must be at least 1, got {output_tokens}")
        async with self._pause_lock:
            paused = await self._control(lambda: self.scheduler.arm_pause_at(output_tokens))
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        try:
            await response.prepare(request)
            result = await asyncio.wrap_future(paused)
        except (asyncio.CancelledError, ConnectionError):
            self.scheduler.call(lambda: self.scheduler.disarm_pause_at(paused))
            raise
        await response.write(orjson.dumps(result))
        await response.write_eof()
        return response

    async def continue_generation(self, _request: web.Request) -> web.Response:
        async with self._pause_lock:
            await self._control(self.scheduler.resume)
        return _json({"message": "Generation continued successfully.", "status": "ok"})

    async def update_weight_version(self, request: web.Request) -> web.Response:
        try:
            body = await _read_json(request)
            new_version = _require(body, "new_version", str)
        except BadRequest as exc:
            return _json({"success": False, "message": str(exc)}, status=400)
        if body.get("abort_all_requests", True):
            await self._control(lambda: self.scheduler.abort(abort_all=True))
        await self._control(lambda: self.scheduler.set_weight_version(new_version))
        self.weight_version = new_version
        return _json(
            {"success": True, "message": f"Weight version updated to {new_version}", "new_version": new_version}
        )


def _load_tokenizer(model_path: str) -> Any | None:
    if not (Path(model_path) / "tokenizer_config.json").is_file():
        return None
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(model_path)
    except (OSError, ValueError) as exc:
        logger.warning("no usable tokenizer in %s (%s); text in/out disabled", model_path, exc)
        return None


async def serve(args: EngineArgs) -> int:
    runner = await asyncio.to_thread(ModelRunner, args.model_path, getattr(torch, args.dtype), args.seed,
                                     args.enable_return_routed_experts)
    tokenizer = await asyncio.to_thread(_load_tokenizer, runner.model_path)
    if tokenizer is not None and tokenizer.eos_token_id is not None:
        # SGLang also stops on the tokenizer's EOS, which a config may not list.
        runner.eos_token_ids = runner.eos_token_ids | {tokenizer.eos_token_id}
    server = EngineServer(args, runner, tokenizer)
    # handler_cancellation: a client that hangs up cancels its handler, which aborts its
    # requests (see `generate`) instead of decoding tokens nobody will read.
    app_runner = web.AppRunner(server.app(), handle_signals=False, access_log=None, handler_cancellation=True)
    await app_runner.setup()
    site = web.TCPSite(app_runner, args.host, args.port)
    await site.start()
    port = app_runner.addresses[0][1]
    server.args.port = port
    # The launcher and the test fixture read this line to learn the URL.
    print(f"cpu engine listening on http://{args.host}:{port}", flush=True)
    await serve_until_signalled(app_runner)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run the engine until SIGINT/SIGTERM; 2 when the flags or the model dir are wrong."""
    args = parse_args(argv)
    try:
        args.validate()
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    torch.set_num_threads(args.num_threads)
    try:
        return run_event_loop(lambda: serve(args))  # uvloop when installed, as the supervisor's
    except ModelDirError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    finally:
        # Interpreter teardown garbage-collects every object torch and transformers made: ~10 s on
        # a busy 2-core machine (1.6 s frozen), while the supervisor waits for this process to stop.
        gc.freeze()
