"""The trainer worker program: one Megatron-core rank serving operations over torch RPC.

    torchrun --nproc-per-node N -m actors.trainer.worker \
        --rpc-init-method tcp://127.0.0.1:PORT --rpc-world-size N+1 --config-json PATH

Each rank joins torchrun's process group (gloo / NCCL), builds its model, DDP, optimizer and
schedule (`actors.trainer.ops.TrainerOps`), then joins a *second* rendezvous, the RPC group,
as worker ``trainer<rank>`` (RPC rank rank+1; the supervisor is RPC rank 0).

Calls arrive on RPC threads. They are handed to the main thread through a queue and run
there one at a time, because collectives must be issued in the same order on every rank,
and CUDA's current device is per thread (set once, on the main thread). The RPC thread
returns a future at once (``async_execution``), so no RPC thread is held during a long op.
"""

from __future__ import annotations

import argparse
import ctypes
import logging
import os
import queue
import signal
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed.rpc as rpc

from actors.trainer.protocol import TrainerOpError
from slime_async.rpc import backend_options

log = logging.getLogger("actors.trainer.worker")

SHUTDOWN = "shutdown"


@dataclass
class _Call:
    op: str
    args: tuple
    kwargs: dict
    future: torch.futures.Future


# The RPC entry point must be a module-level function (RPC pickles functions by reference),
# so it can only reach this process's serving loop through module state: the one inbox of
# the one worker this process runs, set by `serve` before the RPC agent starts.
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


def rpc_prefix(role: str) -> str:
    """RPC worker names of a group's ranks: ``trainer<rank>`` (the policy), ``critic<rank>``."""
    return "critic" if role == "critic" else "trainer"


def die_with_parent() -> None:
    """SIGKILL this process when its parent dies (PR_SET_PDEATHSIG): nobody would stop it otherwise.

    The signal fires when the parent *thread* that started us ends: torchrun starts its ranks
    from its main thread, and a rank runs its ops (checkpoint saves included) on its main thread.
    """
    if sys.platform.startswith("linux"):
        parent = os.getppid()
        try:
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except OSError:
            return
        if os.getppid() != parent:  # the parent died before the signal was armed
            os._exit(1)


def _die_with_torchrun() -> None:
    # torchrun is our parent; if it is SIGKILLed nobody would stop this rank otherwise.
    die_with_parent()


# A multiprocessing "spawn" child of a rank imports this module, the rank's main module, as
# __mp_main__. megatron-core's checkpoint writer starts such a child at the first save: a
# Manager (~330 MB, it imports torch) whose resource tracker lives as long as it does. Neither
# would notice the rank being killed; this makes the Manager die with it (and the tracker then
# exits at the end of its pipe).
if __name__ == "__mp_main__":
    die_with_parent()


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="actors.trainer.worker", description=__doc__.splitlines()[0])
    parser.add_argument("--rpc-init-method", required=True, help="tcp://HOST:PORT of the RPC rendezvous")
    parser.add_argument("--rpc-world-size", type=int, required=True, help="trainer ranks + 1 (the supervisor)")
    parser.add_argument("--config-json", required=True, help="TrainerConfig as JSON")
    parser.add_argument("--rpc-timeout", type=float, default=300.0, help="seconds to join the RPC group")
    parser.add_argument("--role", choices=("actor", "critic"), default="actor",
                        help="actor: the policy (TrainerOps); critic: PPO's value model (actors.critic.ops.CriticOps)")
    parser.add_argument("--rpc-rank-offset", type=int, default=1,
                        help="RPC rank of this group's rank 0 (a critic group follows the policy's ranks)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    _die_with_torchrun()
    rank = int(os.environ.get("RANK", "0"))
    logging.basicConfig(level=logging.INFO, format=f"[rank {rank}] %(asctime)s %(levelname)s %(name)s: %(message)s")

    from actors.trainer.config import TrainerConfig
    from actors.trainer.ops import TrainerOps
    from actors.trainer.parallel import destroy_model_parallel

    config = TrainerConfig.from_json(Path(args.config_json).read_text())
    if args.role == "critic":
        from actors.critic.ops import CriticOps

        ops = CriticOps(config)
    else:
        ops = TrainerOps(config)
    log.info("model ready: %s", ops.info())

    inbox: queue.Queue[_Call] = queue.Queue()
    # Run as `-m actors.trainer.worker`, this file is `__main__`; RPC resolves `call` in the
    # importable module `actors.trainer.worker`, a second instance: give *that* the inbox.
    from actors.trainer import worker as served

    served._inbox = inbox
    options = backend_options(args.rpc_init_method, args.rpc_timeout)
    name = f"{rpc_prefix(args.role)}{rank}"
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


if __name__ == "__main__":
    sys.exit(main())
