"""Where one trainer rank's state lives, and its weights as IPC handles (the tensor transport's
trainer half: actors/weight_sync/tensor.py).

Colocated (--colocate), the engines and the trainer time-share the devices. While the engines generate, the trainer's
state sits in host memory (``offload``); before it trains it comes back (``onload``). Parts:
``optimizer`` (Adam's moments and the fp32 main params, ``move_optimizer_state``, into pinned
host buffers kept across steps), ``grads`` and ``params`` (the DDP buffers' ``offload_to_cpu``:
storage freed, params copied to pinned host memory). The model params go last, after the
engines hold the new weights: they are what the IPC handles point at.

On CPU the device is the host: nothing moves, but the phases still run (and are timed), so
the orchestration is the same code on both.

The export: ``next_tensor_bucket`` gathers the next bucket of full HF-named tensors (TP
all-gathers: collective, every rank is called) and, on the ranks that serve an engine TP
worker, returns them as IPC handles (slime_async.weights.tensor_ipc) while holding the tensors alive
until the next call, after the engines have copied them.
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Iterable, Iterator, Sequence

import torch

from actors.megatron.bridge import iter_hf_weight_buckets, unwrap_model
from slime_async.memory_stats import peak_rss_bytes
from slime_async.weights.tensor_ipc import serialize_named_tensors

log = logging.getLogger(__name__)

PARTS = ("optimizer", "grads", "params")


class DeviceResidency:
    """Mixin of the policy's rank (TrainerOps): uses its ``ddp``, ``optimizer``, ``weights``
    (bucket size and engine dtype), ``ref_state``, ``teacher_state`` and ``_refuse_non_finite_weights``."""

    _offloaded: frozenset[str] = frozenset()
    _export: Iterator[list[tuple[str, torch.Tensor]]] | None = None
    _held: list[tuple[str, torch.Tensor]] | None = None
    _host_copies: HostCopies | None = None  # the optimizer state's host side, kept across steps

    def offload(self, parts: Sequence[str]) -> float:
        """Move ``parts`` of this rank's state to host memory; returns the seconds it took."""
        started = time.perf_counter()
        parts = _check(parts)
        if torch.cuda.is_available():
            self._move(parts, to_host=True)
        self._offloaded = self._offloaded | parts
        log.info("colocate: offloaded %s", ", ".join(sorted(parts)))
        return time.perf_counter() - started

    def onload(self) -> float:
        """Bring every offloaded part back to the device; returns the seconds it took."""
        started = time.perf_counter()
        if torch.cuda.is_available() and self._offloaded:
            self._move(self._offloaded, to_host=False)
        log.info("colocate: onloaded %s", ", ".join(sorted(self._offloaded)) or "nothing")
        self._offloaded = frozenset()
        return time.perf_counter() - started

    def next_tensor_bucket(self, serve: bool) -> str | None:
        """The next bucket of the weight export as one IPC payload (None on ranks that do not
        ``serve`` an engine worker, and on every rank once the buckets are done)."""
        if self._export is None:
            if "params" in self._offloaded:
                raise RuntimeError("next_tensor_bucket: the params are offloaded; export before offloading them")
            self._refuse_non_finite_weights("send weights to the engines")
            self._export = iter(iter_hf_weight_buckets(unwrap_model(self.ddp), self.weights.bucket_bytes,
                                                       dtype=self.weights.dtype))
        self._held = None  # the engines have copied the previous bucket: its tensors may go
        bucket = next(self._export, None)
        if bucket is None:
            self._export = None
            return None
        if not serve:
            return ""
        self._held = [(name, tensor.contiguous()) for name, tensor in bucket]
        return serialize_named_tensors(self._held)

    def end_tensor_export(self) -> None:
        """Drop the export (after the last bucket, or when the sync gave up half-way)."""
        self._export = None
        self._held = None

    def device_pids(self) -> list[int] | None:
        """The processes on this rank's GPU, by NVML, for the tensor transport's check that an
        engine shares it; None on CPU, or where NVML does not see this very process (a container's
        own pid namespace): then nothing can be told."""
        if not torch.cuda.is_available():
            return None
        try:  # "GPU:0\nprocess   1234 uses  512.000 MB GPU memory" (torch asks NVML)
            listing = torch.cuda.list_gpu_processes(torch.cuda.current_device())
        except Exception:  # noqa: BLE001 - no NVML: the check cannot be made
            return None
        pids = [int(pid) for pid in re.findall(r"process\s+(\d+)\s+uses", listing)]
        return pids if os.getpid() in pids else None

    def memory_peak(self) -> int:
        """Peak device bytes (CUDA: allocated; CPU: resident) since the last call."""
        if torch.cuda.is_available():
            peak = torch.cuda.max_memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            return int(peak)
        return peak_rss_bytes(reset=True)

    def _move(self, parts: frozenset[str], to_host: bool) -> None:
        buffers = [*self.ddp.buffers, *getattr(self.ddp, "expert_parallel_buffers", [])]
        device = torch.device("cpu") if to_host else torch.device("cuda", torch.cuda.current_device())
        torch.cuda.synchronize()
        if "optimizer" in parts:
            if self._host_copies is None:
                self._host_copies = HostCopies(pin=True)
            move_optimizer_state(self.optimizer, unwrap_model(self.ddp).parameters(), device, self._host_copies)
        move = {"move_params": "params" in parts, "move_grads": "grads" in parts}
        for buffer in buffers:
            (buffer.offload_to_cpu if to_host else buffer.reload_from_cpu)(**move)
        if "params" in parts:  # the frozen copies (reference, OPD teacher) go with the weights
            if self.ref_state is not None:
                self.ref_state = {name: t.to(device, non_blocking=True) for name, t in self.ref_state.items()}
            if self.teacher_state is not None:
                self.teacher_state = {name: t.to(device, non_blocking=True) for name, t in self.teacher_state.items()}
        torch.cuda.synchronize()
        if to_host:
            torch.cuda.empty_cache()


class HostCopies:
    """Reusable host buffers, one per slot, pinned where CUDA runs: the optimizer state leaves the
    device every step, and a device-to-host copy into pageable memory runs at a fraction of the
    link's speed (the first H200 run: 5.2 s for the 0.5B shape's 6 GB through megatron-core's
    ``offload_to_cpu``). Costs host memory the size of the optimizer state, for the whole run."""

    def __init__(self, pin: bool):
        self.pin = pin
        self._buffers: dict[tuple[int, str], torch.Tensor] = {}

    def copy(self, slot: tuple[int, str], tensor: torch.Tensor) -> torch.Tensor:
        """``tensor``'s values in the slot's host buffer (asynchronous from a device: synchronize
        before reading it or freeing the source)."""
        buffer = self._buffers.get(slot)
        if buffer is None or buffer.shape != tensor.shape or buffer.dtype != tensor.dtype:
            buffer = self._buffers[slot] = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=self.pin)
        return buffer.copy_(tensor, non_blocking=True)


def move_optimizer_state(optimizer, model_params: Iterable[torch.Tensor], to: torch.device,
                         host: HostCopies | None = None) -> None:
    """Move ``optimizer``'s own tensors (Adam's moments, the fp32 main params) ``to`` a device;
    device tensors bound for the host go through ``host``'s buffers when given.

    megatron-core's ``offload_to_cpu`` moves every param of the optimizer's groups, and a model
    param the optimizer updates in place (one kept in fp32 in a bf16 model) is one of them: moved
    by ``p.data = p.data.cpu()``, it leaves the DDP buffer it was a view of. Model params are the
    buffers' to move (``offload_to_cpu`` of the param buffers), so they are skipped here.
    """
    to_host = isinstance(to, torch.device) and to.type == "cpu" and host is not None
    # Host-to-device copies may run ahead (from pinned buffers; the caller synchronizes); a
    # device-to-host copy into pageable memory must not.
    non_blocking = isinstance(to, torch.device) and to.type == "cuda"

    def move(tensor: torch.Tensor, slot: tuple[int, str]) -> torch.Tensor:
        if to_host and tensor.device.type != "cpu":
            return host.copy(slot, tensor)
        return tensor.to(to, non_blocking=non_blocking)  # the same tensor when already there

    skip = {id(p) for p in model_params}
    for chained in getattr(optimizer, "chained_optimizers", [optimizer]):
        inner = getattr(chained, "optimizer", None)
        if inner is None or getattr(chained, "is_stub_optimizer", False):
            continue
        for group in inner.param_groups:
            for param in group["params"]:
                if id(param) not in skip:
                    param.data = move(param.data, (id(param), ""))
        for param, state in inner.state.items():
            for key, value in state.items():
                # Adam's step count stays a host scalar: on the device it costs a sync per param.
                if key != "step" and isinstance(value, torch.Tensor):
                    state[key] = move(value, (id(param), key))


def _check(parts: Sequence[str]) -> frozenset[str]:
    unknown = sorted(set(parts) - set(PARTS))
    if unknown:
        raise ValueError(f"offload: unknown part(s) {unknown}; parts are {list(PARTS)}")
    return frozenset(parts)
