"""HTTP routes of the embedded CPU engine: SGLang's native API over the scheduler.

`python -m actors.engine.cpu --model-path DIR [--host 127.0.0.1] [--port N]` serves an
HF-format causal LM on CPU with the endpoints, request and response shapes of SGLang's
http_server (the subset slime-async relies on, see DESIGN.md "Engines"). This module only
parses, validates and shapes JSON; batching lives in scheduler.py and the model in
model_runner.py. Bad input is answered with HTTP 400 and `{"error": {"message": ...}}` as
SGLang does.
"""

from __future__ import annotations

import asyncio
import contextlib
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
import torch.distributed as dist
from aiohttp import web

from actors.engine.cpu.memory import TAGS as MEMORY_TAGS
from actors.engine.cpu.memory import MemoryOccupation, MemoryStateError
from actors.engine.cpu.config import EngineArgs, ModelDirError, parse_args
from actors.engine.cpu.model_runner import ModelRunner, WeightUpdateError
from actors.engine.cpu.protocol import (BadRequest, GenerateItem, SamplingParams, generate_output, parse_generate,
                                       stream_chunk)
from actors.engine.cpu.scheduler import PAUSE_MODES, REFUSED, Request, Scheduler, SchedulerConfig
from actors.engine.cpu.streaming import StreamedTokens, sse_event
from slime_async.weights import flat_bucket
from slime_async.dtypes import dtype_from_name
from slime_async.net import serve_until_signalled
from slime_async.runtime import run as run_event_loop
from slime_async.weights.tensor_ipc import TensorPayloadError, deserialize_named_tensors
from slime_async.weights.delta import codec as weight_codec
from slime_async.weights.delta import receiver as weight_delta
from slime_async.weights.process_group import destroy_custom_process_group, init_custom_process_group

logger = logging.getLogger("cpu_engine")

VERSION = "slime-async-cpu-engine/0.1"
HEALTH_CHECK_TIMEOUT_S = 20.0


def _json(obj: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(obj), status=status, content_type="application/json")


def _error(message: str, status: int = 400) -> web.Response:
    return _json({"error": {"message": message}}, status=status)


class EngineServer:
    """Routes of one engine; owns the scheduler and the weight-update groups."""

    def __init__(self, args: EngineArgs, runner: ModelRunner, tokenizer: Any | None) -> None:
        self.args = args
        self.runner = runner
        self.tokenizer = tokenizer
        self.model_path = runner.model_path
        self.weight_version = args.weight_version
        # Colocated training: which memory regions are released (actors/engine/cpu/memory.py);
        # the scheduler asks it before every admission.
        self.memory = MemoryOccupation(runner)
        self.scheduler = Scheduler(
            runner,
            SchedulerConfig(
                max_running_requests=args.max_running_requests,
                max_total_tokens=args.max_total_tokens,
                prefix_cache_max_tokens=args.prefix_cache_max_tokens,
            ),
            refusal=self.memory.refusal,
        )
        self.groups: dict[str, dist.ProcessGroup] = {}
        self.scheduler.weight_version = self.weight_version  # before its thread starts
        self.group_inits = 0  # weight-update groups joined since start (/server_info)
        # Tells this process from a restart on the same port: a restarted engine has lost its
        # weight-update group, and the trainer builds a new one when the id changes.
        self.instance_id = uuid.uuid4().hex
        # Weight updates are serialised: two concurrent swaps would interleave staging.
        self._update_lock = asyncio.Lock()
        # SGLang's model_update_lock: every /generate holds the read side until it answers, a
        # weight swap takes the write side unless generation is paused. Writer-preferring, so
        # requests that arrive while a swap waits queue behind it.
        self._model_update_lock = aiorwlock.RWLock()
        # Held across "is it paused?" and the swap that follows, so a continue cannot slip in.
        self._pause_lock = asyncio.Lock()
        # Delta weight sync (slime_async/weights/delta): the exported tensors of the version served,
        # kept apart from the model's (which may be another dtype) as the base of the next delta.
        self.delta = weight_delta.DeltaReceiver()

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
                web.post("/update_weights_from_disk", self.update_weights_from_disk),
                web.post("/init_weights_update_group", self.init_weights_update_group),
                web.post("/update_weights_from_distributed", self.update_weights_from_distributed),
                web.post("/destroy_weights_update_group", self.destroy_weights_update_group),
                web.post("/update_weight_version", self.update_weight_version),
                web.get("/get_weights_by_name", self.get_weights_by_name),
                web.post("/get_weights_by_name", self.get_weights_by_name),
                *weight_delta.routes(self.delta, self._load_delta, self._served),
                web.post("/release_memory_occupation", self.release_memory_occupation),
                web.get("/release_memory_occupation", self.release_memory_occupation),
                web.post("/resume_memory_occupation", self.resume_memory_occupation),
                web.get("/resume_memory_occupation", self.resume_memory_occupation),
                web.post("/update_weights_from_tensor", self.update_weights_from_tensor),
            ]
        )
        app.on_startup.append(self._on_startup)
        app.on_cleanup.append(self._on_cleanup)
        return app

    async def _on_startup(self, _app: web.Application) -> None:
        self.scheduler.start()

    async def _on_cleanup(self, _app: web.Application) -> None:
        await asyncio.to_thread(self.scheduler.stop)
        for group in self.groups.values():
            destroy_custom_process_group(group)
        self.groups.clear()

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
                    loop.call_soon_threadsafe(lambda: tokens.add(req, token, logprob, self.weight_version))

                future = self._run(item, on_token)
                future.add_done_callback(lambda _: tokens.finish(self.weight_version))
                sent = 0
                incremental = self.args.incremental_streaming_output
                while not future.done():
                    await tokens.changed.wait()
                    tokens.changed.clear()
                    if future.done() or len(tokens.ids) == sent:
                        continue
                    chunk = stream_chunk(tokens.req, tokens.ids, tokens.logprobs, tokens.version, started,
                                         self.tokenizer, start=sent if incremental else 0)
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
                                      on_token=on_token))
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
            async with asyncio.timeout(HEALTH_CHECK_TIMEOUT_S):
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
        stats = await self._control(lambda: {
            **vars(self.scheduler.stats), "last_gen_throughput": self.scheduler.loads()["gen_throughput"]})
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
                "engine": "cpu",
                "memory_occupation": self.memory.describe(),
                "instance_id": self.instance_id,
                "pid": os.getpid(),
                "weights_update_group_inits": self.group_inits,
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
        # Unlike a GPU radix cache, flushing here never touches running sequences (they own
        # their KV), so it is always safe. ``?timeout=T`` is SGLang's deferred flush: the answer
        # waits until no request is running or waiting (up to T seconds), which callers use as
        # an idle barrier (colocated training releases memory after it).
        try:
            wait_s = float(request.query.get("timeout", 0.0))
        except ValueError:
            return _error(f"flush_cache: timeout must be a number of seconds, got {request.query['timeout']!r}")
        deadline = time.monotonic() + wait_s
        while wait_s > 0:
            loads = await self._control(self.scheduler.loads)
            if not (loads["num_running_reqs"] or loads["num_waiting_reqs"]):
                break
            if time.monotonic() >= deadline:
                return _error("Timed out waiting for idle state.")
            await asyncio.sleep(0.01)
        await self._control(self.scheduler.flush_cache)
        return web.Response(text="Cache flushed.\n", status=200)

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

    # ---- memory occupation (colocated training) -----------------------------------------
    # POST /release_memory_occupation {tags?: ["weights", "kv_cache"]}   free them (all when no tags)
    # POST /resume_memory_occupation  {tags?: [...]}                     allocate them again
    # POST /update_weights_from_tensor {serialized_named_tensors: [str], load_format?, flush_cache?,
    #                                   abort_all_requests?, weight_version?}
    # SGLang 0.5.17's shapes (ReleaseMemoryOccupationReqInput, UpdateWeightsFromTensorReqInput):
    # serialized_named_tensors holds one payload per TP rank (slime_async.weights.tensor_ipc; one here).

    async def release_memory_occupation(self, request: web.Request) -> web.Response:
        return await self._change_memory(request, "release")

    async def resume_memory_occupation(self, request: web.Request) -> web.Response:
        return await self._change_memory(request, "resume")

    async def _change_memory(self, request: web.Request, what: str) -> web.Response:
        try:
            body = await _memory_body(request)
            tags = body.get("tags") or list(MEMORY_TAGS)
            if not isinstance(tags, list) or any(tag not in MEMORY_TAGS for tag in tags):
                raise MemoryStateError(f"tags must be a list of {list(MEMORY_TAGS)}, got {body.get('tags')!r}")
            # Not the model-update writer lock: a busy engine refuses the release (as SGLang's
            # does) rather than waiting, and the scheduler refuses later admissions itself.
            async with self._update_lock:  # never between the buckets of a weight update
                if what == "release":
                    message = await self._control(
                        lambda: self.memory.release(tags, self.scheduler.loads(), self.scheduler.flush_cache))
                else:
                    message = await self._control(lambda: self.memory.resume(tags))
        except MemoryStateError as error:
            logger.error("memory: %s refused: %s", what, error)
            return _json({"success": False, "message": str(error)}, status=400)
        logger.info("memory: %s", message)
        return _json({"success": True, "message": message})

    async def update_weights_from_tensor(self, request: web.Request) -> web.Response:
        try:
            body = await _memory_body(request)
            payloads = body.get("serialized_named_tensors")
            if not isinstance(payloads, list) or len(payloads) != 1 or not isinstance(payloads[0], str):
                raise WeightUpdateError("serialized_named_tensors must be a list of one base64 payload per TP "
                                        f"rank (the CPU engine has 1), got {type(payloads).__name__} of "
                                        f"{len(payloads) if isinstance(payloads, list) else '?'}")
            if body.get("load_format") not in (None, "direct"):
                raise WeightUpdateError(f"load_format {body['load_format']!r}: the CPU engine takes (name, tensor) "
                                        "lists (none or 'direct')")
            async with self._update_lock:
                if "weights" in self.memory.released:
                    raise WeightUpdateError("the weights' memory is released: POST /resume_memory_occupation "
                                            "{tags: ['weights']} first")
                named = await asyncio.to_thread(deserialize_named_tensors, payloads[0])
                # Where the dtypes match, staged holds the sender's shared memory itself (to() does
                # not copy): safe because the swap copies it into the model before we answer, and
                # the sender keeps its tensors alive until then.
                staged = await asyncio.to_thread(self.runner.stage_partial, named, "update_weights_from_tensor")
                await self._swap(staged, body)
        except (WeightUpdateError, TensorPayloadError, MemoryStateError) as error:
            logger.error("weights: update_weights_from_tensor refused: %s", error)
            return _json({"success": False, "message": f"Failed to update weights: {error}"}, status=400)
        logger.info("weights: loaded %d tensor(s) from IPC handles%s", len(staged),
                    f", version {body['weight_version']}" if body.get("weight_version") is not None else "")
        return _json({"success": True, "message": "Succeeded to update model weights."})

    # ---- weight updates -----------------------------------------------------------------

    async def update_weights_from_disk(self, request: web.Request) -> web.Response:
        try:
            body = await _read_json(request)
            model_path = _require(body, "model_path", str)
        except BadRequest as exc:
            return _json({"success": False, "message": str(exc), "num_paused_requests": 0}, status=400)
        async with self._update_lock:
            try:
                # Read and check everything first; the swap below cannot fail half-way.
                staged = await asyncio.to_thread(self.runner.stage_from_disk, model_path)
            except WeightUpdateError as exc:
                return _json(
                    {"success": False, "message": f"Failed to update weights: {exc}", "num_paused_requests": 0},
                    status=400,
                )
            await self._swap(staged, body)
            self.model_path = model_path
        message = "Succeeded to update model weights."
        return _json({"success": True, "message": self._versioned(message, body), "num_paused_requests": 0})

    async def _load_delta(self, tensors: dict[str, torch.Tensor], version: str, flush_cache: bool) -> str | None:
        """Swap in weights a delta transfer rebuilt (and checked); SGLang's timing, as from disk.
        Returns the checksum of what it then serves where the model has the sent dtypes."""
        async with self._update_lock:
            try:
                staged = await asyncio.to_thread(self.runner.stage, tensors, "weight delta")
            except WeightUpdateError as exc:
                raise weight_delta.LoadRejected(f"Failed to update weights: {exc}") from exc
            await self._swap(staged, {"weight_version": version, "flush_cache": flush_cache})
        if all(t.dtype == self.runner.dtype for t in tensors.values()):
            return await self._served(sorted(tensors))
        return None

    async def _served(self, names: list[str]) -> str:
        # Between two scheduler steps, so no swap is half-applied in what is read (~0.1 s a GB).
        return await self._control(
            lambda: weight_codec.state_checksum(weight_codec.state_metas(self.runner.served(names)).values()))

    async def get_weights_by_name(self, request: web.Request) -> web.Response:
        """SGLang's test endpoint: a parameter as float32 nested lists, its first ``truncate_size`` rows."""
        try:
            body = await _read_json(request)
            name = _require(body, "name", str)
            truncate_size = int(body.get("truncate_size", 100))
        except (BadRequest, TypeError, ValueError) as exc:
            return _error(str(exc))
        try:
            tensor = await self._control(lambda: self.runner.served([name])[name].to(torch.float32).clone())
        except KeyError:
            return _error(f"no parameter named {name!r}", status=404)
        return _json(tensor.tolist()[:truncate_size])

    async def init_weights_update_group(self, request: web.Request) -> web.Response:
        try:
            body = await _read_json(request)
            address = _require(body, "master_address", str)
            port = _require(body, "master_port", int)
            rank_offset = _require(body, "rank_offset", int)
            world_size = _require(body, "world_size", int)
        except BadRequest as exc:
            return _json({"success": False, "message": str(exc)}, status=400)
        group_name = body.get("group_name", "weight_update_group")
        backend = body.get("backend", "gloo")
        if backend != "gloo":
            return _json(
                {"success": False, "message": f"the CPU engine only supports backend 'gloo', got {backend!r}"},
                status=400,
            )
        if group_name in self.groups:
            return _json({"success": False, "message": f"group {group_name!r} already exists"}, status=400)
        try:
            group = await asyncio.to_thread(
                init_custom_process_group, backend, f"tcp://{address}:{port}", world_size, rank_offset, group_name
            )
        except Exception as exc:  # rendezvous failures come as several error types
            return _json(
                {"success": False, "message": f"Failed to init group {group_name!r} at {address}:{port}: {exc}"},
                status=400,
            )
        self.groups[group_name] = group
        self.group_inits += 1
        return _json({"success": True, "message": "Succeeded to initialize custom process group."})

    async def update_weights_from_distributed(self, request: web.Request) -> web.Response:
        try:
            body = await _read_json(request)
            names = _require(body, "names", list)
            dtypes = _require(body, "dtypes", list)
            shapes = _require(body, "shapes", list)
        except BadRequest as exc:
            return _json({"success": False, "message": str(exc)}, status=400)
        group_name = body.get("group_name", "weight_update_group")
        group = self.groups.get(group_name)
        if group is None:
            return _json(
                {
                    "success": False,
                    "message": f"no weights update group named {group_name!r}; call /init_weights_update_group first",
                },
                status=400,
            )
        load_format = body.get("load_format")
        if load_format not in (None, "flattened_bucket"):
            return _json({"success": False, "message": f"load_format {load_format!r}: the CPU engine receives "
                          "one broadcast per tensor (none) or per bucket ('flattened_bucket')"}, status=400)
        async with self._update_lock:
            try:
                self.runner.check_distributed_spec(names, dtypes, shapes)
                rejection = None
            except WeightUpdateError as exc:
                rejection = exc
            try:
                # Receive even a rejected announcement: rank 0 broadcasts regardless, and an
                # unmatched broadcast would leave the group out of step for the next update.
                if load_format == "flattened_bucket":
                    buffers = await asyncio.to_thread(_receive_flat_bucket, group, dtypes, shapes)
                else:
                    buffers = self.runner.receive_buffers(dtypes, shapes)
                    await asyncio.to_thread(_receive_broadcast, group, buffers)
            except Exception as exc:
                message = str(rejection or exc)
                return _json({"success": False, "message": f"Failed to update weights: {message}"}, status=400)
            if rejection is not None:
                return _json({"success": False, "message": f"Failed to update weights: {rejection}"}, status=400)
            await self._swap(dict(zip(names, buffers)), body)
        message = "Succeeded to update parameter online."
        return _json({"success": True, "message": self._versioned(message, body)})

    async def destroy_weights_update_group(self, request: web.Request) -> web.Response:
        try:
            body = await _read_json(request, allow_empty=True) or {}
        except BadRequest as exc:
            return _json({"success": False, "message": str(exc)}, status=400)
        group_name = body.get("group_name", "weight_update_group")
        group = self.groups.pop(group_name, None)
        if group is None:
            return _json({"success": False, "message": f"no weights update group named {group_name!r}"}, status=400)
        await asyncio.to_thread(destroy_custom_process_group, group)
        return _json({"success": True, "message": "Succeeded to destroy custom process group."})

    async def _swap(self, staged: dict[str, torch.Tensor], body: dict[str, Any]) -> None:
        """Apply staged weights between two scheduler steps, with SGLang's timing.

        Not paused: the swap waits until every in-flight /generate has answered, and requests
        arriving meanwhile wait for the swap, so no response mixes two weight versions.
        Paused: the swap happens at once; requests paused in place then continue on the new
        weights (their earlier tokens keep the old version's KV). ``abort_all_requests`` ends
        in-flight requests first instead of waiting for them.
        """
        if body.get("abort_all_requests", False):
            await self._control(lambda: self.scheduler.abort(abort_all=True))
        flush = bool(body.get("flush_cache", True))
        async with self._swap_window():
            version = None if body.get("weight_version") is None else str(body["weight_version"])
            await self._control(lambda: self.scheduler.swap_weights(staged, flush, version))
            if body.get("weight_version") is not None:
                self.weight_version = str(body["weight_version"])

    @contextlib.asynccontextmanager
    async def _swap_window(self):
        async with self._pause_lock:
            if self.scheduler.paused:  # set by pause() through _control, so current here
                yield
                return
        async with self._model_update_lock.writer_lock:
            yield

    @staticmethod
    def _versioned(message: str, body: dict[str, Any]) -> str:
        if body.get("weight_version") is not None:
            return f"{message} Weight version updated to {body['weight_version']}."
        return message


def _receive_flat_bucket(group: dist.ProcessGroup, dtypes: list[str], shapes: list[list[int]]) -> list[torch.Tensor]:
    """One broadcast of the bucket's bytes (SGLang's FlattenedTensorBucket layout), split into its tensors."""
    parsed = [dtype_from_name(d) for d in dtypes]
    flat = torch.empty(flat_bucket.nbytes(parsed, shapes), dtype=torch.uint8)
    dist.broadcast(flat, src=0, group=group)
    return flat_bucket.unflatten(flat, parsed, shapes)


def _receive_broadcast(group: dist.ProcessGroup, buffers: list[torch.Tensor]) -> None:
    for tensor in buffers:  # in the order of `names`, as the trainer broadcasts them
        dist.broadcast(tensor, src=0, group=group)


async def _read_json(request: web.Request, allow_empty: bool = False) -> Any:
    raw = await request.read()
    if not raw.strip():
        if allow_empty:
            return None
        raise BadRequest("request body is empty; expected JSON")
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"malformed JSON body: {exc}") from exc


async def _memory_body(request: web.Request) -> dict[str, Any]:
    """The JSON object of a memory-occupation or tensor-update request (empty allowed)."""
    try:
        body = await _read_json(request, allow_empty=True) or {}
    except BadRequest as error:
        raise MemoryStateError(str(error)) from error
    if not isinstance(body, dict):
        raise MemoryStateError(f"expected a JSON object, got {type(body).__name__}")
    return body


def _require(body: Any, key: str, kind: type) -> Any:
    if not isinstance(body, dict) or key not in body:
        raise BadRequest(f"missing required field {key!r}")
    value = body[key]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise BadRequest(f"field {key!r} must be {kind.__name__}, got {value!r}")
    return value


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
    runner = await asyncio.to_thread(ModelRunner, args.model_path, getattr(torch, args.dtype), args.seed)
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
