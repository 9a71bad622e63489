"""Which HF tensors each Megatron parameter (or routing buffer) holds, and how it is split.

Weight layouts (h = hidden, d = head_dim, g = query groups, q = heads per group, f = ffn):

- ``linear_qkv`` fuses q, k, v per query group: rows ``[q0..q(q-1) | k | v]`` of d each, for
  group 0, 1, ...; a TP rank holds a contiguous run of g/tp groups, so the full tensor is
  the concatenation of the rank shards.
- ``linear_fc1`` fuses the gated MLP per rank: rank r holds ``[gate_r ; up_r]`` (f/tp rows
  each), so the gathered tensor is ``[gate_0, up_0, gate_1, up_1, ...]``.
- vocab-parallel embedding / output layer: rows split over TP; the vocab is padded so it
  divides TP and the pad rows are zero on load and dropped on export.
- ``linear_proj`` and ``linear_fc2`` are row-parallel: columns split over TP.
- MoE: the router (``mlp.gate``) and GLM's expert-score bias (a buffer) are replicated; the
  shared experts are an MLP split over TP; routed expert ``e`` lives on expert-parallel rank
  ``e // (experts / ep)`` as local expert ``e % (experts / ep)``, its fc1 / fc2 split like a dense
  MLP's over the expert-tensor-parallel group (``expert_fc1`` / ``expert_row``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch
from megatron.core import parallel_state
from megatron.core.transformer.transformer_config import TransformerConfig
from torch import Tensor

# Megatron per-layer suffix -> (HF per-layer names, how the tensor is split over TP).
_LAYER_MAP: dict[str, tuple[tuple[str, ...], str]] = {
    "input_layernorm.weight": (("input_layernorm.weight",), "replicated"),
    "self_attention.linear_qkv.weight": (
        ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"),
        "qkv",
    ),
    "self_attention.linear_qkv.bias": (
        ("self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias"),
        "qkv",
    ),
    "self_attention.q_layernorm.weight": (("self_attn.q_norm.weight",), "replicated"),
    "self_attention.k_layernorm.weight": (("self_attn.k_norm.weight",), "replicated"),
    "self_attention.linear_proj.weight": (("self_attn.o_proj.weight",), "row"),
    "pre_mlp_layernorm.weight": (("post_attention_layernorm.weight",), "replicated"),
    "mlp.linear_fc1.weight": (("mlp.gate_proj.weight", "mlp.up_proj.weight"), "fc1"),
    "mlp.linear_fc2.weight": (("mlp.down_proj.weight",), "row"),
    # MoE layers
    "mlp.router.weight": (("mlp.gate.weight",), "replicated"),
    "mlp.router.expert_bias": (("mlp.gate.e_score_correction_bias",), "replicated"),
    "mlp.shared_experts.linear_fc1.weight": (
        ("mlp.shared_experts.gate_proj.weight", "mlp.shared_experts.up_proj.weight"), "fc1"),
    "mlp.shared_experts.linear_fc2.weight": (("mlp.shared_experts.down_proj.weight",), "row"),
}

# Routed experts: local index -> HF names of the global expert.
_EXPERT_RE = re.compile(r"^mlp\.experts\.local_experts\.(\d+)\.(linear_fc1|linear_fc2)\.weight$")
_EXPERT_MAP = {
    "linear_fc1": (("gate_proj.weight", "up_proj.weight"), "expert_fc1"),
    "linear_fc2": (("down_proj.weight",), "expert_row"),
}

# Buffers that are part of the checkpoint (GLM's expert-score correction bias).
_BUFFER_SUFFIXES = ("mlp.router.expert_bias",)

_LAYER_RE = re.compile(r"^decoder\.layers\.(\d+)\.(.+)$")

EXPERT_SPLITS = ("expert_fc1", "expert_row")


@dataclass(frozen=True)
class ParamMapping:
    """How one Megatron parameter relates to HF tensors.

    A routed expert's parameter is a different expert on each expert-parallel rank:
    ``ep_hf_names[r]`` are the HF names it holds on EP rank r (``hf_names`` this rank's).
    """

    megatron_name: str
    hf_names: tuple[str, ...]
    split: str  # replicated | row | vocab | qkv | fc1 | expert_fc1 | expert_row
    ep_hf_names: tuple[tuple[str, ...], ...] = ()


def unwrap_model(model: torch.nn.Module) -> torch.nn.Module:
    """The GPTModel inside DDP / Float16Module wrappers."""
    while hasattr(model, "module") and not hasattr(model, "decoder"):
        model = model.module
    return model


def model_tensors(model: torch.nn.Module) -> dict[str, Tensor]:
    """Megatron name -> tensor for every parameter and every checkpointed routing buffer."""
    gpt = unwrap_model(model)
    tensors = dict(gpt.named_parameters())
    tensors.update({name: buf for name, buf in gpt.named_buffers() if name.endswith(_BUFFER_SUFFIXES)})
    return tensors


def _ep() -> tuple[int, int]:
    if not parallel_state.model_parallel_is_initialized():
        return 1, 0
    return parallel_state.get_expert_model_parallel_world_size(), parallel_state.get_expert_model_parallel_rank()


def _layer_mapping(model: torch.nn.Module, name: str, local_index: int, suffix: str) -> ParamMapping:
    # layer_number is global and 1-based, so pipeline stages map to the right HF layer.
    layer = model.decoder.layers[local_index].layer_number - 1
    prefix = f"model.layers.{layer}."
    expert = _EXPERT_RE.match(suffix)
    if expert:
        local, kind = int(expert.group(1)), expert.group(2)
        hf_suffixes, split = _EXPERT_MAP[kind]
        ep, ep_rank = _ep()
        per_rank = model.config.num_moe_experts // ep
        ep_names = tuple(tuple(f"{prefix}mlp.experts.{r * per_rank + local}.{s}" for s in hf_suffixes)
                         for r in range(ep))
        return ParamMapping(name, ep_names[ep_rank], split, ep_names)
    if suffix not in _LAYER_MAP:
        raise KeyError(f"no HF mapping for Megatron parameter {name!r}")
    hf_suffixes, split = _LAYER_MAP[suffix]
    return ParamMapping(name, tuple(prefix + s for s in hf_suffixes), split)


def param_mappings(model: torch.nn.Module) -> list[ParamMapping]:
    """One mapping per tensor of ``model_tensors`` (this rank's model chunk), in its order."""
    model = unwrap_model(model)
    tied = model.share_embeddings_and_output_weights
    mappings = []
    for name in model_tensors(model):
        match = _LAYER_RE.match(name)
        if match:
            mappings.append(_layer_mapping(model, name, int(match.group(1)), match.group(2)))
            continue
        if name == "embedding.word_embeddings.weight":
            hf_names, split = ("model.embed_tokens.weight",), "vocab"
        elif name == "decoder.final_layernorm.weight":
            hf_names, split = ("model.norm.weight",), "replicated"
        elif name == "output_layer.weight":
            # A tied last pipeline stage holds its own copy of the embedding.
            hf_names, split = (("model.embed_tokens.weight",) if tied else ("lm_head.weight",)), "vocab"
        else:
            raise KeyError(f"no HF mapping for Megatron parameter {name!r}")
        mappings.append(ParamMapping(name, hf_names, split))
    return mappings


def tp_size_rank(split: str) -> tuple[int, int]:
    """(size, rank) of the tensor-parallel group a split is sharded over: the expert-TP group
    for routed experts, the TP group otherwise."""
    if split in EXPERT_SPLITS:
        return (parallel_state.get_expert_tensor_parallel_world_size(),
                parallel_state.get_expert_tensor_parallel_rank())
    return (parallel_state.get_tensor_model_parallel_world_size(),
            parallel_state.get_tensor_model_parallel_rank())


def shard_from_hf(mapping: ParamMapping, hf: list[Tensor], config: TransformerConfig, padded_vocab: int) -> Tensor:
    """This TP rank's shard of one Megatron parameter, from the full HF tensors."""
    tp, rank = tp_size_rank(mapping.split)
    if mapping.split == "replicated":
        return hf[0]
    if mapping.split in ("row", "expert_row"):
        return hf[0].chunk(tp, dim=1)[rank]
    if mapping.split == "vocab":
        full = hf[0]
        if full.size(0) < padded_vocab:
            full = torch.cat([full, full.new_zeros(padded_vocab - full.size(0), *full.shape[1:])])
        return full.chunk(tp, dim=0)[rank]
    if mapping.split == "qkv":
        return _fuse_qkv(*hf, config).chunk(tp, dim=0)[rank]
    if mapping.split in ("fc1", "expert_fc1"):
        gate, up = hf
        return torch.cat([gate.chunk(tp, dim=0)[rank], up.chunk(tp, dim=0)[rank]], dim=0)
    raise ValueError(f"unknown split {mapping.split!r}")


def hf_from_shards(mapping: ParamMapping, parts: list[Tensor], config: TransformerConfig,
                   hf_vocab: int) -> list[Tensor]:
    """The full HF tensors of one mapping from its TP shards in rank order (``[local]`` if replicated)."""
    if mapping.split == "replicated":
        return [parts[0].clone()]
    if mapping.split in ("row", "expert_row"):
        return [torch.cat(parts, dim=1)]
    if mapping.split == "vocab":
        return [torch.cat(parts, dim=0)[:hf_vocab]]
    if mapping.split == "qkv":
        return list(_split_qkv(torch.cat(parts, dim=0), config))
    if mapping.split in ("fc1", "expert_fc1"):
        halves = [p.chunk(2, dim=0) for p in parts]
        return [torch.cat([h[0] for h in halves]), torch.cat([h[1] for h in halves])]
    raise ValueError(f"unknown split {mapping.split!r}")


def _fuse_qkv(q: Tensor, k: Tensor, v: Tensor, config: TransformerConfig) -> Tensor:
    groups, d = config.num_query_groups, config.kv_channels
    per_group = config.num_attention_heads // groups
    rest = q.shape[1:]  # (hidden,) for weights, () for biases
    fused = torch.cat(
        [q.reshape(groups, per_group * d, *rest), k.reshape(groups, d, *rest), v.reshape(groups, d, *rest)],
        dim=1,
    )
    return fused.reshape(groups * (per_group + 2) * d, *rest)


def _split_qkv(fused: Tensor, config: TransformerConfig) -> tuple[Tensor, Tensor, Tensor]:
    groups, d = config.num_query_groups, config.kv_channels
    per_group = config.num_attention_heads // groups
    rest = fused.shape[1:]
    grouped = fused.reshape(groups, (per_group + 2) * d, *rest)
    q, k, v = grouped.split([per_group * d, d, d], dim=1)
    return (
        q.reshape(groups * per_group * d, *rest),
        k.reshape(groups * d, *rest),
        v.reshape(groups * d, *rest),
    )
