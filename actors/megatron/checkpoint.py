"""Resumable Megatron distributed checkpoints: model, optimizer, LR schedule, step, RNG.

Uses ``megatron.core.dist_checkpointing`` so a checkpoint saved at one TP/DP layout can be
loaded at another (model and optimizer state are sharded tensors). RNG states differ per
rank, so they are stored as one ``ShardedObject`` per global rank; resuming with a different
world size keeps the model/optimizer but cannot restore them (they are then re-seeded).
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from megatron.core import dist_checkpointing, tensor_parallel
from megatron.core.dist_checkpointing.mapping import ShardedObject

_RNG_KEY = "rng_state"
_WORLD_KEY = "world_size"


def _rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {
        "random": random.getstate(),
        "np": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
        state["tracker"] = tensor_parallel.get_cuda_rng_tracker().get_states()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["random"])
    np.random.set_state(state["np"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])
        tensor_parallel.get_cuda_rng_tracker().set_states(state["tracker"])


def _sharded_rng(state: dict[str, Any] | None) -> ShardedObject:
    rank, world = dist.get_rank(), dist.get_world_size()
    return ShardedObject(_RNG_KEY, state, (world,), (rank,), replica_id=0)


def _sharded_state(
    model: torch.nn.Module, optimizer: Any, rng: dict[str, Any] | None, *, is_loading: bool = False
) -> dict[str, Any]:
    # The bare GPTModel, not the DDP wrapper: DDP's sharded_state_dict keys carry a
    # "module." prefix that its load_state_dict (which delegates to the module) rejects.
    model_sd = model.sharded_state_dict()
    return {
        "model": model_sd,
        # is_loading makes the optimizer create its (Adam moment) state first: a fresh optimizer
        # has none, and a template without it loads the step count but silently not the moments.
        "optimizer": optimizer.sharded_state_dict(model_sd, is_loading=is_loading),
        _RNG_KEY: _sharded_rng(rng),
    }


def save_checkpoint(
    path: str | Path, model: torch.nn.Module, optimizer: Any, scheduler: Any, extra: dict[str, Any]
) -> None:
    """Collective: every rank calls it with the same ``path``. ``model``: the unwrapped GPTModel."""
    path = Path(path)
    if dist.get_rank() == 0:
        path.mkdir(parents=True, exist_ok=True)
    dist.barrier()
    state = _sharded_state(model, optimizer, _rng_state())
    # Plain values are "common" state: written once by rank 0.
    state["scheduler"] = scheduler.state_dict()
    state["extra"] = dict(extra)
    state[_WORLD_KEY] = dist.get_world_size()
    dist_checkpointing.save(state, str(path))
    dist.barrier()


def load_checkpoint(path: str | Path, model: torch.nn.Module, optimizer: Any, scheduler: Any) -> dict[str, Any]:
    """Collective: restore everything :func:`save_checkpoint` wrote; returns its ``extra``."""
    path = Path(path)
    if not dist_checkpointing.check_is_distributed_checkpoint(str(path)):
        raise FileNotFoundError(f"{path} is not a Megatron distributed checkpoint (no metadata found)")
    template = _sharded_state(model, optimizer, None, is_loading=True)
    saved_world = dist_checkpointing.load_common_state_dict(str(path)).get(_WORLD_KEY)
    if saved_world is not None and saved_world != dist.get_world_size():
        # One RNG state per saving rank: there is none to give a rank of another layout
        # (asking for it would fail the load). The ranks keep their seeded RNG instead.
        del template[_RNG_KEY]
    loaded = dist_checkpointing.load(template, str(path))
    model.load_state_dict(loaded["model"])
    optimizer.load_state_dict(loaded["optimizer"])
    # Megatron's scheduler *adds* the saved step count to its own: a rank that has trained
    # already would resume with a later LR.
    scheduler.num_steps = 0
    scheduler.load_state_dict(loaded["scheduler"])
    rng = loaded.get(_RNG_KEY)
    if rng is not None:
        _set_rng_state(rng)
    return dict(loaded.get("extra", {}))


def megatron_checkpoint_dir(path: str | Path) -> Path | None:
    """``path`` itself, or its ``trainer/`` (a run checkpoint's step directory), when it is a
    Megatron distributed checkpoint; None otherwise (e.g. an HF directory)."""
    for candidate in (Path(path), Path(path) / "trainer"):
        if candidate.is_dir() and dist_checkpointing.check_is_distributed_checkpoint(str(candidate)):
            return candidate
    return None


def load_model_weights(path: str | Path, model: torch.nn.Module) -> None:
    """Collective: only the model's weights of a checkpoint :func:`save_checkpoint` wrote (a frozen
    teacher needs neither the optimizer nor the RNG). ``model``: the unwrapped GPTModel."""
    loaded = dist_checkpointing.load({"model": model.sharded_state_dict()}, str(path))
    model.load_state_dict(loaded["model"])
