"""HF safetensors <-> this rank's Megatron model: load (each rank reads its own shards, no
communication), export (full HF tensors gathered over TP, expert-TP, EP and PP), HF checkpoints.

Loading reads only the safetensors of the HF directory. Export gathers across the TP group, and
for routed experts across the expert-tensor-parallel and expert-parallel groups: every rank of
those groups must take part. Routing buffers (GLM's ``e_score_correction_bias``) travel with the
weights and keep float32 whatever dtype the weights are cast to.
``mbridge`` (PyPI) was not used: it targets Transformer Engine layer specs.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from megatron.core import parallel_state
from safetensors import safe_open
from safetensors.torch import save_file
from torch import Tensor

from actors.megatron.bridge.hf_config import load_hf_config
from actors.megatron.bridge.mapping import (
    EXPERT_SPLITS,
    ParamMapping,
    hf_from_shards,
    model_tensors,
    param_mappings,
    shard_from_hf,
    tp_size_rank,
    unwrap_model,
)
from actors.megatron.pipeline import gather_to_first_stage

# Files that are weights (not copied with the config / tokenizer when exporting).
_WEIGHT_FILE_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")
_WEIGHT_INDEX_NAMES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
# HF tensors kept in float32 when the weights are cast (transformers keeps them float32 too).
_FLOAT32_TENSORS = ("e_score_correction_bias",)


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
    params = model_tensors(gpt)
    padded_vocab = gpt.vocab_size
    for mapping in param_mappings(gpt):
        param = params[mapping.megatron_name]
        shard = shard_from_hf(mapping, [weights.get(n) for n in mapping.hf_names], gpt.config, padded_vocab)
        if shard.shape != param.shape:
            raise ValueError(
                f"shape mismatch loading {mapping.hf_names} into {mapping.megatron_name}: "
                f"HF shard {tuple(shard.shape)} vs Megatron {tuple(param.shape)} (check the HF config "
                "matches the checkpoint and TP divides heads / groups / ffn size)"
            )
        param.copy_(shard)


def _gather(local: Tensor, size: int, group: Any) -> list[Tensor]:
    if size == 1:
        return [local]
    parts = [torch.empty_like(local) for _ in range(size)]
    dist.all_gather(parts, local.contiguous(), group=group)
    return parts


def _hf_tensors(mapping: ParamMapping, local: Tensor, config: Any, hf_vocab: int) -> list[tuple[str, Tensor]]:
    """(HF name, full tensor) of one mapping: gathered over its TP group, and for a routed
    expert over the expert-parallel group too (the same local expert of every EP rank)."""
    parts = [local]
    if mapping.split != "replicated":
        tp, _ = tp_size_rank(mapping.split)
        group = (parallel_state.get_expert_tensor_parallel_group() if mapping.split in EXPERT_SPLITS
                 else parallel_state.get_tensor_model_parallel_group())
        parts = _gather(local, tp, group)
    tensors = hf_from_shards(mapping, parts, config, hf_vocab)
    if mapping.split not in EXPERT_SPLITS or len(mapping.ep_hf_names) == 1:
        return list(zip(mapping.hf_names, tensors))
    ep_group = parallel_state.get_expert_model_parallel_group()
    per_rank = [_gather(t, len(mapping.ep_hf_names), ep_group) for t in tensors]
    return [(name, per_rank[i][r]) for r, names in enumerate(mapping.ep_hf_names) for i, name in enumerate(names)]


def hf_vocab_size_of(model: torch.nn.Module) -> int:
    """The unpadded (HF) vocab size recorded by ``build_gpt_model``; logits beyond it are padding."""
    gpt = unwrap_model(model)
    return getattr(gpt, "hf_vocab_size", gpt.vocab_size)


@torch.no_grad()
def iter_hf_weights(model: torch.nn.Module) -> Iterator[tuple[str, Tensor]]:
    """(HF name, full tensor) for every weight of the model, gathered across TP and PP.

    Collective over the TP, expert-TP, expert-parallel and pipeline groups: every rank must
    iterate to the end. Every TP rank of the first pipeline stage receives all full tensors; a
    later stage's ranks get only their stage's (see ``pipeline.gather_to_first_stage``).
    """
    yield from gather_to_first_stage(_iter_stage_hf_weights(unwrap_model(model)))


def _iter_stage_hf_weights(gpt: torch.nn.Module) -> Iterator[tuple[str, Tensor]]:
    """(HF name, full tensor) of this pipeline stage's weights, gathered across TP."""
    params = model_tensors(gpt)
    hf_vocab = hf_vocab_size_of(gpt)
    for mapping in param_mappings(gpt):
        if mapping.megatron_name == "output_layer.weight" and gpt.share_embeddings_and_output_weights:
            continue  # the tied copy (on the last stage with PP); the embedding is exported once
        yield from _hf_tensors(mapping, params[mapping.megatron_name].detach(), gpt.config, hf_vocab)


def iter_hf_weight_buckets(
    model: torch.nn.Module, bucket_bytes: int, dtype: torch.dtype | None = None
) -> Iterator[list[tuple[str, Tensor]]]:
    """HF-named full tensors in buckets of at most ``bucket_bytes`` (a bigger tensor goes alone).

    ``dtype`` casts each weight (e.g. to the engine's bf16; routing buffers stay float32).
    Collective like ``iter_hf_weights``.
    """
    bucket: list[tuple[str, Tensor]] = []
    size = 0
    for name, tensor in iter_hf_weights(model):
        if dtype is not None and not name.endswith(_FLOAT32_TENSORS):
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
    config.json / tokenizer files. Weights are cast to the source config's dtype.

    Collective like ``iter_hf_weights`` (every rank of the TP, EP and PP groups calls it);
    global rank 0 writes.
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
