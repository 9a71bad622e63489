"""Build a megatron-core GPTModel (local layer spec) for an HF model the bridge maps (dense or MoE)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from megatron.core import parallel_state
from megatron.core.models.gpt import GPTModel

from actors.megatron.attention import gpt_model_spec
from actors.megatron.bridge import (
    gpt_model_args_from_hf,
    load_hf_config,
    load_hf_weights,
    rope_inv_freq,
    transformer_config_from_hf,
)
from actors.megatron.cpu_compat import apply_cpu_compat
from actors.megatron.te_absent import bind_missing_te_names


def build_gpt_model(
    hf_dir_or_config: str | Path | Any,
    transformer_overrides: dict[str, Any] | None = None,
    use_sdpa: bool | None = None,
    load_weights: bool = False,
    attention_impl: str = "auto",
) -> GPTModel:
    """This rank's GPTModel chunk for an HF config (Megatron parallel state must be initialised).

    - ``transformer_overrides``: TransformerConfig fields that replace the HF-derived values.
    - ``use_sdpa``: SDPA core attention (default on GPU) instead of the unfused local one
      (default on CPU, where it is exact and memory is not the constraint).
    - ``attention_impl``: how SDPA attends packed sequences (actors.megatron.varlen).
    - ``load_weights``: copy the weights of ``hf_dir_or_config`` (a directory) into the model;
      otherwise parameters are randomly initialised.

    The vocab is padded to a multiple of TP; ``model.hf_vocab_size`` holds the real size and
    logits at or beyond it must be ignored. On CPU the cpu_compat fallbacks are applied and
    the model lives on CPU; on GPU it is moved to the current device.
    """
    apply_cpu_compat()
    bind_missing_te_names()
    hf_config = load_hf_config(hf_dir_or_config)
    config = transformer_config_from_hf(hf_config, **(transformer_overrides or {}))
    if use_sdpa is None:
        use_sdpa = torch.cuda.is_available()
    args = gpt_model_args_from_hf(hf_config, parallel_state.get_tensor_model_parallel_world_size())
    model = GPTModel(
        config=config,
        transformer_layer_spec=gpt_model_spec(config, use_sdpa=use_sdpa, attention_impl=attention_impl),
        vocab_size=args.vocab_size,
        max_sequence_length=args.max_sequence_length,
        pre_process=parallel_state.is_pipeline_first_stage(),
        post_process=parallel_state.is_pipeline_last_stage(),
        parallel_output=True,
        share_embeddings_and_output_weights=args.share_embeddings_and_output_weights,
        position_embedding_type="rope",
        rotary_base=args.rotary_base,
        rotary_percent=args.rotary_percent,
    )
    model.hf_vocab_size = args.hf_vocab_size
    # GPTModel's own RoPE arguments cover llama3 scaling only with Llama 3.1's constants, so the
    # frequencies come from the HF config (see rope_inv_freq). Set before the first forward:
    # RotaryEmbedding caches its output per sequence length.
    rope = model.rotary_pos_emb
    rope.inv_freq = rope_inv_freq(hf_config).to(rope.inv_freq.device)
    _cast_params(model, config.params_dtype)
    if torch.cuda.is_available():
        model.cuda(torch.cuda.current_device())
    if load_weights:
        if not isinstance(hf_dir_or_config, (str, Path)):
            raise ValueError("load_weights=True needs an HF checkpoint directory, not a config object")
        load_hf_weights(model, hf_dir_or_config)
    return model


def _cast_params(model: torch.nn.Module, dtype: torch.dtype) -> None:
    """Every floating-point parameter in ``dtype`` (buffers such as RoPE's frequencies stay fp32).

    The local spec's norms are ``torch.nn.RMSNorm``, created in torch's default fp32 whatever
    ``params_dtype`` says (Megatron-LM casts its whole model through Float16Module; this trainer
    does not wrap it). With bf16 those fp32 norms land in the Float16 optimizer's fp32 group,
    whose ``sharded_state_dict`` maps only its float16 group to the model's tensors: a run
    checkpoint then fails ("Param id N does not match any model sharded param"). The HF model
    (and SGLang's copy of it) keeps its norms in the checkpoint dtype too.
    """
    for param in model.parameters():
        if param.is_floating_point() and param.dtype != dtype:
            param.data = param.data.to(dtype)
