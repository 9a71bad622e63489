"""The Megatron pass-through's routing and start-up checks, without megatron-core.

The ``megatron`` dict of the trainer config holds megatron-core dataclass fields by name; a
key goes to *every* dataclass that has it (``bf16`` is both a TransformerConfig and an
OptimizerConfig field, and both must agree). LR-schedule keys (Megatron-LM's flag names,
which are not dataclass fields in megatron-core) go to `ScheduleConfig`. The field names come
from `slime_async.config.megatron_table`, so the supervisor checks a config at start without
importing megatron-core; the ranks (`actors.megatron.rank`) route with the same function.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from actors.megatron.model_flags import MODEL_FLAG_NAMES
from slime_async.config.megatron_table import megatron_table


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


# torch dtypes travel by name in the trainer's config JSON (params_dtype); the ranks get dtypes back.
_DTYPE_NAMES = ("torch.float32", "torch.bfloat16", "torch.float16")


def split_megatron_overrides(megatron: dict[str, Any]) -> MegatronSections:
    """Route each pass-through key to the dataclasses that define it; unknown keys raise."""
    fields = megatron_table().fields
    targets = {
        "transformer": fields["TransformerConfig"],
        "optimizer": fields["OptimizerConfig"],
        "ddp": fields["DistributedDataParallelConfig"],
        "schedule": {f.name for f in dataclasses.fields(ScheduleConfig)},
        "model": set(MODEL_FLAG_NAMES),
    }
    sections: dict[str, dict[str, Any]] = {name: {} for name in targets}
    unknown = []
    for key, value in megatron.items():
        if isinstance(value, str) and value in _DTYPE_NAMES:
            import torch  # only for a dtype value: the supervisor's checks otherwise need no torch

            value = getattr(torch, value.removeprefix("torch."))
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
