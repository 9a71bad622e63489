"""The local layer spec's norms (torch ``RMSNorm`` / ``LayerNorm``), usable under sequence parallelism.

megatron-core's ``WrappedTorchNorm`` (the local spec's norm without Apex) refuses
``sequence_parallel``: under SP each tensor-parallel rank normalises only its slice of the
sequence, so the norm weight's gradient on one rank is a partial sum, and megatron-core's
``finalize_model_grads`` all-reduces it over TP only for parameters marked
``sequence_parallel = True`` (what Apex's ``FusedLayerNorm`` and TE's ``TENorm`` do). This norm is
the same torch module ``WrappedTorchNorm`` builds (same class, same parameter names, same numbers),
with its parameters marked. MoE layers need it: megatron-core trains them under TP > 1 only with
SP (``MoELayer.forward``).
"""

from __future__ import annotations

from typing import Any

import torch
from megatron.core.transformer.spec_utils import ModuleSpec
from megatron.core.transformer.torch_norm import WrappedTorchNorm
from megatron.core.transformer.transformer_config import TransformerConfig


class _WithoutSequenceParallel:
    """``config`` as WrappedTorchNorm's checks see it: every field but ``sequence_parallel``, which
    reads False (the marking below is what makes SP correct for this norm)."""

    sequence_parallel = False

    def __init__(self, config: TransformerConfig):
        self._config = config

    def __getattr__(self, name: str) -> Any:
        return getattr(self._config, name)


class TorchNorm:
    """``WrappedTorchNorm`` (upstream's choice of torch norm and its checks) whose parameters carry
    ``sequence_parallel`` from the config: under SP their gradients are summed over TP."""

    def __new__(cls, config: TransformerConfig, hidden_size: int, eps: float = 1e-5, **kwargs: Any
                ) -> torch.nn.Module:
        norm = WrappedTorchNorm(_WithoutSequenceParallel(config), hidden_size, eps, **kwargs)
        for param in norm.parameters():
            param.sequence_parallel = config.sequence_parallel
        return norm


def use_torch_norm(layer_spec: ModuleSpec) -> None:
    """Swap ``WrappedTorchNorm`` for `TorchNorm` in one transformer layer's spec (its input and
    pre-MLP norms, and the q/k norms)."""
    layer = layer_spec.submodules
    for name in ("input_layernorm", "pre_mlp_layernorm"):
        if getattr(layer, name, None) is WrappedTorchNorm:
            setattr(layer, name, TorchNorm)
    attention = layer.self_attention.submodules
    for name in ("q_layernorm", "k_layernorm"):
        if getattr(attention, name, None) is WrappedTorchNorm:
            setattr(attention, name, TorchNorm)
