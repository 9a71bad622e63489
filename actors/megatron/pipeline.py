"""Pipeline parallelism (PP > 1): the layout check at start, and the stages' weights gathered
onto the first stage.

Each pipeline stage holds its own run of decoder layers; the embedding lives on the first
stage, the final norm and the output layer on the last (with tied embeddings the last stage
holds a copy of the embedding that Megatron keeps equal to the first stage's). An HF export or
a weight broadcast needs every tensor in one place: the first stage's ranks, where global
rank 0 (the writer and the broadcaster) lives.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

# Unsupported pass-through options for PP > 1, each with why (one model chunk per stage).
_UNSUPPORTED = {
    "virtual_pipeline_model_parallel_size": "the interleaved schedule needs several model chunks per stage, "
                                            "and each stage builds one",
    "pipeline_model_parallel_layout": "each stage builds one plain chunk of decoder layers",
}

# TransformerConfig fields that split the layers unevenly over the stages.
_UNEVEN_SPLIT = ("num_layers_in_first_pipeline_stage", "num_layers_in_last_pipeline_stage",
                 "account_for_embedding_in_pipeline_split", "account_for_loss_in_pipeline_split")


def check_pipeline_layout(transformer: dict[str, Any], hf_checkpoint: str) -> None:
    """Raise ValueError (one line) at start for a pipeline layout the ranks could not build.

    ``transformer``: the TransformerConfig pass-through. The layer split is checked by building
    the TransformerConfig (megatron-core validates it) from the HF config.
    """
    pp = transformer.get("pipeline_model_parallel_size", 1)
    if pp <= 1:
        return
    for name, why in _UNSUPPORTED.items():
        if transformer.get(name) is not None:
            raise ValueError(f"--{name.replace('_', '-')} is not supported with --pipeline-model-parallel-size "
                             f"{pp}: {why}")
    from actors.megatron.bridge import hf_config_if_readable, transformer_config_from_hf

    hf_config = hf_config_if_readable(hf_checkpoint)
    if hf_config is None:
        return
    layers = hf_config.num_hidden_layers
    if not any(transformer.get(name) for name in _UNEVEN_SPLIT) and layers % pp:
        # megatron-core would give each stage layers // pp and silently drop the rest.
        raise ValueError(f"--pipeline-model-parallel-size {pp} does not divide the {layers} layers of "
                         f"{hf_checkpoint}; set --num-layers-in-first-pipeline-stage / "
                         "--num-layers-in-last-pipeline-stage for an uneven split")
    first, last = (transformer.get(f"num_layers_in_{end}_pipeline_stage") for end in ("first", "last"))
    middle_stages = pp - (first is not None) - (last is not None)
    middle = layers - (first or 0) - (last or 0)
    if (first is not None or last is not None) and (middle < 0 or (middle % middle_stages if middle_stages
                                                                    else middle)):
        given = " ".join(f"--num-layers-in-{end}-pipeline-stage {n}" for end, n in (("first", first), ("last", last))
                         if n is not None)
        raise ValueError(f"{given} leaves {middle} of the {layers} layers of {hf_checkpoint} to the other "
                         f"{middle_stages} of --pipeline-model-parallel-size {pp} stages: not an even split")
    try:
        transformer_config_from_hf(hf_config, **transformer)  # megatron-core checks the rest
    except (ValueError, AssertionError) as error:
        text = " ".join(str(error).split())
        raise ValueError(f"--pipeline-model-parallel-size {pp} with the {layers} layers of {hf_checkpoint}: "
                         f"{text}") from None


def gather_to_first_stage(own: Iterator[tuple[str, Tensor]]) -> Iterator[tuple[str, Tensor]]:
    """The whole model's (name, tensor) on the first pipeline stage, this stage's elsewhere.

    ``own``: this stage's tensors, in order. Collective over the pipeline group (every rank
    iterates to the end): a later stage yields its own tensors as it sends them to the first
    stage of its pipeline group; the first stage yields its own, then each later stage's in
    stage order, which is the order of a PP=1 model.
    """
    from megatron.core import parallel_state

    if (not parallel_state.model_parallel_is_initialized()
            or parallel_state.get_pipeline_model_parallel_world_size() == 1):
        yield from own
        return
    group = parallel_state.get_pipeline_model_parallel_group()
    stage = dist.get_rank(group)
    first = dist.get_global_rank(group, 0)
    if stage != 0:
        for name, tensor in own:
            dist.send_object_list([(name, tensor.dtype, tuple(tensor.shape))], dst=first)
            dist.send(tensor.contiguous(), dst=first)
            yield name, tensor
        dist.send_object_list([None], dst=first)  # this stage is done
        return
    yield from own
    device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    for later in range(1, dist.get_world_size(group)):
        src = dist.get_global_rank(group, later)
        while True:
            header: list[Any] = [None]
            dist.recv_object_list(header, src=src)
            if header[0] is None:
                break
            name, dtype, shape = header[0]
            tensor = torch.empty(shape, dtype=dtype, device=device)
            dist.recv(tensor, src=src)
            yield name, tensor
