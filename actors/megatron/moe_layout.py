"""The parallel layout of an MoE model in the trainer, checked at start (before any rank is spawned).

Experts are spread over ``--expert-model-parallel-size`` (EP) ranks taken from the data-parallel
ranks, each expert split over ``--expert-tensor-parallel-size`` (expert TP) ranks; the ranks of a
dispatch group run aligned micro-batches (actors/megatron/mb_align.py). Attention TP with MoE
runs under sequence parallelism (on by default there, transformer_config_from_hf). What
megatron-core would refuse only inside the ranks, or the trainer cannot run, fails here with one
line naming the flag, instead of a gloo abort or a hang inside the ranks.
"""

from __future__ import annotations

from typing import Any

import torch

# Token dispatchers that need CUDA (streams for the device-to-host sync, DeepEP / HybridEP kernels).
_CUDA_DISPATCHERS = ("alltoall", "flex")


def check_moe_layout(transformer: dict[str, Any], hf_checkpoint: str, ranks: int) -> None:
    """Raise ValueError (one line) for an MoE layout the ranks could not train.

    ``transformer``: the TransformerConfig pass-through; ``ranks``: every training rank.
    """
    tp = transformer.get("tensor_model_parallel_size", 1)
    pp = transformer.get("pipeline_model_parallel_size", 1)
    ep = transformer.get("expert_model_parallel_size", 1)
    etp = transformer.get("expert_tensor_parallel_size") or tp
    if transformer.get("moe_grouped_gemm"):
        raise ValueError("--moe-grouped-gemm is not supported: the bridge maps the local spec's per-expert MLPs "
                         "(SequentialMLP), and the grouped-GEMM experts hold their weights in another layout")
    if tp == pp == ep == 1 and not {"expert_tensor_parallel_size", "moe_token_dispatcher_type"} & set(transformer):
        return  # one rank's layout: nothing to check, no need to read the HF config
    from actors.megatron.bridge import hf_config_if_readable, transformer_config_from_hf

    hf_config = hf_config_if_readable(hf_checkpoint)
    if hf_config is None:
        return
    experts = transformer_config_from_hf(hf_config).num_moe_experts  # refuses unmapped MoE fields too
    if not experts:
        if ep > 1 or transformer.get("expert_tensor_parallel_size"):
            raise ValueError(f"--expert-model-parallel-size / --expert-tensor-parallel-size need an MoE model; "
                             f"{hf_checkpoint} has no MoE layers")
        return
    if tp > 1 and transformer.get("sequence_parallel") is False:
        # The bridge turns sequence parallelism on for MoE at TP > 1 unless a flag said no.
        raise ValueError(f"--no-sequence-parallel with --tensor-model-parallel-size {tp} and the MoE model "
                         f"{hf_checkpoint}: megatron-core trains MoE layers under TP only with sequence "
                         "parallelism (drop the flag: it is on by default there)")
    if experts % ep:
        raise ValueError(f"--expert-model-parallel-size {ep} does not divide the {experts} experts of "
                         f"{hf_checkpoint}")
    if ranks % pp or (ranks // pp) % (ep * etp):
        raise ValueError(f"--expert-model-parallel-size {ep} x --expert-tensor-parallel-size {etp} does not divide "
                         f"the {ranks // max(pp, 1)} ranks of each pipeline stage")
    dispatcher = transformer.get("moe_token_dispatcher_type") or ("alltoall" if pp > 1 else "allgather")
    if dispatcher in _CUDA_DISPATCHERS and not torch.cuda.is_available():
        cause = (f"--moe-token-dispatcher-type {dispatcher}" if "moe_token_dispatcher_type" in transformer
                 else f"--pipeline-model-parallel-size {pp} (its variable-length micro-batches need the alltoall "
                      "token dispatcher)")
        raise ValueError(f"{cause} with the MoE model {hf_checkpoint} needs CUDA; on CPU the experts are dispatched "
                         "with allgather")


def check_routing_replay(transformer: dict[str, Any], hf_checkpoint: str) -> None:
    """Raise ValueError (one line) where --use-rollout-routing-replay could not replay the engine's experts."""
    if transformer.get("moe_router_fusion"):
        raise ValueError("--use-rollout-routing-replay with --moe-router-fusion: the fused top-k kernel bypasses "
                         "megatron-core's routing replay")
    if transformer.get("recompute_granularity"):
        # A recomputed forward in the backward would route by itself: the gradient of other experts.
        raise ValueError(f"--use-rollout-routing-replay with --recompute-granularity "
                         f"{transformer['recompute_granularity']}: the recomputed forward is not replayed yet")
    from actors.megatron.bridge import hf_config_if_readable, transformer_config_from_hf

    hf_config = hf_config_if_readable(hf_checkpoint)
    if hf_config is None:
        return
    if not transformer_config_from_hf(hf_config).num_moe_experts:
        raise ValueError(f"--use-rollout-routing-replay needs an MoE model; {hf_checkpoint} has no MoE layers")
