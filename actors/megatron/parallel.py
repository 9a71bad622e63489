"""torch.distributed and Megatron model-parallel setup for one torchrun rank.

gloo without CUDA, NCCL with it. On CPU the model-parallel RNG tracker cannot hold CUDA
generator states, so it is created as Megatron's no-op ("inference") tracker: dropout
inside tensor-parallel regions then draws from the default CPU generator, which is seeded
per rank here. That is configuration, not a patch; see cpu_compat for the patches.
"""

from __future__ import annotations

import datetime
import os

import torch
import torch.distributed as dist
from megatron.core import parallel_state, tensor_parallel


def init_model_parallel(
    tensor_parallel_size: int = 1,
    pipeline_parallel_size: int = 1,
    seed: int = 1234,
    expert_parallel_size: int = 1,
    expert_tensor_parallel_size: int | None = None,
    timeout_minutes: int = 30,
) -> None:
    """Join the torchrun process group and set up Megatron's TP/PP/DP groups and RNG.

    Reads the usual torchrun env (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT). Safe to
    call when the default process group already exists (it is reused). MoE: the experts are
    spread over ``expert_parallel_size`` ranks of the data-parallel ranks, each split over
    ``expert_tensor_parallel_size`` (default: the TP size) ranks.
    """
    use_cuda = torch.cuda.is_available()
    if use_cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    if not dist.is_initialized():
        dist.init_process_group(
            backend="nccl" if use_cuda else "gloo",
            timeout=datetime.timedelta(minutes=timeout_minutes),
        )
    world = dist.get_world_size()
    if world % (tensor_parallel_size * pipeline_parallel_size) != 0:
        raise ValueError(
            f"world size {world} is not divisible by --tensor-model-parallel-size "
            f"{tensor_parallel_size} x --pipeline-model-parallel-size {pipeline_parallel_size}"
        )
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(
            tensor_model_parallel_size=tensor_parallel_size,
            pipeline_model_parallel_size=pipeline_parallel_size,
            expert_model_parallel_size=expert_parallel_size,
            expert_tensor_parallel_size=expert_tensor_parallel_size,
            distributed_timeout_minutes=timeout_minutes,
        )
    seed_model_parallel_rng(seed)


def seed_model_parallel_rng(seed: int) -> None:
    """Seed torch and Megatron's model-parallel RNG tracker, on GPU or CPU.

    Pipeline stages get distinct seeds (as in Megatron-LM's training setup) so their dropout
    masks differ; tensor-parallel ranks share the default seed.
    """
    stage_seed = seed + 100 * parallel_state.get_pipeline_model_parallel_rank()
    torch.manual_seed(stage_seed)
    # The CPU tracker is the no-op one: CUDA generator states do not exist without CUDA.
    tensor_parallel.model_parallel_cuda_manual_seed(
        stage_seed,
        inference_rng_tracker=not torch.cuda.is_available(),
        force_reset_rng=True,
    )


def destroy_model_parallel() -> None:
    """Tear down Megatron's groups and the default process group (end of a worker)."""
    parallel_state.destroy_model_parallel()
    if dist.is_initialized():
        dist.destroy_process_group()
