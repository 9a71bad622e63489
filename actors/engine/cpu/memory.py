"""Colocated training on the CPU engine: SGLang's memory occupation and tensor weight updates.

    POST /release_memory_occupation {tags?: ["weights", "kv_cache"]}   free them (all when no tags)
    POST /resume_memory_occupation  {tags?: [...]}                     allocate them again
    POST /update_weights_from_tensor {serialized_named_tensors: [str], load_format?, flush_cache?,
                                      abort_all_requests?, weight_version?}

The shapes are SGLang 0.5.17's (``ReleaseMemoryOccupationReqInput``,
``UpdateWeightsFromTensorReqInput``): ``serialized_named_tensors`` holds one payload per TP rank
(``slime_async.tensor_ipc``: a list of (name, tensor) as IPC handles; the CPU engine is one rank).

Released weights are really freed (the process's memory drops) and come back as zeros: the
engine refuses to generate while any region is released, and after a resume until every
weight has been loaded again, so it never serves half-updated or undefined weights. A bucket
is checked whole before any of it is applied. Release needs an idle engine, as SGLang's does.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from aiohttp import web

from actors.engine.cpu.model_runner import WeightUpdateError
from slime_async.memory_stats import peak_rss_bytes, rss_bytes
from slime_async.tensor_ipc import TensorPayloadError, deserialize_named_tensors

if TYPE_CHECKING:
    from actors.engine.cpu.server import EngineServer

log = logging.getLogger("cpu_engine")

# SGLang's GPU_MEMORY_ALL_TYPES; the CPU engine has no CUDA graphs, so that tag frees nothing.
TAGS = ("weights", "kv_cache", "cuda_graph")


class MemoryStateError(ValueError):
    """A release or resume the engine's state does not allow; nothing changed."""


class MemoryOccupation:
    """Which memory regions of one engine are released. Mutated on the scheduler thread only."""

    def __init__(self, server: EngineServer) -> None:
        self.server = server
        self.released: set[str] = set()

    def release(self, tags: list[str]) -> str:
        scheduler, runner = self.server.scheduler, self.server.runner
        loads = scheduler.loads()
        if loads["num_running_reqs"] or loads["num_waiting_reqs"]:
            raise MemoryStateError(f"release_memory_occupation needs an idle engine: {loads['num_running_reqs']} "
                                   f"running, {loads['num_waiting_reqs']} waiting requests (abort them first)")
        again = sorted(set(tags) & self.released)
        if again:
            raise MemoryStateError(f"memory already released: {', '.join(again)}")
        freed = 0
        if "kv_cache" in tags:
            scheduler.flush_cache()  # finished sequences' KV lives in the prefix cache only
        if "weights" in tags:
            freed = runner.release_weights()
        self.released |= set(tags)
        return f"released {', '.join(tags)} ({freed} bytes of weights freed)"

    def resume(self, tags: list[str]) -> str:
        missing = sorted(set(tags) - self.released)
        if missing:
            raise MemoryStateError(f"memory not released, cannot resume: {', '.join(missing)}")
        if "weights" in tags:
            self.server.runner.resume_weights()
        self.released -= set(tags)
        return f"resumed {', '.join(tags)}"

    def refusal(self) -> str | None:
        """Why the engine cannot generate now, or None."""
        if self.released:
            return (f"the engine's memory is released ({', '.join(sorted(self.released))}): it cannot generate "
                    "until /resume_memory_occupation and a weight update")
        unloaded = self.server.runner.unloaded_weights()
        if unloaded:
            return (f"the engine's weights are incomplete: {len(unloaded)} tensor(s) not loaded since "
                    f"/resume_memory_occupation, e.g. {unloaded[0]!r}")
        return None

    def describe(self, reset_peak: bool = False) -> dict[str, Any]:
        """For /get_server_info: what is released, the weights' bytes, the process's memory."""
        return {"released": sorted(self.released), "weight_bytes": self.server.runner.weight_bytes(),
                "unloaded_weights": len(self.server.runner.unloaded_weights()), "rss_bytes": rss_bytes(),
                "peak_rss_bytes": peak_rss_bytes(reset=reset_peak)}


def routes(server: EngineServer) -> list[web.RouteDef]:
    memory = server.memory

    async def change(request: web.Request, what: str) -> web.Response:
        try:
            body = await _body(request)
            tags = body.get("tags") or list(TAGS)
            if not isinstance(tags, list) or any(tag not in TAGS for tag in tags):
                raise MemoryStateError(f"tags must be a list of {list(TAGS)}, got {body.get('tags')!r}")
            async with server._update_lock:  # never between the buckets of a weight update
                message = await server._control(lambda: getattr(memory, what)(tags))
        except MemoryStateError as error:
            log.error("memory: %s refused: %s", what, error)
            return _answer(False, str(error))
        log.info("memory: %s", message)
        return _answer(True, message)

    async def release(request: web.Request) -> web.Response:
        return await change(request, "release")

    async def resume(request: web.Request) -> web.Response:
        return await change(request, "resume")

    async def update_weights_from_tensor(request: web.Request) -> web.Response:
        try:
            body = await _body(request)
            payloads = body.get("serialized_named_tensors")
            if not isinstance(payloads, list) or len(payloads) != 1 or not isinstance(payloads[0], str):
                raise WeightUpdateError("serialized_named_tensors must be a list of one base64 payload per TP "
                                        f"rank (the CPU engine has 1), got {type(payloads).__name__} of "
                                        f"{len(payloads) if isinstance(payloads, list) else '?'}")
            if body.get("load_format") not in (None, "direct"):
                raise WeightUpdateError(f"load_format {body['load_format']!r}: the CPU engine takes (name, tensor) "
                                        "lists (none or 'direct')")
            async with server._update_lock:
                if memory.released & {"weights"}:
                    raise WeightUpdateError("the weights' memory is released: POST /resume_memory_occupation "
                                            "{tags: ['weights']} first")
                named = await asyncio.to_thread(deserialize_named_tensors, payloads[0])
                staged = await asyncio.to_thread(server.runner.stage_partial, named, "update_weights_from_tensor")
                del named  # the trainer may free its tensors once we answer; staged holds what we need
                await server._swap(staged, body)
        except (WeightUpdateError, TensorPayloadError, MemoryStateError) as error:
            log.error("weights: update_weights_from_tensor refused: %s", error)
            return _answer(False, f"Failed to update weights: {error}")
        log.info("weights: loaded %d tensor(s) from IPC handles%s", len(staged),
                 f", version {body['weight_version']}" if body.get("weight_version") is not None else "")
        return _answer(True, "Succeeded to update model weights.")

    return [
        web.post("/release_memory_occupation", release),
        web.get("/release_memory_occupation", release),
        web.post("/resume_memory_occupation", resume),
        web.get("/resume_memory_occupation", resume),
        web.post("/update_weights_from_tensor", update_weights_from_tensor),
    ]


async def _body(request: web.Request) -> dict[str, Any]:
    from actors.engine.cpu.server import _read_json  # the server's JSON rules (400 on malformed bodies)
    from actors.engine.cpu.protocol import BadRequest

    try:
        body = await _read_json(request, allow_empty=True) or {}
    except BadRequest as error:
        raise MemoryStateError(str(error)) from error
    if not isinstance(body, dict):
        raise MemoryStateError(f"expected a JSON object, got {type(body).__name__}")
    return body


def _answer(success: bool, message: str) -> web.Response:
    import orjson

    return web.Response(body=orjson.dumps({"success": success, "message": message}), status=200 if success else 400,
                        content_type="application/json")
