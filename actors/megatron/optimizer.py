"""Megatron pass-through config routing, DDP wrapping, optimizer and LR schedule for one rank.

The ``megatron`` dict of the trainer config holds megatron-core dataclass fields by name; a
key goes to *every* dataclass that has it (``bf16`` is both a TransformerConfig and an
OptimizerConfig field, and both must agree). LR-schedule keys (Megatron-LM's flag names,
which are not dataclass fields in megatron-core) go to `ScheduleConfig`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch
from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig, finalize_model_grads
from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler
from megatron.core.transformer.transformer_config import TransformerConfig

from actors.megatron import cpu_compat
from actors.megatron.model_flags import MODEL_FLAG_NAMES


@dataclass
class ScheduleConfig:
    """LR / weight-decay schedule (Megatron-LM flag names; iterations = optimizer steps)."""

    lr_warmup_iters: int = 0
    lr_warmup_init: float = 0.0
    lr_decay_iters: int | None = None  # None: no decay (constant after warmup)
    lr_decay_style: str = "constant"  # constant | linear | cosine | inverse-square-root | WSD
    lr_wsd_decay_style: str = "exponential"
    lr_wsd_decay_iters: int | None = None
    start_weight_decay: float | None = None  # None: OptimizerConfig.weight_decay
    end_weight_decay: float | None = None
    weight_decay_incr_style: str = "constant"


@dataclass
class MegatronSections:
    transformer: dict[str, Any]
    optimizer: dict[str, Any]
    ddp: dict[str, Any]
    schedule: dict[str, Any]
    model: dict[str, Any]  # Megatron-LM model flags: checked against the HF config at start, then unused


_DTYPE_NAMES = {"torch.float32": torch.float32, "torch.bfloat16": torch.bfloat16, "torch.float16": torch.float16}


def split_megatron_overrides(megatron: dict[str, Any]) -> MegatronSections:
    """Route each pass-through key to the dataclasses that define it; unknown keys raise."""
    targets = {
        "transformer": {f.name for f in dataclasses.fields(TransformerConfig)},
        "optimizer": {f.name for f in dataclasses.fields(OptimizerConfig)},
        "ddp": {f.name for f in dataclasses.fields(DistributedDataParallelConfig)},
        "schedule": {f.name for f in dataclasses.fields(ScheduleConfig)},
        "model": set(MODEL_FLAG_NAMES),
    }
    sections: dict[str, dict[str, Any]] = {name: {} for name in targets}
    unknown = []
    for key, value in megatron.items():
        if isinstance(value, str) and value in _DTYPE_NAMES:
            value = _DTYPE_NAMES[value]
        homes = [name for name, names in targets.items() if key in names]
        if not homes:
            unknown.append(key)
        for name in homes:
            sections[name][key] = value
    if unknown:
        raise ValueError(
            f"unknown Megatron option(s) {sorted(unknown)}: not a field of TransformerConfig, "
            "OptimizerConfig, DistributedDataParallelConfig, the LR schedule or Megatron-LM's model flags"
        )
    return MegatronSections(**sections)


def check_megatron_options(megatron: dict[str, Any]) -> None:
    """Reject, at start, pass-through options megatron-core takes but this trainer would run wrongly."""
    sections = split_megatron_overrides(megatron)  # unknown keys raise here
    _check_optimizer_values(megatron)
    schedule = ScheduleConfig(**sections.schedule)
    if schedule.lr_decay_style != "constant" and schedule.lr_decay_iters is None:
        raise ValueError(
            f"--lr-decay-style {schedule.lr_decay_style} needs --lr-decay-iters (the optimizer steps to decay "
            "over): without it the LR would fall to --min-lr right after warmup")
    if sections.transformer.get("sequence_parallel") and sections.transformer.get("tensor_model_parallel_size", 1) < 2:
        # megatron-core raises this inside every rank's TransformerConfig.
        raise ValueError("--sequence-parallel needs --tensor-model-parallel-size > 1 (it splits each sequence over "
                         "the TP ranks)")
    distributed = sections.optimizer.get("use_distributed_optimizer") or sections.ddp.get("use_distributed_optimizer")
    if distributed and sections.ddp.get("overlap_param_gather"):
        raise ValueError("--overlap-param-gather with --use-distributed-optimizer defers the parameter all-gather "
                         "to the next forward, so a weight sync or export right after a step would read stale "
                         "shards; drop --overlap-param-gather")


# Values megatron-core accepts but no optimizer can train with (a negative LR ascends the loss).
_NON_NEGATIVE = ("lr", "min_lr", "weight_decay", "clip_grad", "lr_warmup_init")
_UNIT_INTERVAL = ("adam_beta1", "adam_beta2")  # in [0, 1)


def _check_optimizer_values(megatron: dict[str, Any]) -> None:
    for name in _NON_NEGATIVE:
        value = megatron.get(name)
        if isinstance(value, (int, float)) and value < 0:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 0, got {value:g}")
    for name in _UNIT_INTERVAL:
        value = megatron.get(name)
        if isinstance(value, (int, float)) and not 0 <= value < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be in [0, 1), got {value:g}")
    eps = megatron.get("adam_eps")
    if isinstance(eps, (int, float)) and eps <= 0:
        raise ValueError(f"--adam-eps must be > 0, got {eps:g}")


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
