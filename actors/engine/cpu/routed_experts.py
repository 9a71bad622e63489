"""Routed experts of the CPU engine: which experts each MoE layer's forward used, per position.

SGLang 0.5.17 with ``--enable-return-routed-experts`` records, for every position a forward
runs, the top-k expert ids of every layer (``layers/moe/routed_experts_capturer.py``), keyed by
the position's KV slot; a finished request that asked (``return_routed_experts`` on /generate)
gets those of its first ``seqlen - 1`` positions (prompt + output minus the last token, which no
forward has fed yet) in ``meta_info["routed_experts"]``: base64 of a C-order int32 array shaped
``[seqlen - 1, num_hidden_layers, num_experts_per_tok]``. Every layer has a row, dense ones
(``first_k_dense_replace``, ``mlp_only_layers``) all zeros, as SGLang's buffer never writes them.
Positions served from the prefix cache keep the experts of the forward that computed them, since
SGLang's record lives with the KV slot. Without the server flag nothing is recorded and the field
is left out of the answer (SGLang's no-op capturer returns None; the request is not refused).

Here the record lives with the KV too: `RoutedKV` is a sequence's cache that also carries the
``[positions, layers, top-k]`` rows of the positions it covers, so the prefix cache keeps them,
a slice of it slices them, and a decode step appends a row as it appends a position.
`ExpertCapture` reads the ids with a forward pre-hook on each MoE layer's experts module, whose
second argument is the top-k index tensor the layer's router chose and its experts then ran.
"""

from __future__ import annotations

import base64
from typing import Any

import numpy as np
import torch


class RoutedKV(list):
    """A sequence's KV (a list of (keys, values) per layer) with the routed experts of the same
    positions (``experts``: int32 ``[positions, layers, top-k]``; None when not captured)."""

    experts: np.ndarray | None = None

    @classmethod
    def of(cls, layers: list[tuple[torch.Tensor, torch.Tensor]], experts: np.ndarray | None) -> RoutedKV:
        kv = cls(layers)
        kv.experts = experts
        return kv


def kv_experts(kv: Any) -> np.ndarray | None:
    """The routed experts a cache carries (None for a plain list, or when nothing was captured)."""
    return getattr(kv, "experts", None)


def join(before: np.ndarray | None, positions_before: int, new: np.ndarray | None) -> np.ndarray | None:
    """The rows of ``positions_before`` earlier positions followed by new ones; None unless all
    of them were captured."""
    if new is None:
        return None
    if positions_before == 0:
        return new
    if before is None or len(before) != positions_before:
        return None
    return np.concatenate([before, new])


def encode(experts: np.ndarray) -> str:
    """SGLang's wire form: base64 of the int32 array's bytes (C order, native byte order)."""
    return base64.b64encode(np.ascontiguousarray(experts, dtype=np.int32).tobytes()).decode("ascii")


class ExpertCapture:
    """Forward pre-hooks on every MoE layer's experts module of an HF causal LM.

    ``begin()`` before a forward, ``rows(n)`` after it: ``[n, num_hidden_layers, top_k]`` int32,
    row i the i-th token the forward ran (a prefill's positions in order, a decode step's
    sequences in batch order), dense layers zeros."""

    def __init__(self, model: torch.nn.Module) -> None:
        config = model.config
        self.num_layers = int(config.num_hidden_layers)
        self.top_k = int(getattr(config, "num_experts_per_tok", 0) or 0)
        self.moe_layers: list[int] = []
        self._captured: dict[int, torch.Tensor] = {}
        layers = getattr(getattr(model, "model", None), "layers", None) or []
        for index, layer in enumerate(layers):
            experts = getattr(getattr(layer, "mlp", None), "experts", None)
            if isinstance(experts, torch.nn.Module):
                self.moe_layers.append(index)
                experts.register_forward_pre_hook(self._hook(index), with_kwargs=True)
        if not self.moe_layers or self.top_k < 1:
            raise ValueError(f"--enable-return-routed-experts: the model ({getattr(config, 'model_type', '?')}) has "
                             "no mixture-of-experts layers to return the experts of")

    def _hook(self, layer: int):
        def record(_module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
            index = args[1] if len(args) > 1 else kwargs["top_k_index"]
            self._captured[layer] = index.detach()

        return record

    def begin(self) -> None:
        self._captured = {}

    def rows(self, tokens: int) -> np.ndarray:
        out = np.zeros((tokens, self.num_layers, self.top_k), dtype=np.int32)
        for layer, index in self._captured.items():
            if index.shape != (tokens, self.top_k):
                raise RuntimeError(f"layer {layer} routed {tuple(index.shape)} top-k ids for {tokens} tokens")
            out[:, layer] = index.to(torch.int32).numpy()
        missing = [layer for layer in self.moe_layers if layer not in self._captured]
        if missing:
            raise RuntimeError(f"MoE layers {missing} ran no experts in this forward")
        return out
