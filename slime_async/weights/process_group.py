"""A process group for weight broadcast that lives beside (not inside) the default group.

The trainer's rank 0 runs inside torchrun and already owns a default process group; an
inference engine runs in another process tree and has none. Both sides call
`init_custom_process_group` with the same init_method/world_size/group_name (trainer rank 0,
engines rank_offset + i) and get a group they can `torch.distributed.broadcast` on, with
`src` meaning the rank inside this group. The same approach is what SGLang and verl use
for `init_weights_update_group`; it relies on c10d's private `_new_process_group_helper`,
so this module is the one place to fix when torch changes it.
"""

from __future__ import annotations

import os
from datetime import timedelta

import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

DEFAULT_TIMEOUT = timedelta(minutes=10)

# NCCL's cuMem allocator breaks a weight-update group between two processes on different GPUs
# ("Cuda failure 'invalid argument'", then a hang: seen on H200s); slime sets the same default.
NCCL_ENV_DEFAULTS = {"NCCL_CUMEM_ENABLE": "0"}


def nccl_env_defaults() -> dict[str, str]:
    """Environment for the trainer and engine processes of a weight-update group (user's values win)."""
    return {key: value for key, value in NCCL_ENV_DEFAULTS.items() if key not in os.environ}


def init_custom_process_group(
    backend: str,
    init_method: str,
    world_size: int,
    rank: int,
    group_name: str,
    timeout: timedelta = DEFAULT_TIMEOUT,
    store: dist.Store | None = None,
) -> dist.ProcessGroup:
    """Create a `world_size` group over `init_method` (e.g. "tcp://127.0.0.1:29555").

    Blocks until every rank has joined. Does not create, use or require the default group.
    ``store``: rank 0's own store, already listening at ``init_method`` (`listening_store`), used
    instead of binding the port here; several groups (other names) can meet on one store.
    """
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is outside world_size {world_size} for group {group_name!r}")
    if store is None:
        store = _rendezvous(init_method, rank, world_size, timeout)
    store.set_timeout(timeout)
    # SGLang (and verl/slime, which share its helper) put the group's store under a prefix of
    # the group name before c10d adds its own: without the same prefix the two sides look up
    # different keys for the NCCL unique id / gloo addresses and wait for each other forever.
    store = c10d.PrefixStore(group_name, store)
    # An empty rank list makes c10d skip the "am I in the default group" membership check,
    # which is what lets a process without a default group build this one.
    created = c10d._new_process_group_helper(
        world_size,
        rank,
        [],
        backend,
        store,
        group_name=group_name,
        timeout=timeout,
    )
    group = created[0] if isinstance(created, tuple) else created
    # Collectives translate `src`/`dst` through this map; identity = ranks of this group.
    c10d._world.pg_group_ranks[group] = {i: i for i in range(world_size)}
    return group


def listening_store(host: str, timeout: timedelta = DEFAULT_TIMEOUT) -> dist.TCPStore:
    """A TCP store that rank 0 hosts on a port the OS picks and holds from now on (``.port``).

    Binding first and reporting the port after is what keeps anyone else from taking it in
    between: a port chosen free, released and bound later can be taken by then (EADDRINUSE).
    The other ranks connect to it as clients through a plain ``tcp://host:port`` rendezvous.
    ``host`` is not what the server binds: TCPStore's server listens on every interface, which is
    what lets engines on other nodes reach it at the node's IP (``TrainerActor.weight_master``).
    """
    return dist.TCPStore(host, 0, None, True, timeout=timeout, wait_for_workers=False)


def _rendezvous(init_method: str, rank: int, world_size: int, timeout: timedelta) -> dist.Store:
    # Under torchrun, TORCHELASTIC_USE_AGENT_STORE makes a tcp:// rendezvous connect to
    # torchrun's agent store as a client instead of hosting the store at the given address as
    # rank 0, and the engines would wait forever. This group is not torchrun's.
    saved = os.environ.pop("TORCHELASTIC_USE_AGENT_STORE", None)
    try:
        store, _, _ = next(c10d.rendezvous(init_method, rank, world_size, timeout=timeout))
    finally:
        if saved is not None:
            os.environ["TORCHELASTIC_USE_AGENT_STORE"] = saved
    return store


def destroy_custom_process_group(group: dist.ProcessGroup) -> None:
    """Tear down a group made by `init_custom_process_group`."""
    dist.destroy_process_group(group)
