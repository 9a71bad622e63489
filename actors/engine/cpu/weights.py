"""Weight-update and memory-occupation routes of the CPU engine (SGLang 0.5.17's shapes).

  POST /update_weights_from_disk        {model_path, weight_version?, flush_cache?, abort_all_requests?}
  POST /init_weights_update_group       {master_address, master_port, rank_offset, world_size, group_name?, backend?}
  POST /update_weights_from_distributed {names, dtypes, shapes, group_name?, load_format?, flush_cache?, ...}
  POST /destroy_weights_update_group    {group_name?}
  POST /update_weights_from_tensor      {serialized_named_tensors: [str], load_format?, flush_cache?, ...}
  POST /release_memory_occupation       {tags?}   free them (all when no tags)
  POST /resume_memory_occupation        {tags?}   allocate them again
  GET  /get_weights_by_name             {name, truncate_size?}
  and the delta transport's loader (slime_async/weights/delta/receiver.py calls ``_load_delta``).

A mixin of EngineServer (server.py), which owns the scheduler, the memory state and the locks;
staging and checks are the model runner's, the swap runs on the scheduler thread. The requests
SGLang's scheduler dies on (a flush after an update while not idle, a release while not idle, a
resume of memory not released, an unknown or unnamed group, a tensor update its loader raises
on) are refused with SGLang's error or end the process (preconditions.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import aiorwlock
import torch
import torch.distributed as dist
from aiohttp import web

from actors.engine.cpu.http_json import json_response as _json
from actors.engine.cpu.http_json import error_response as _error
from actors.engine.cpu.http_json import read_json as _read_json
from actors.engine.cpu.http_json import require as _require
from actors.engine.cpu.memory import TAGS as MEMORY_TAGS
from actors.engine.cpu.memory import MemoryOccupation, MemoryStateError
from actors.engine.cpu.model_runner import ModelRunner, WeightUpdateError
from actors.engine.cpu.preconditions import PreconditionViolation, Preconditions
from actors.engine.cpu.protocol import BadRequest
from actors.engine.cpu.scheduler import Scheduler
from slime_async.weights import flat_bucket
from slime_async.dtypes import dtype_from_name
from slime_async.weights.tensor_ipc import TensorPayloadError, deserialize_named_tensors
from slime_async.weights.delta import codec as weight_codec
from slime_async.weights.delta import receiver as weight_delta
from slime_async.weights.process_group import destroy_custom_process_group, init_custom_process_group

if TYPE_CHECKING:
    from actors.engine.cpu.config import EngineArgs

logger = logging.getLogger("cpu_engine")


class WeightRoutes:
    """The weight routes of EngineServer; its attributes below are set by EngineServer.__init__."""

    args: EngineArgs
    runner: ModelRunner
    scheduler: Scheduler
    memory: MemoryOccupation
    preconditions: Preconditions
    model_path: str
    weight_version: str
    _model_update_lock: aiorwlock.RWLock
    _pause_lock: asyncio.Lock
    _control: Callable[[Callable[[], Any]], Awaitable[Any]]  # runs a function on the scheduler thread

    def _init_weight_routes(self) -> None:
        self.groups: dict[str, dist.ProcessGroup] = {}
        self.group_inits = 0  # weight-update groups joined since start (/server_info)
        # Weight updates are serialised: two concurrent swaps would interleave staging.
        self._update_lock = asyncio.Lock()
        # Delta weight sync (slime_async/weights/delta): the exported tensors of the version served,
        # kept apart from the model's (which may be another dtype) as the base of the next delta.
        self.delta = weight_delta.DeltaReceiver()

    def weight_routes(self) -> list[web.RouteDef]:
        return [
            web.post("/update_weights_from_disk", self.update_weights_from_disk),
            web.post("/init_weights_update_group", self.init_weights_update_group),
            web.post("/update_weights_from_distributed", self.update_weights_from_distributed),
            web.post("/destroy_weights_update_group", self.destroy_weights_update_group),
            web.get("/get_weights_by_name", self.get_weights_by_name),
            web.post("/get_weights_by_name", self.get_weights_by_name),
            *weight_delta.routes(self.delta, self._load_delta, self._served),
            web.post("/release_memory_occupation", self.release_memory_occupation),
            web.get("/release_memory_occupation", self.release_memory_occupation),
            web.post("/resume_memory_occupation", self.resume_memory_occupation),
            web.get("/resume_memory_occupation", self.resume_memory_occupation),
            web.post("/update_weights_from_tensor", self.update_weights_from_tensor),
        ]

    def _close_groups(self) -> None:
        for group in self.groups.values():
            destroy_custom_process_group(group)
        self.groups.clear()

    # ---- memory occupation (colocated training) -----------------------------------------

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
            # Not the model-update writer lock: a busy engine refuses the release (SGLang's dies)
            # rather than waiting, and the scheduler refuses later admissions itself.
            async with self._update_lock:  # never between the buckets of a weight update
                if what == "release":
                    message = await self._control(
                        lambda: self.memory.release(tags, self.scheduler.loads(), self.scheduler.flush_cache))
                else:
                    message = await self._control(lambda: self.memory.resume(tags))
        except (MemoryStateError, PreconditionViolation) as error:
            logger.error("memory: %s refused: %s", what, error)
            return _json({"success": False, "message": str(error)}, status=400)
        logger.info("memory: %s", message)
        return _json({"success": True, "message": message})

    # ---- weight updates -----------------------------------------------------------------

    async def update_weights_from_tensor(self, request: web.Request) -> web.Response:
        """One payload per TP rank (slime_async.weights.tensor_ipc; the CPU engine has one rank)."""
        try:
            body = await _memory_body(request)
            payloads = body.get("serialized_named_tensors")
            if not isinstance(payloads, list) or not all(isinstance(p, str) for p in payloads):
                raise WeightUpdateError("serialized_named_tensors must be a list of base64 payloads, one per TP "
                                        f"rank, got {type(payloads).__name__}")
            if not payloads:  # each TP rank indexes the list with its rank
                self.preconditions.violated(
                    "update_weights_from_tensor_payloads", IndexError("list index out of range"),
                    "serialized_named_tensors holds 0 payloads for 1 TP rank")
            if len(payloads) > 1:  # SGLang reads payload 0 and ignores the rest; refused here, a layout bug
                raise WeightUpdateError(f"serialized_named_tensors must hold one base64 payload per TP rank (the "
                                        f"CPU engine has 1), got {len(payloads)}")
            load_format = body.get("load_format")
            if load_format == "flattened_bucket":
                raise WeightUpdateError("load_format 'flattened_bucket': the CPU engine takes (name, tensor) lists "
                                        "(none or 'direct')")
            if load_format not in (None, "direct"):
                self.preconditions.violated("update_weights_from_tensor_load",
                                            NotImplementedError(f"Unknown load_format={load_format}"),
                                            "not a load format SGLang knows")
            async with self._update_lock:
                if "weights" in self.memory.released:
                    raise WeightUpdateError("the weights' memory is released: POST /resume_memory_occupation "
                                            "{tags: ['weights']} first")
                try:
                    named = await asyncio.to_thread(deserialize_named_tensors, payloads[0])
                    # Where the dtypes match, staged holds the sender's shared memory itself (to() does
                    # not copy): safe because the swap copies it into the model before we answer, and
                    # the sender keeps its tensors alive until then.
                    staged = await asyncio.to_thread(self.runner.stage_partial, named, "update_weights_from_tensor")
                except (WeightUpdateError, TensorPayloadError) as error:
                    # SGLang's update_weights_from_tensor catches nothing: a payload its unpickler
                    # refuses or a tensor its loader asserts on ends the server.
                    self.preconditions.violated("update_weights_from_tensor_load", error,
                                                "SGLang's tensor loader raises on this payload")
                await self._swap(staged, body)
        except (WeightUpdateError, MemoryStateError) as error:
            logger.error("weights: update_weights_from_tensor refused: %s", error)
            return _json({"success": False, "message": f"Failed to update weights: {error}"}, status=400)
        except PreconditionViolation as violation:
            return _json({"success": False, "message": str(violation)}, status=400)
        logger.info("weights: loaded %d tensor(s) from IPC handles%s", len(staged),
                    f", version {body['weight_version']}" if body.get("weight_version") is not None else "")
        return _json({"success": True, "message": "Succeeded to update model weights."})

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
            try:
                await self._swap(staged, body)
            except PreconditionViolation as violation:
                return _json({"success": False, "message": str(violation), "num_paused_requests": 0}, status=400)
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
            try:
                await self._swap(staged, {"weight_version": version, "flush_cache": flush_cache})
            except PreconditionViolation as violation:
                raise weight_delta.LoadRejected(str(violation)) from violation
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
        if group_name == "":
            try:
                self.preconditions.violated("weights_update_group_name", AssertionError("Group name cannot be empty"),
                                            "init_weights_update_group with group_name ''")
            except PreconditionViolation as violation:
                return _json({"success": False, "message": str(violation)}, status=400)
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
            try:
                self.preconditions.violated(
                    "weights_update_group_exists",
                    AssertionError(f"Group {group_name} not in {list(self.groups)}. "
                                   "Please call `init_weights_update_group` first."),
                    f"no weights update group named {group_name!r}")
            except PreconditionViolation as violation:
                return _json({"success": False, "message": str(violation)}, status=400)
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
            try:
                await self._swap(dict(zip(names, buffers)), body)
            except PreconditionViolation as violation:
                return _json({"success": False, "message": str(violation)}, status=400)
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
        in-flight requests first instead of waiting for them (running requests paused in place
        end only at continue). ``flush_cache`` (default true) needs an idle scheduler: raises
        PreconditionViolation, or ends the process in strict mode, before anything is applied.
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


async def _memory_body(request: web.Request) -> dict[str, Any]:
    """The JSON object of a memory-occupation or tensor-update request (empty allowed)."""
    try:
        body = await _read_json(request, allow_empty=True) or {}
    except BadRequest as error:
        raise MemoryStateError(str(error)) from error
    if not isinstance(body, dict):
        raise MemoryStateError(f"expected a JSON object, got {type(body).__name__}")
    return body
