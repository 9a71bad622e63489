"""HF Llama / Qwen2 / Qwen3 dense checkpoints <-> megatron-core GPTModel (local spec), any TP.

Weight layouts (h = hidden, d = head_dim, g = query groups, q = heads per group, f = ffn):

- ``linear_qkv`` fuses q, k, v per query group: rows ``[q0..q(q-1) | k | v]`` of d each, for
  group 0, 1, ...; a TP rank holds a contiguous run of g/tp groups, so the full tensor is
  the concatenation of the rank shards.
- ``linear_fc1`` fuses the gated MLP per rank: rank r holds ``[gate_r ; up_r]`` (f/tp rows
  each), so the gathered tensor is ``[gate_0, up_0, gate_1, up_1, ...]``.
- vocab-parallel embedding / output layer: rows split over TP; the vocab is padded so it
  divides TP and the pad rows are zero on load and dropped on export.
- ``linear_proj`` and ``linear_fc2`` are row-parallel: columns split over TP.

RoPE: rope_type default, linear and llama3 (Llama 3.1 / 3.2); the inverse frequencies are
computed as transformers computes them (``rope_inv_freq``). Config fields that would change the
numerics and are not mapped are refused by name (``_check_supported``).

Loading reads only the safetensors of the HF directory (each rank slices its own shard, no
communication). Export gathers across the TP group; every TP rank must take part.
``mbridge`` (PyPI) was not used: it targets Transformer Engine layer specs.
"""

from __future__ import annotations

import json
import math
import re
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from megatron.core import parallel_state
from megatron.core.transformer.transformer_config import TransformerConfig
from safetensors import safe_open
from safetensors.torch import save_file
from torch import Tensor

from actors.megatron.pipeline import gather_to_first_stage

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "qwen3")
# Llama 3.1 / 3.2 use llama3; Qwen2.5 / Qwen3 the default (their yarn long-context option is not mapped).
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")

# Files that are weights (not copied with the config / tokenizer when exporting).
_WEIGHT_FILE_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")
_WEIGHT_INDEX_NAMES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")


# --------------------------------------------------------------------------------------------
# Config
# --------------------------------------------------------------------------------------------


def load_hf_config(hf_dir_or_config: Any) -> Any:
    """An HF ``PretrainedConfig`` from a directory path or an already-loaded config."""
    if isinstance(hf_dir_or_config, (str, Path)):
        from transformers import AutoConfig

        return AutoConfig.from_pretrained(str(hf_dir_or_config))
    return hf_dir_or_config


def _check_supported(hf_config: Any) -> None:
    # Every field that changes the HF model's numerics is either mapped below or refused here.
    # Accepted without mapping because the model's forward does not read them: pretraining_tp
    # (transformers 5 ignores it; older versions only split the same matmuls), bos / eos / pad
    # token ids, torch_dtype / dtype (the trainer's precision comes from its own flags),
    # sliding_window / max_window_layers while no layer slides, use_cache.
    model_type = getattr(hf_config, "model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(
            f"HF model_type {model_type!r} is not supported by the bridge "
            f"(supported: {', '.join(SUPPORTED_MODEL_TYPES)})"
        )
    if getattr(hf_config, "hidden_act", "silu") != "silu":
        raise ValueError(f"only hidden_act='silu' is supported, config has {hf_config.hidden_act!r}")
    if getattr(hf_config, "mlp_bias", False):
        raise ValueError("HF config has mlp_bias=True, which the bridge does not map")
    # Llama and Qwen3 put the bias on o_proj as well; the local layer spec can only give
    # linear_proj a bias together with the MLP (add_bias_linear), so it would be dropped.
    if model_type != "qwen2" and getattr(hf_config, "attention_bias", False):
        raise ValueError("HF config has attention_bias=True (q/k/v/o_proj biases), which the bridge does not map")
    if getattr(hf_config, "use_sliding_window", False):
        raise ValueError("HF config has use_sliding_window=True, which the bridge does not map")
    # transformers 5 decides per layer: Qwen2 / Qwen3 derive layer_types from
    # use_sliding_window and max_window_layers, so real configs give only full_attention.
    other_layers = sorted(set(getattr(hf_config, "layer_types", None) or ()) - {"full_attention"})
    if other_layers:
        raise ValueError(f"HF config has layer_types {other_layers}; the bridge maps only full_attention layers")
    rope = _rope_parameters(hf_config)
    if rope["rope_type"] not in SUPPORTED_ROPE_TYPES:
        raise ValueError(
            f"rope_type {rope['rope_type']!r} is not supported by the bridge "
            f"(supported: {', '.join(SUPPORTED_ROPE_TYPES)})"
        )
    if (rope.get("partial_rotary_factor") or 1.0) != 1.0:
        raise ValueError(
            f"HF config has partial_rotary_factor={rope['partial_rotary_factor']}, which the bridge does not map"
        )


def _rope_parameters(hf_config: Any) -> dict[str, Any]:
    """RoPE settings with ``rope_type`` and ``rope_theta`` always present.

    transformers >= 5 keeps them all in ``rope_parameters`` (nested per layer type when
    layer_types differ); older versions in ``rope_theta`` and ``rope_scaling`` (with the
    legacy key ``type``), which is also how hub config.json files spell them.
    """
    params = dict(getattr(hf_config, "rope_parameters", None) or {})
    if isinstance(params.get("full_attention"), dict):
        params = dict(params["full_attention"])
    params = {**(getattr(hf_config, "rope_scaling", None) or {}), **params}
    params["rope_type"] = params.get("rope_type") or params.get("type") or "default"
    if params.get("rope_theta") is None:
        params["rope_theta"] = getattr(hf_config, "rope_theta", None) or 10000.0
    return params


def rope_inv_freq(hf_config: Any) -> Tensor:
    """RoPE inverse frequencies (float32, head_dim / 2) exactly as transformers computes them.

    Megatron's RotaryEmbedding does linear scaling on the positions (equal up to rounding) and
    llama3 scaling only with Llama 3.1's constants hard-coded (low / high freq factor 1 / 4,
    original length 8192), so ``build_gpt_model`` replaces its frequencies with these.
    """
    hf_config = load_hf_config(hf_config)
    _check_supported(hf_config)
    rope = _rope_parameters(hf_config)
    dim = hf_head_dim(hf_config)
    # transformers' expression (int64 arange cast to float32), so results are bit-identical.
    inv_freq = 1.0 / (rope["rope_theta"] ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    if rope["rope_type"] == "linear":
        return inv_freq / rope["factor"]
    if rope["rope_type"] == "llama3":
        # transformers fills in max_position_embeddings when the config omits the original length.
        original = rope.get("original_max_position_embeddings") or hf_config.max_position_embeddings
        return _llama3_scaled(inv_freq, rope["factor"], rope["low_freq_factor"], rope["high_freq_factor"], original)
    return inv_freq


def _llama3_scaled(
    inv_freq: Tensor, factor: float, low_freq_factor: float, high_freq_factor: float, original_max_positions: int
) -> Tensor:
    # Llama 3.1's band-wise scaling, in transformers' operation order: wavelengths shorter than
    # original / high_freq_factor are kept, longer than original / low_freq_factor divided by
    # factor, and those between interpolated linearly in original / wavelength.
    low_freq_wavelen = original_max_positions / low_freq_factor
    high_freq_wavelen = original_max_positions / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (original_max_positions / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return torch.where(medium, (1 - smooth) * scaled / factor + smooth * scaled, scaled)


def hf_head_dim(hf_config: Any) -> int:
    head_dim = getattr(hf_config, "head_dim", None)
    return int(head_dim) if head_dim else hf_config.hidden_size // hf_config.num_attention_heads


def hf_qkv_bias(hf_config: Any) -> bool:
    """Qwen2 always has q/k/v biases (and none on o_proj); Llama / Qwen3 biases are refused."""
    return hf_config.model_type == "qwen2"


def transformer_config_from_hf(hf_config: Any, **overrides: Any) -> TransformerConfig:
    """Megatron ``TransformerConfig`` for an HF Llama / Qwen2 / Qwen3 config.

    ``overrides`` are TransformerConfig fields (e.g. from ``--tensor-model-parallel-size``,
    ``--bf16``, ``--recompute-granularity``) and replace the values derived here. Without
    CUDA the defaults are fp32 and CPU initialisation; with CUDA, bf16. TP/PP default to the
    initialised Megatron parallel state.
    """
    hf_config = load_hf_config(hf_config)
    _check_supported(hf_config)
    cuda = torch.cuda.is_available()
    fields: dict[str, Any] = dict(
        num_layers=hf_config.num_hidden_layers,
        hidden_size=hf_config.hidden_size,
        ffn_hidden_size=hf_config.intermediate_size,
        num_attention_heads=hf_config.num_attention_heads,
        num_query_groups=getattr(hf_config, "num_key_value_heads", None) or hf_config.num_attention_heads,
        kv_channels=hf_head_dim(hf_config),
        normalization="RMSNorm",
        layernorm_epsilon=hf_config.rms_norm_eps,
        gated_linear_unit=True,
        activation_func=F.silu,
        add_bias_linear=False,
        add_qkv_bias=hf_qkv_bias(hf_config),
        qk_layernorm=hf_config.model_type == "qwen3",
        hidden_dropout=0.0,
        attention_dropout=float(getattr(hf_config, "attention_dropout", 0.0) or 0.0),
        init_method_std=getattr(hf_config, "initializer_range", 0.02),
        attention_softmax_in_fp32=True,
        apply_query_key_layer_scaling=False,
        # Fused kernels need CUDA / Apex / TE; the plain torch paths give the same numbers.
        bias_activation_fusion=False,
        bias_dropout_fusion=False,
        masked_softmax_fusion=False,
        apply_rope_fusion=False,
        persist_layer_norm=False,
        gradient_accumulation_fusion=False,
        use_cpu_initialization=not cuda,
        bf16=cuda,
    )
    if parallel_state.model_parallel_is_initialized():
        fields["tensor_model_parallel_size"] = parallel_state.get_tensor_model_parallel_world_size()
        fields["pipeline_model_parallel_size"] = parallel_state.get_pipeline_model_parallel_world_size()
    fields.update(overrides)
    if fields.get("pipeline_model_parallel_size", 1) > 1 and "variable_seq_lengths" not in overrides:
        # Micro-batches are padded to their own length (and hold as many samples as fit), so
        # the stages exchange each activation's shape before the activation itself.
        fields["variable_seq_lengths"] = True
        # megatron-core refuses that with its default MoE dispatcher (allgather) even in a dense
        # model, which never dispatches tokens: name the one it accepts.
        fields.setdefault("moe_token_dispatcher_type", "alltoall")
    # Parameter dtype follows the precision flags unless given explicitly.
    if fields.get("fp16"):
        fields["bf16"] = False
    if "params_dtype" not in overrides:
        fields["params_dtype"] = (
            torch.bfloat16 if fields.get("bf16") else torch.float16 if fields.get("fp16") else torch.float32
        )
    fields.setdefault("pipeline_dtype", fields["params_dtype"])
    return TransformerConfig(**fields)


@dataclass(frozen=True)
class GPTModelArgs:
    """The ``GPTModel`` constructor arguments that come from the HF config (not the TransformerConfig)."""

    vocab_size: int  # padded to a multiple of TP
    hf_vocab_size: int
    max_sequence_length: int
    rotary_base: float
    share_embeddings_and_output_weights: bool


def padded_vocab_size(vocab_size: int, tp: int) -> int:
    """Smallest multiple of ``tp`` >= vocab_size: pad rows add logits the trainer must drop."""
    return -(-vocab_size // tp) * tp


def gpt_model_args_from_hf(hf_config: Any, tensor_parallel_size: int) -> GPTModelArgs:
    hf_config = load_hf_config(hf_config)
    _check_supported(hf_config)
    return GPTModelArgs(
        vocab_size=padded_vocab_size(hf_config.vocab_size, tensor_parallel_size),
        hf_vocab_size=hf_config.vocab_size,
        max_sequence_length=hf_config.max_position_embeddings,
        rotary_base=float(_rope_parameters(hf_config)["rope_theta"]),
        share_embeddings_and_output_weights=bool(getattr(hf_config, "tie_word_embeddings", False)),
    )


# --------------------------------------------------------------------------------------------
# Parameter mapping
# --------------------------------------------------------------------------------------------

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
}

_LAYER_RE = re.compile(r"^decoder\.layers\.(\d+)\.(.+)$")


@dataclass(frozen=True)
class ParamMapping:
    """How one Megatron parameter relates to HF tensors."""

    megatron_name: str
    hf_names: tuple[str, ...]
    split: str  # replicated | row | vocab | qkv | fc1


def unwrap_model(model: torch.nn.Module) -> torch.nn.Module:
    """The GPTModel inside DDP / Float16Module wrappers."""
    while hasattr(model, "module") and not hasattr(model, "decoder"):
        model = model.module
    return model


def param_mappings(model: torch.nn.Module) -> list[ParamMapping]:
    """One mapping per parameter of this rank's model chunk, in ``named_parameters`` order."""
    model = unwrap_model(model)
    tied = model.share_embeddings_and_output_weights
    mappings = []
    for name, _ in model.named_parameters():
        match = _LAYER_RE.match(name)
        if match:
            local_index, suffix = int(match.group(1)), match.group(2)
            if suffix not in _LAYER_MAP:
                raise KeyError(f"no HF mapping for Megatron parameter {name!r}")
            # layer_number is global and 1-based, so pipeline stages map to the right HF layer.
            layer = model.decoder.layers[local_index].layer_number - 1
            hf_suffixes, split = _LAYER_MAP[suffix]
            hf_names = tuple(f"model.layers.{layer}.{s}" for s in hf_suffixes)
        elif name == "embedding.word_embeddings.weight":
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


def _tp() -> tuple[int, int]:
    return (
        parallel_state.get_tensor_model_parallel_world_size(),
        parallel_state.get_tensor_model_parallel_rank(),
    )


def _shard_from_hf(mapping: ParamMapping, hf: list[Tensor], config: TransformerConfig, padded_vocab: int) -> Tensor:
    """This TP rank's shard of one Megatron parameter, from the full HF tensors."""
    tp, rank = _tp()
    if mapping.split == "replicated":
        return hf[0]
    if mapping.split == "row":
        return hf[0].chunk(tp, dim=1)[rank]
    if mapping.split == "vocab":
        full = hf[0]
        if full.size(0) < padded_vocab:
            full = torch.cat([full, full.new_zeros(padded_vocab - full.size(0), *full.shape[1:])])
        return full.chunk(tp, dim=0)[rank]
    if mapping.split == "qkv":
        return _fuse_qkv(*hf, config).chunk(tp, dim=0)[rank]
    if mapping.split == "fc1":
        gate, up = hf
        return torch.cat([gate.chunk(tp, dim=0)[rank], up.chunk(tp, dim=0)[rank]], dim=0)
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


# --------------------------------------------------------------------------------------------
# Loading HF -> Megatron
# --------------------------------------------------------------------------------------------


class HFWeights:
    """Lazy name -> tensor access to the safetensors of an HF checkpoint directory."""

    def __init__(self, hf_dir: str | Path) -> None:
        self.dir = Path(hf_dir)
        index = self.dir / "model.safetensors.index.json"
        if index.exists():
            weight_map = json.loads(index.read_text())["weight_map"]
            self._file_of = {name: self.dir / f for name, f in weight_map.items()}
        else:
            files = sorted(self.dir.glob("*.safetensors"))
            if not files:
                raise FileNotFoundError(
                    f"no *.safetensors in HF checkpoint dir {self.dir} (only safetensors checkpoints "
                    "are supported; re-save with save_pretrained(safe_serialization=True))"
                )
            self._file_of = {}
            for f in files:
                with safe_open(str(f), framework="pt") as handle:
                    self._file_of.update({name: f for name in handle.keys()})

    def __contains__(self, name: str) -> bool:
        return name in self._file_of

    def names(self) -> list[str]:
        return list(self._file_of)

    def get(self, name: str) -> Tensor:
        if name not in self._file_of:
            raise KeyError(f"tensor {name!r} not found in HF checkpoint {self.dir}")
        with safe_open(str(self._file_of[name]), framework="pt") as handle:
            return handle.get_tensor(name)


@torch.no_grad()
def load_hf_weights(model: torch.nn.Module, hf_dir: str | Path) -> None:
    """Copy an HF checkpoint's weights into this rank's Megatron model (any TP / PP stage).

    Each rank reads the tensors it needs from disk and keeps its TP shard; no communication.
    Raises on any missing tensor or shape mismatch, naming both sides.
    """
    gpt = unwrap_model(model)
    weights = HFWeights(hf_dir)
    params = dict(gpt.named_parameters())
    padded_vocab = gpt.vocab_size
    for mapping in param_mappings(gpt):
        param = params[mapping.megatron_name]
        shard = _shard_from_hf(mapping, [weights.get(n) for n in mapping.hf_names], gpt.config, padded_vocab)
        if shard.shape != param.shape:
            raise ValueError(
                f"shape mismatch loading {mapping.hf_names} into {mapping.megatron_name}: "
                f"HF shard {tuple(shard.shape)} vs Megatron {tuple(param.shape)} (check the HF config "
                "matches the checkpoint and TP divides heads / groups / ffn size)"
            )
        param.copy_(shard)


# --------------------------------------------------------------------------------------------
# Export Megatron -> HF
# --------------------------------------------------------------------------------------------


def _gather_tp(local: Tensor) -> list[Tensor]:
    tp, _ = _tp()
    if tp == 1:
        return [local]
    parts = [torch.empty_like(local) for _ in range(tp)]
    dist.all_gather(parts, local.contiguous(), group=parallel_state.get_tensor_model_parallel_group())
    return parts


def _hf_tensors(mapping: ParamMapping, local: Tensor, config: TransformerConfig, hf_vocab: int) -> list[tuple[str, Tensor]]:
    if mapping.split == "replicated":
        return [(mapping.hf_names[0], local.clone())]
    parts = _gather_tp(local)
    if mapping.split == "row":
        tensors = [torch.cat(parts, dim=1)]
    elif mapping.split == "vocab":
        tensors = [torch.cat(parts, dim=0)[:hf_vocab]]
    elif mapping.split == "qkv":
        tensors = list(_split_qkv(torch.cat(parts, dim=0), config))
    elif mapping.split == "fc1":
        halves = [p.chunk(2, dim=0) for p in parts]
        tensors = [torch.cat([h[0] for h in halves]), torch.cat([h[1] for h in halves])]
    else:
        raise ValueError(f"unknown split {mapping.split!r}")
    return list(zip(mapping.hf_names, tensors))


def hf_vocab_size_of(model: torch.nn.Module) -> int:
    """The unpadded (HF) vocab size recorded by ``build_gpt_model``; logits beyond it are padding."""
    gpt = unwrap_model(model)
    return getattr(gpt, "hf_vocab_size", gpt.vocab_size)


@torch.no_grad()
def iter_hf_weights(model: torch.nn.Module) -> Iterator[tuple[str, Tensor]]:
    """(HF name, full tensor) for every weight of the model, gathered across TP and PP.

    Collective over the TP and pipeline groups: every rank must iterate to the end. Every TP
    rank of the first pipeline stage receives all full tensors, in HF order; a later stage's
    ranks get only their stage's (see ``pipeline.gather_to_first_stage``).
    """
    yield from gather_to_first_stage(_iter_stage_hf_weights(unwrap_model(model)))


def _iter_stage_hf_weights(gpt: torch.nn.Module) -> Iterator[tuple[str, Tensor]]:
    """(HF name, full tensor) of this pipeline stage's weights, gathered across TP."""
    params = dict(gpt.named_parameters())
    hf_vocab = hf_vocab_size_of(gpt)
    for mapping in param_mappings(gpt):
        if mapping.megatron_name == "output_layer.weight" and gpt.share_embeddings_and_output_weights:
            continue  # the tied copy (on the last stage with PP); the embedding is exported once
        yield from _hf_tensors(mapping, params[mapping.megatron_name].detach(), gpt.config, hf_vocab)


def iter_hf_weight_buckets(
    model: torch.nn.Module, bucket_bytes: int, dtype: torch.dtype | None = None
) -> Iterator[list[tuple[str, Tensor]]]:
    """HF-named full tensors in buckets of at most ``bucket_bytes`` (a bigger tensor goes alone).

    ``dtype`` casts each tensor (e.g. to the engine's bf16). Collective over the TP group.
    """
    bucket: list[tuple[str, Tensor]] = []
    size = 0
    for name, tensor in iter_hf_weights(model):
        if dtype is not None:
            tensor = tensor.to(dtype)
        nbytes = tensor.numel() * tensor.element_size()
        if bucket and size + nbytes > bucket_bytes:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, tensor))
        size += nbytes
    if bucket:
        yield bucket


def _hf_checkpoint_dtype(hf_config: Any) -> torch.dtype | None:
    dtype = getattr(hf_config, "dtype", None) or getattr(hf_config, "torch_dtype", None)
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype, None)
    return dtype if isinstance(dtype, torch.dtype) else None


def copy_hf_metadata(hf_src_dir: str | Path, out_dir: str | Path) -> None:
    """Copy config, generation config and tokenizer files (everything but weights)."""
    src, out = Path(hf_src_dir), Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.is_file() and not f.name.endswith(_WEIGHT_FILE_SUFFIXES) and f.name not in _WEIGHT_INDEX_NAMES:
            shutil.copy2(f, out / f.name)


def save_hf_checkpoint(
    model: torch.nn.Module,
    hf_src_dir: str | Path,
    out_dir: str | Path,
    shard_bytes: int = 4 * 1024**3,
) -> None:
    """Write the model as an HF checkpoint: safetensors shards (+ index) and the source's
    config.json / tokenizer files. Tensors are cast to the source config's dtype.

    Collective over the TP group (all TP ranks call it); global rank 0 writes.
    """
    hf_config = load_hf_config(hf_src_dir)
    dtype = _hf_checkpoint_dtype(hf_config)
    writer = not dist.is_initialized() or dist.get_rank() == 0
    out = Path(out_dir)
    # Shards are written as they are gathered (rank 0 never holds the whole model) and
    # renamed once their count is known.
    written: list[tuple[Path, list[str], int]] = []
    for i, bucket in enumerate(iter_hf_weight_buckets(model, shard_bytes, dtype=dtype)):
        if not writer:
            continue
        out.mkdir(parents=True, exist_ok=True)
        part = out / f"model-part-{i:05d}.safetensors.tmp"
        save_file({name: t.detach().cpu().contiguous() for name, t in bucket}, str(part), metadata={"format": "pt"})
        written.append((part, [n for n, _ in bucket], sum(t.numel() * t.element_size() for _, t in bucket)))
    if not writer:
        return
    copy_hf_metadata(hf_src_dir, out)
    if len(written) == 1:
        written[0][0].rename(out / "model.safetensors")
        return
    weight_map: dict[str, str] = {}
    for i, (part, names, _) in enumerate(written):
        fname = f"model-{i + 1:05d}-of-{len(written):05d}.safetensors"
        part.rename(out / fname)
        weight_map.update({name: fname for name in names})
    index = {"metadata": {"total_size": sum(n for _, _, n in written)}, "weight_map": weight_map}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
