"""Routed experts as engines return them, and as samples carry them (rollout routing replay).

SGLang 0.5.17 (``--enable-return-routed-experts`` on the server, ``return_routed_experts: true``
on /generate) answers a finished request with ``meta_info["routed_experts"]``: base64 of a C-order
int32 array ``[prompt_tokens + completion_tokens - 1, num_hidden_layers, num_experts_per_tok]``,
row i the experts every layer's router picked for the token at position i (the last token was
never fed); dense layers' rows are zeros. A server started without the flag leaves the field out
(it does not refuse the request). The CPU engine answers the same (actors/engine/cpu/routed_experts.py).

The runtime's layout, the one ``Sample.rollout_routed_experts`` holds and the trainer replays:
a numpy int32 array ``[len(sample.tokens) - 1, num_moe_layers, top_k]``, row i the experts that
processed position i (prompt and response), only the mixture-of-experts layers, in layer order
(dense layers of mixed models, Qwen3-MoE's ``mlp_only_layers`` / ``decoder_sparse_step`` and
GLM-4.5's ``first_k_dense_replace``, are dropped). `RoutedLayout.decode` converts one to the other.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np


class RoutedExpertsError(ValueError):
    """An engine's routed experts do not fit the model or the request."""


@dataclass(frozen=True)
class RoutedLayout:
    """Which layers of a model route to experts, and how many experts a token gets."""

    num_layers: int  # num_hidden_layers: SGLang's array has a row per layer
    top_k: int  # num_experts_per_tok
    moe_layers: tuple[int, ...]  # the layers kept in the runtime's layout, ascending

    def decode(self, encoded: Any, positions: int) -> np.ndarray:
        """SGLang's ``meta_info.routed_experts`` of an answer covering ``positions`` fed positions
        -> ``[positions, len(moe_layers), top_k]`` int32."""
        if not isinstance(encoded, str):
            raise RoutedExpertsError(f"meta_info.routed_experts must be a base64 string, got {type(encoded).__name__}")
        try:
            flat = np.frombuffer(base64.b64decode(encoded, validate=True), dtype=np.int32)
        except (ValueError, TypeError) as error:
            raise RoutedExpertsError(f"meta_info.routed_experts is not base64 of int32 values: {error}") from None
        per_position = self.num_layers * self.top_k
        if flat.size != positions * per_position:
            raise RoutedExpertsError(
                f"meta_info.routed_experts holds {flat.size} ids; {positions} positions x {self.num_layers} layers x "
                f"top-{self.top_k} need {positions * per_position}")
        full = flat.reshape(positions, self.num_layers, self.top_k)
        return np.ascontiguousarray(full[:, list(self.moe_layers), :])


def routed_layout(config: dict[str, Any]) -> RoutedLayout | None:
    """The MoE layers of an HF config (config.json as a dict); None for a dense model.

    Qwen2/3-MoE: layer i is sparse unless it is in ``mlp_only_layers`` or (i + 1) is not a
    multiple of ``decoder_sparse_step`` (transformers' Qwen3MoeDecoderLayer); GLM-4.5 and the
    DeepSeek-V3 family: layers from ``first_k_dense_replace`` on (every one, ``moe_layer_freq`` 1)."""
    config = config.get("text_config", config)
    layers = int(config.get("num_hidden_layers", 0))
    top_k = int(config.get("num_experts_per_tok") or 0)
    model_type = str(config.get("model_type", ""))
    if model_type in ("qwen2_moe", "qwen3_moe"):
        if not (config.get("num_experts") or config.get("num_local_experts")):  # transformers 5 saves the latter
            return None
        dense = set(config.get("mlp_only_layers") or ())
        step = int(config.get("decoder_sparse_step", 1) or 1)
        moe = tuple(i for i in range(layers) if i not in dense and (i + 1) % step == 0)
    elif "first_k_dense_replace" in config and config.get("n_routed_experts"):
        if int(config.get("moe_layer_freq", 1) or 1) != 1:
            raise RoutedExpertsError(f"{model_type}: moe_layer_freq {config['moe_layer_freq']} is not supported")
        moe = tuple(range(int(config["first_k_dense_replace"]), layers))
    else:
        return None
    if not moe or top_k < 1:
        return None
    return RoutedLayout(layers, top_k, moe)


def model_routed_layout(model_dir: str | Path) -> RoutedLayout | None:
    """`routed_layout` of an HF model directory's config.json."""
    path = Path(model_dir) / "config.json"
    try:
        return routed_layout(json.loads(path.read_text()))
    except (OSError, json.JSONDecodeError) as error:
        raise RoutedExpertsError(f"cannot read {path}: {error}") from None


def cover(experts: np.ndarray | None, positions: int) -> np.ndarray:
    """A finished sample's routed experts for all ``positions`` (len(tokens) - 1) positions.

    The engine's answer to a sample's last turn covers everything up to its last generated token;
    tokens a hook appends after that turn (a final tool result) were never fed to the model, and
    get rows of expert 0. That is harmless to replay: with causal attention no trained token's
    logprob depends on positions after it, and those come after every trained token."""
    if experts is None:
        raise RoutedExpertsError("the sample has no routed experts: --use-rollout-routing-replay needs every turn "
                                 "generated through ctx.generate_turn")
    if len(experts) > positions:
        raise RoutedExpertsError(f"routed experts cover {len(experts)} positions, the sample has only {positions}")
    if len(experts) == positions:
        return experts
    pad = np.zeros((positions - len(experts), *experts.shape[1:]), dtype=np.int32)
    return np.concatenate([experts, pad])


def trim(experts: np.ndarray | None, positions: int) -> np.ndarray | None:
    """The rows of the first ``positions`` positions (a completion cut at a text stop string)."""
    if experts is None or len(experts) <= positions:
        return experts
    return experts[:positions]


def to_jsonable(experts: np.ndarray | None) -> Any:
    """A sample's routed experts for JSON (buffer checkpoints, dumps): nested lists of ints."""
    return None if experts is None else np.asarray(experts).tolist()


def from_jsonable(value: Any) -> np.ndarray | None:
    """What `to_jsonable` wrote, as the int32 array again."""
    if value is None:
        return None
    array = np.asarray(value, dtype=np.int32)
    if array.ndim != 3 and array.size:
        raise RoutedExpertsError(f"rollout_routed_experts must be [positions, layers, top_k], got shape {array.shape}")
    return array
