"""The supervisor's end of ``torch.distributed.rpc``, usable from asyncio without blocking.

- `RpcBridge.start` joins the RPC group (a blocking rendezvous) on a daemon thread, so the
  event loop keeps running, and a rendezvous that never completes cannot hold up exit.
- `RpcBridge.call` issues ``rpc_async`` and returns an asyncio future, settled from the RPC
  thread through ``loop.call_soon_threadsafe`` (torch futures complete on RPC threads).
- `RpcBridge.fail_pending` fails every outstanding call at once: the owner uses it when it
  learns a peer died, instead of waiting for the transport to notice.

torch's RPC agent is process-wide: one bridge may be started per process at a time.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed.rpc as rpc

log = logging.getLogger(__name__)


class RpcError(RuntimeError):
    """An RPC call failed (the remote raised, the peer is gone, or the call timed out)."""


def backend_options(init_method: str, timeout: float) -> rpc.TensorPipeRpcBackendOptions:
    """TensorPipe options every peer of our groups must use (they must share a transport).

    TCP over libuv only: TensorPipe's default shared-memory transport busy-polls, costing
    about a quarter of a core per process even when idle (measured on 2 cores), which the
    supervisor and every rank would take from training. Our payloads are small pickled
    Python objects, never CUDA tensors, so the plain channel is enough.
    """
    return rpc.TensorPipeRpcBackendOptions(
        init_method=init_method, rpc_timeout=timeout, _transports=["uv"], _channels=["basic"]
    )


def _reset_torch_rpc_bookkeeping() -> None:
    """Let this process join a *new* RPC group after leaving an earlier one (a restart).

    torch keeps per-process counters that must match between the peers of a group: the
    rendezvous key prefix ("rpc_prefix_<number of earlier init_rpc calls>") and the sequence
    numbers of its internal all-gather (keyed by the worker names). Freshly started workers
    count from 0, a supervisor that already ran a group does not, so the two would never
    meet (pytorch/pytorch#46491). Each bridge rendezvous on a fresh store, so starting both
    from 0 again is safe. Private torch state: re-check on a torch upgrade
    (tests/trainer/test_rpc_bridge.py restarts a group in one process).
    """
    with rpc._init_counter_lock:
        rpc._init_counter = 0
    rpc.api._all_gather_sequence_id.clear()
    rpc.api._all_gather_sequence_id_to_states.clear()


class RpcBridge:
    def __init__(
        self,
        init_method: str,
        world_size: int,
        *,
        name: str = "supervisor",
        rank: int = 0,
        start_timeout: float = 300.0,
    ):
        self.init_method = init_method
        self.world_size = world_size
        self.name = name
        self.rank = rank
        self.start_timeout = start_timeout
        self._pending: set[asyncio.Future] = set()
        self._started = False
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def started(self) -> bool:
        return self._started

    async def start(self) -> None:
        """Join the RPC group; returns once every worker has joined."""
        loop = asyncio.get_running_loop()
        self._loop = loop
        done: asyncio.Future[None] = loop.create_future()

        def settle(error: BaseException | None) -> None:
            if done.done():
                return
            if error is None:
                done.set_result(None)
            else:
                done.set_exception(error)

        def join() -> None:
            try:
                _reset_torch_rpc_bookkeeping()
                options = backend_options(self.init_method, self.start_timeout)
                rpc.init_rpc(self.name, rank=self.rank, world_size=self.world_size, rpc_backend_options=options)
            except BaseException as error:  # noqa: BLE001 - handed to the awaiting coroutine
                wrapped = RpcError(f"joining the RPC group at {self.init_method} failed: {error}")
                loop.call_soon_threadsafe(settle, wrapped)
                return
            self._started = True
            if loop.is_closed():
                return
            loop.call_soon_threadsafe(settle, None)

        threading.Thread(target=join, name=f"rpc-init-{self.name}", daemon=True).start()
        await done

    def call(
        self, to: str, fn: Callable[..., Any], *args: Any, timeout: float = 0.0, **kwargs: Any
    ) -> asyncio.Future:
        """``fn(*args, **kwargs)`` on worker ``to``; ``timeout`` seconds (0: none)."""
        if not self._started:
            raise RpcError(f"RPC call to {to!r} before the bridge started")
        loop = asyncio.get_running_loop()
        result: asyncio.Future = loop.create_future()
        self._pending.add(result)
        result.add_done_callback(self._pending.discard)
        torch_future = rpc.rpc_async(to, fn, args=args, kwargs=kwargs, timeout=timeout)

        def settle(fut: torch.futures.Future) -> None:
            if result.done():  # failed by fail_pending or cancelled by the caller
                return
            try:
                value = fut.value()
            except Exception as error:  # noqa: BLE001 - remote errors arrive as RuntimeError
                result.set_exception(RpcError(f"RPC {getattr(fn, '__name__', fn)} on {to}: {error}"))
            else:
                # A failed ``async_execution`` future on the callee arrives as the exception
                # object itself rather than as a raised error.
                if isinstance(value, BaseException):
                    result.set_exception(value)
                else:
                    result.set_result(value)

        def on_rpc_thread(fut: torch.futures.Future) -> None:
            if not loop.is_closed():
                loop.call_soon_threadsafe(settle, fut)

        torch_future.add_done_callback(on_rpc_thread)
        return result

    def fail_pending(self, error: BaseException) -> int:
        """Fail every outstanding call with ``error``; returns how many there were."""
        pending = [f for f in self._pending if not f.done()]
        for future in pending:
            future.set_exception(error)
        return len(pending)

    async def shutdown(self, graceful: bool = False, timeout: float = 10.0) -> None:
        """Leave the RPC group. ``graceful`` waits (up to ``timeout`` s) for every worker to do
        the same, so in-flight replies are delivered. Only for a process's *first* group:
        torch's shutdown barrier keeps per-process state that a later group's fresh workers
        do not share, so there it waits for the full RPC timeout; leave at once instead."""
        if not self._started:
            return
        self._started = False
        try:
            await asyncio.to_thread(rpc.shutdown, graceful, timeout if graceful else 0)
        except RuntimeError as error:
            if not graceful:
                raise
            log.warning("graceful RPC shutdown failed (%s); leaving at once", error)
            await asyncio.to_thread(rpc.shutdown, False)
