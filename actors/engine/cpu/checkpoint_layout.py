"""The served model's weights under their checkpoint names, for every weight-update path.

HF checkpoints, SGLang's weight-update endpoints and the trainer's export all name a
mixture-of-experts layer's weights one 2-D tensor per expert and projection
(``mlp.experts.3.gate_proj.weight``), while transformers 5 runs the layer on two fused 3-D
parameters (``mlp.experts.gate_up_proj`` [experts, 2 * intermediate, hidden], gate rows first,
and ``mlp.experts.down_proj`` [experts, hidden, intermediate]; its checkpoint conversion for
Qwen2/3-MoE and GLM-4.5 concatenates gate and up on dim 1). The engine answers to the checkpoint
names, so a checkpoint, a broadcast or a delta from the trainer loads as it does into SGLang:
each name is a slot, a view into the parameter that holds it.

Persistent buffers a checkpoint carries are weights too (GLM-4.5's router
``mlp.gate.e_score_correction_bias``); non-persistent ones (RoPE frequencies) are not.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

_FUSED_GATE_UP = "experts.gate_up_proj"
_FUSED_DOWN = "experts.down_proj"


class UnsupportedLayout(ValueError):
    """A model whose fused expert weights this engine cannot name as a checkpoint does."""


@dataclass(frozen=True)
class Slot:
    """Where one checkpoint tensor lives in the model."""

    owner: str  # name of the parameter or persistent buffer (model.named_parameters / named_buffers)
    index: tuple[int | slice, ...] | None  # its part of ``owner``; None: all of it
    shape: torch.Size


def checkpoint_layout(model: torch.nn.Module) -> dict[str, Slot]:
    """Checkpoint name -> slot, for every parameter (tied ones under each of their names) and
    persistent buffer of ``model``."""
    layout: dict[str, Slot] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        if name.endswith(_FUSED_GATE_UP) or name.endswith(_FUSED_DOWN):
            layout.update(_expert_slots(model, name, param.shape))
        else:
            layout[name] = Slot(name, None, param.shape)
    persistent = set(model.state_dict(keep_vars=True))
    for name, buffer in model.named_buffers():
        if name in persistent and name not in layout:
            layout[name] = Slot(name, None, buffer.shape)
    return layout


def _expert_slots(model: torch.nn.Module, name: str, shape: torch.Size) -> dict[str, Slot]:
    """The per-expert checkpoint names of one fused parameter."""
    experts = model.get_submodule(name.rsplit(".", 1)[0])
    layout = {key: getattr(experts, key, default) for key, default in
              (("is_transposed", False), ("is_concatenated", True), ("has_bias", False), ("has_gate", True))}
    if layout != {"is_transposed": False, "is_concatenated": True, "has_bias": False, "has_gate": True} \
            or len(shape) != 3:
        raise UnsupportedLayout(f"{name}: fused experts of layout {layout}, shape {list(shape)}; the CPU engine "
                                "names only [gate; up] concatenated, untransposed, bias-free experts (Qwen3-MoE, "
                                "GLM-4.5) as checkpoints do")
    prefix = name[: -len("gate_up_proj")] if name.endswith(_FUSED_GATE_UP) else name[: -len("down_proj")]
    slots: dict[str, Slot] = {}
    for expert in range(shape[0]):
        if name.endswith(_FUSED_GATE_UP):
            half = shape[1] // 2
            part = torch.Size((half, shape[2]))
            slots[f"{prefix}{expert}.gate_proj.weight"] = Slot(name, (expert, slice(0, half)), part)
            slots[f"{prefix}{expert}.up_proj.weight"] = Slot(name, (expert, slice(half, 2 * half)), part)
        else:
            slots[f"{prefix}{expert}.down_proj.weight"] = Slot(name, (expert,), torch.Size(shape[1:]))
    return slots
