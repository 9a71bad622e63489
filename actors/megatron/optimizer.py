"""DDP wrapping, optimizer and LR schedule for one rank (the pass-through's routing to them is
`actors.megatron.options`, which the supervisor's config checks share without megatron-core)."""

from __future__ import annotations

from typing import Any

import torch
from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig, finalize_model_grads
from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler
from megatron.core.transformer.transformer_config import TransformerConfig

from actors.megatron import cpu_compat
from actors.megatron.options import ScheduleConfig


def has_grad_scaler(optimizer: Any) -> bool:
    """Whether the optimizer unscales gradients (fp16): then the loss must be scaled before backward."""
    parts = getattr(optimizer, "chained_optimizers", None) or [optimizer]
    return any(getattr(part, "grad_scaler", None) is not None for part in parts)


def optimizer_config(overrides: dict[str, Any], model_config: TransformerConfig) -> OptimizerConfig:
    """Adam by default; precision follows the model unless given explicitly."""
    fields: dict[str, Any] = dict(
        optimizer="adam",
        lr=1e-6,
        bf16=model_config.bf16,
        fp16=model_config.fp16,
        params_dtype=model_config.params_dtype,
        # Megatron's fp32 default; the "local" Adam from torch has no fused / master-weight kernel.
        use_distributed_optimizer=False,
    )
    fields.update(overrides)
    if fields.get("min_lr") is None:
        fields["min_lr"] = 0.0
    return OptimizerConfig(**fields)


def wrap_ddp(model: torch.nn.Module, model_config: TransformerConfig, overrides: dict[str, Any]) -> DistributedDataParallel:
    """Megatron DDP (contiguous grad buffer, fp32 grads) and hook it into the schedule."""
    ddp_config = DistributedDataParallelConfig(**{"grad_reduce_in_fp32": True, **overrides})
    ddp = DistributedDataParallel(config=model_config, ddp_config=ddp_config, module=model)
    # The no-pipelining schedule accumulates micro-batch grads under no_sync and reduces them
    # once through finalize_model_grads (DP all-reduce, tied-embedding sync).
    model_config.no_sync_func = ddp.no_sync
    model_config.finalize_model_grads_func = finalize_model_grads
    return ddp


def build_optimizer(
    ddp: DistributedDataParallel, config: OptimizerConfig, schedule: ScheduleConfig
) -> tuple[Any, OptimizerParamScheduler]:
    # Grad norm / clipping allocate on cuda without Apex/TE; cpu_compat covers them (a no-op
    # when build_gpt_model already applied it, or with CUDA).
    cpu_compat.apply_cpu_compat()
    optimizer = get_megatron_optimizer(config, [ddp])
    wd = config.weight_decay
    decay_iters = schedule.lr_decay_iters
    if decay_iters is None:
        # Constant style ignores the decay length, but the scheduler requires it > warmup.
        decay_iters = schedule.lr_warmup_iters + 1
    scheduler = OptimizerParamScheduler(
        optimizer,
        init_lr=schedule.lr_warmup_init,
        max_lr=config.lr,
        min_lr=config.min_lr,
        lr_warmup_steps=schedule.lr_warmup_iters,
        lr_decay_steps=decay_iters,
        lr_decay_style=schedule.lr_decay_style,
        start_wd=wd if schedule.start_weight_decay is None else schedule.start_weight_decay,
        end_wd=wd if schedule.end_weight_decay is None else schedule.end_weight_decay,
        wd_incr_steps=max(decay_iters, 1),
        wd_incr_style=schedule.weight_decay_incr_style,
        use_checkpoint_opt_param_scheduler=True,
        override_opt_param_scheduler=False,
        wsd_decay_steps=schedule.lr_wsd_decay_iters,
        lr_wsd_decay_style=schedule.lr_wsd_decay_style,
    )
    return optimizer, scheduler
