"""The body of a worker program: one Megatron-core rank serving operations over torch RPC.

Two programs run it, each with the operations its group serves:

    torchrun --nproc-per-node N -m actors.trainer.worker \
        --rpc-init-method tcp://127.0.0.1:PORT --rpc-world-size N+1 --config-json PATH
    torchrun ... -m actors.critic.worker ... --rpc-rank-offset N+1   (PPO's critic)

Each rank joins torchrun's process group (gloo / NCCL), builds its model, DDP, optimizer and
schedule (the program's ops, e.g. `actors.trainer.ops.TrainerOps`), then joins a *second*
rendezvous, the RPC group, as worker ``trainer<rank>`` or ``critic<rank>`` (RPC rank
rank + offset; the supervisor is RPC rank 0).

Calls arrive on RPC threads. They are handed to the main thread through a queue and run
there one at a time, because collectives must be issued in the same order on every rank,
and CUDA's current device is per thread (set once, on the main thread). The RPC thread
returns a future at once (``async_execution``), so no RPC thread is held during a long op.
"""

from __future__ import annotations

import argparse
import logging
import os
import queue
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed.rpc as rpc
from torch.distributed.elastic.multiprocessing.errors import record

from actors.megatron.parent_death import die_with_parent
from actors.megatron.protocol import TrainerOpError
from slime_async.rpc import backend_options

log = logging.getLogger(__name__)

SHUTDOWN = "shutdown"


@dataclass
class _Call:
    op: str
    args: tuple
    kwargs: dict
    future: torch.futures.Future


# The RPC entry point must be a module-level function (RPC pickles functions by reference),
# so it can only reach this process's serving loop through module state: the one inbox of
# the one worker this process runs, set by `run` before the RPC agent starts. The supervisor
# calls it as `actors.megatron.worker.call` whichever program serves, and this module is never
# a program's `__main__`, so there is one instance of it per process.
_inbox: queue.Queue[_Call] | None = None


@rpc.functions.async_execution
def call(op: str, *args: Any, **kwargs: Any) -> torch.futures.Future:
    """Run ``ops.<op>(*args, **kwargs)`` on this rank's main thread (RPC target)."""
    future: torch.futures.Future = torch.futures.Future()
    if _inbox is None:
        future.set_exception(TrainerOpError(f"trainer worker {os.getpid()} is not serving yet (op {op!r})"))
    else:
        _inbox.put(_Call(op, args, kwargs, future))
    return future


def serve(ops: Any, inbox: queue.Queue[_Call], rank: int) -> None:
    """Run calls from ``inbox`` until a shutdown call; an op's error goes back to its caller."""
    while True:
        item = inbox.get()
        if item.op == SHUTDOWN:
            item.future.set_result(None)
            return
        try:
            handler = getattr(ops, item.op, None)
            if item.op.startswith("_") or not callable(handler):
                raise AttributeError(f"trainer has no operation {item.op!r}")
            result = handler(*item.args, **item.kwargs)
        except Exception:  # noqa: BLE001 - every op error is reported to the supervisor
            text = traceback.format_exc()
            log.error("rank %d: op %s failed:\n%s", rank, item.op, text)
            item.future.set_exception(TrainerOpError(f"trainer rank {rank}: {item.op} failed:\n{text}"))
        else:
            item.future.set_result(result)


ROLES = ("actor", "critic")


def rpc_prefix(role: str) -> str:
    """RPC worker names of a group's ranks: ``trainer<rank>`` (the policy), ``critic<rank>``."""
    return "critic" if role == "critic" else "trainer"


def _die_with_torchrun() -> None:
    # torchrun is our parent; if it is SIGKILLed nobody would stop this rank otherwise.
    die_with_parent()


def parse_args(argv: list[str] | None, prog: str, description: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--rpc-init-method", required=True, help="tcp://HOST:PORT of the RPC rendezvous")
    parser.add_argument("--rpc-world-size", type=int, required=True, help="the ranks of every group + 1 (the supervisor)")
    parser.add_argument("--config-json", required=True, help="TrainerConfig as JSON")
    parser.add_argument("--rpc-timeout", type=float, default=300.0, help="seconds to join the RPC group")
    parser.add_argument("--rpc-rank-offset", type=int, default=1,
                        help="RPC rank of this group's rank 0 (a critic group follows the policy's ranks)")
    return parser.parse_args(argv)


# @record: an exception of the rank goes to torchrun's error file, and torchrun's failure summary
# ends with it whole however long it is (slime_async/exception_text.py reads it from there).
@record
def run(argv: list[str] | None, *, role: str, build_ops: Callable[[Any], Any], prog: str, description: str) -> int:
    """A worker program's main: parse its flags, build ``build_ops(TrainerConfig)`` on this rank,
    join the RPC group as ``<rpc_prefix(role)><rank>`` and serve until shut down."""
    global _inbox
    if role not in ROLES:
        raise ValueError(f"role must be one of {ROLES}, got {role!r}")
    args = parse_args(argv, prog, description)
    _die_with_torchrun()
    rank = int(os.environ.get("RANK", "0"))
    logging.basicConfig(level=logging.INFO, format=f"[rank {rank}] %(asctime)s %(levelname)s %(name)s: %(message)s")

    from actors.megatron.config import TrainerConfig
    from actors.megatron.parallel import destroy_model_parallel

    config = TrainerConfig.from_json(Path(args.config_json).read_text())
    ops = build_ops(config)
    log.info("model ready: %s", ops.info())

    inbox: queue.Queue[_Call] = queue.Queue()
    _inbox = inbox
    options = backend_options(args.rpc_init_method, args.rpc_timeout)
    name = f"{rpc_prefix(role)}{rank}"
    rpc.init_rpc(name, rank=rank + args.rpc_rank_offset, world_size=args.rpc_world_size, rpc_backend_options=options)
    log.info("joined the RPC group as %s", name)
    try:
        serve(ops, inbox, rank)
    finally:
        # Not graceful: that is a barrier with the supervisor, which may be gone or may have
        # left already (it normally stops the ranks with SIGTERM through torchrun).
        rpc.shutdown(graceful=False)
    destroy_model_parallel()
    return 0
