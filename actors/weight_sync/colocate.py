"""Colocated training (--colocate): the trainer and the engines take turns on the same devices.

One step, after its rollout:

    to_trainer():       router pauses (aborts what runs) → engines release weights + KV cache
                        → trainer onloads (optimizer, grads, params back to the device)
    ... the loop computes logprobs and trains ...
    update_weights():   trainer offloads optimizer + grads → engines resume weights memory
                        → buckets of full HF tensors as IPC handles, each POSTed to
                          /update_weights_from_tensor of every engine (tensor.py) → trainer offloads params
                        → engines resume KV cache      (then the router confirms the version)

The model params leave the device last because the IPC handles point at them. A failure in any
phase raises ColocateError naming the phase and the engine, and ends the run: an engine that has
released its memory, or holds only part of the new weights, refuses to generate with a clear
error (actors/engine/cpu/memory.py), and the router, paused, sends it nothing. An engine that
fails before releasing keeps serving the weights it has (the previous version).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from actors.weight_sync.errors import WeightSyncError
from actors.weight_sync.tensor import TensorTransport
from slime_async.actor import ActorRef
from slime_async.engine_client import EngineClient
from slime_async.task_group import gather_settled

log = logging.getLogger(__name__)

# SGLang's GPU_MEMORY_ALL_TYPES: the weights come back first (for the update), the rest after it.
ALL_MEMORY = ["weights", "kv_cache", "cuda_graph"]
AFTER_UPDATE = ["kv_cache", "cuda_graph"]


class ColocateError(RuntimeError):
    """A phase of colocated training failed; the message names it and the engine."""


@dataclass
class Colocation:
    trainer: ActorRef
    router: ActorRef
    api_key: str | None = None
    timeout: float | None = 300.0
    # Requests the router aborted may still be finishing in an engine: the run waits this long for
    # every engine to go idle before it releases, and retries a refused release this long.
    idle_wait_s: float = 60.0
    release_retry_s: float = 15.0
    _released: bool = field(default=False, init=False)  # the engines' memory is released
    _metrics: dict[str, float] = field(default_factory=dict, init=False)
    tensors: TensorTransport = field(init=False)

    def __post_init__(self) -> None:
        self.tensors = TensorTransport(self.trainer, timeout=self.timeout)

    async def start(self) -> None:
        """Before the first rollout: the trainer's state leaves the devices the engines generate on."""
        await self._phase("offload", self.trainer.ask("offload", ["optimizer", "grads", "params"],
                                                      timeout=self.timeout))

    async def to_trainer(self) -> dict[str, float]:
        """After a rollout: the engines free the devices and the trainer takes them; the step's
        release and onload seconds."""
        await self.router.ask("pause", "abort", timeout=self.timeout)  # nothing of ours runs on them now
        urls = [engine["url"] for engine in await self.router.ask("engines") if engine["health"] != "down"]
        async with aiohttp.ClientSession() as session:
            return await self._release([EngineClient(url, session=session, api_key=self.api_key) for url in urls])

    async def _release(self, clients: Sequence[EngineClient]) -> dict[str, float]:
        release = await self._phase("release_memory", self._release_all(clients))
        self._released = True
        engine_memory = await _engine_memory(clients[0]) if clients else {}
        onload = await self._phase("onload", self.trainer.ask("onload", timeout=self.timeout))
        return {"perf/release_memory_time": release, "perf/onload_time": onload,
                **{f"memory/engine_released_{k}": v for k, v in engine_memory.items()}}

    async def update_weights(self, clients: Sequence[EngineClient], version: int) -> int:
        """After training: the new weights into every engine's resumed memory; returns buckets sent."""
        started = time.monotonic()
        offload = await self._phase("offload", self.trainer.ask("offload", ["optimizer", "grads"],
                                                                timeout=self.timeout))
        if self._released:
            await self._phase("resume_weights", self._on_engines(clients, "resume_memory_occupation", [
                c.resume_memory_occupation(["weights"], timeout=self.timeout) for c in clients]))
        update_started = time.monotonic()
        try:
            results = await self.tensors.send(clients, version, flush_cache=True)
        except WeightSyncError as error:
            raise ColocateError(f"--colocate: {error}") from error
        # The phases around the update need every engine (each holds a share of the devices' memory).
        _raise_failures("update_weights_from_tensor", clients, results)
        buckets = self.tensors.buckets
        update = time.monotonic() - update_started
        log.info("colocate: update_weights_from_tensor v%d: %d bucket(s) to %d engine(s) (%.2f s)",
                 version, buckets, len(clients), update)
        offload += await self._phase("offload", self.trainer.ask("offload", ["params"], timeout=self.timeout))
        if self._released:
            await self._phase("resume_kv_cache", self._on_engines(clients, "resume_memory_occupation", [
                c.resume_memory_occupation(AFTER_UPDATE, timeout=self.timeout) for c in clients]))
            self._released = False
        engine_memory = await _engine_memory(clients[0]) if clients else {}
        self._metrics = {"perf/offload_time": offload, "perf/weight_update_time": update,
                         "perf/colocate_sync_time": time.monotonic() - started,
                         "memory/trainer_peak_gb": await self.trainer.ask("memory_peak", timeout=self.timeout) / 2**30,
                         **{f"memory/engine_serving_{k}": v for k, v in engine_memory.items()}}
        return buckets

    async def onload(self) -> None:
        """Trainer work that needs its whole state on the device between steps (a checkpoint):
        onload before it, ``offload_all`` after. The engines keep their memory meanwhile: the GPU
        holds both for that time."""
        await self._phase("onload", self.trainer.ask("onload", timeout=self.timeout))

    async def offload_all(self) -> None:
        await self._phase("offload", self.trainer.ask("offload", ["optimizer", "grads", "params"],
                                                      timeout=self.timeout))

    async def rejoin(self, client: EngineClient, version: int) -> None:
        """An engine restarted between steps serves other weights: the trainer's params come back to
        the device for the export and leave again. During a step (memory released) the step's own
        update reaches it."""
        if self._released:
            return
        await self.trainer.ask("onload", timeout=self.timeout)
        try:
            _raise_failures("update_weights_from_tensor", [client], await self.tensors.rejoin(client, version))
        finally:
            await self.trainer.ask("offload", ["optimizer", "grads", "params"], timeout=self.timeout)

    async def _release_all(self, clients: Sequence[EngineClient]) -> None:
        # SGLang asserts its scheduler is idle in a release, and a failed assertion there kills the
        # server; requests the router aborted may still be in its last batch. A deferred flush
        # answers only once the scheduler is idle, and the paused router sends nothing after it.
        await self._on_engines(clients, "waiting for idle engines (flush_cache)", [
            c.flush_cache(wait_idle_s=self.idle_wait_s, timeout=self.timeout) for c in clients])
        deadline, pending = time.monotonic() + self.release_retry_s, list(clients)
        while True:
            results = await gather_settled(*(c.release_memory_occupation(ALL_MEMORY, timeout=self.timeout)
                                             for c in pending))
            failed = [(c, r) for c, r in zip(pending, results) if isinstance(r, BaseException)]
            if not failed or time.monotonic() >= deadline:
                break
            pending = [c for c, _ in failed]
            await asyncio.sleep(0.5)
        _raise_failures("release_memory_occupation", [c for c, _ in failed], [r for _, r in failed])

    def metrics(self) -> dict[str, float]:
        """The last update's offload / weight update seconds and memory peaks."""
        return dict(self._metrics)

    @staticmethod
    async def _on_engines(clients: Sequence[EngineClient], what: str, calls: Sequence[Awaitable[Any]]) -> None:
        """Run one call per engine at once; any failure raises, naming every engine that failed."""
        _raise_failures(what, clients, await gather_settled(*calls))

    async def _phase(self, name: str, work: Awaitable[Any]) -> float:
        started = time.monotonic()
        result = await work
        seconds = float(result) if isinstance(result, (int, float)) else time.monotonic() - started
        log.info("colocate: %s (%.3f s)", name, seconds)
        return seconds


def _raise_failures(what: str, clients: Sequence[EngineClient], results: Sequence[object]) -> None:
    """One ColocateError naming every engine whose result is an exception."""
    failures = [f"{c.url}: {r}" for c, r in zip(clients, results) if isinstance(r, BaseException)]
    if failures:
        raise ColocateError(f"--colocate: {what} failed on engine(s) {'; '.join(failures)}")


async def _engine_memory(client: EngineClient) -> dict[str, float]:
    """The first engine's memory in GB, from /server_info: the CPU engine's resident set, SGLang's
    static weight and KV reservations."""
    try:
        info = await client.get_server_info(timeout=30.0)
    except Exception:  # noqa: BLE001 - a metric; the phases check the engines themselves
        return {}
    if "memory_occupation" in info:
        memory = info["memory_occupation"]
        return {"rss_gb": memory["rss_bytes"] / 2**30, "weights_gb": memory["weight_bytes"] / 2**30}
    usage = (info.get("internal_states") or [{}])[0].get("memory_usage") or {}
    return {f"{key}_gb": float(usage[key]) for key in ("weight", "kvcache") if key in usage}
