"""Core attention on ``torch.nn.functional.scaled_dot_product_attention`` for the local spec.

The local spec's ``DotProductAttention`` materialises the [b, heads, s, s] score tensor (a
1.5B model at 8 x 2048 tokens runs out of 140 GB). SDPA dispatches to flash / memory-efficient
kernels on GPU and to the math kernel on CPU, with the same numbers as the unfused path.

Packed sequences (``PackedSeqParams`` with ``qkv_format="thd"``) are attended in one varlen call
where a flash varlen kernel runs (CUDA, bf16/fp16: actors/megatron/varlen.py), else one sequence
at a time with ``is_causal=True`` (faster on CPU than one masked call), so no token ever sees
another sequence. ``attention_impl`` ("auto", "loop", "varlen") forces either; "varlen" without
a flash kernel is one SDPA call with a block-diagonal mask.
"""

from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec, get_gpt_layer_local_spec
from megatron.core.packed_seq_params import PackedSeqParams
from megatron.core.process_groups_config import ProcessGroupCollection
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.module import MegatronModule
from megatron.core.transformer.spec_utils import ModuleSpec
from megatron.core.transformer.transformer_block import TransformerBlockSubmodules, get_num_layers_to_build
from megatron.core.transformer.transformer_config import TransformerConfig
from torch import Tensor

from actors.megatron.norm import TorchNorm, use_torch_norm
from actors.megatron.varlen import AttentionImpl, flash_runs, flash_varlen, masked_varlen


class SDPAttention(MegatronModule):
    """Drop-in for megatron-core's ``DotProductAttention``: same constructor and forward.

    Shapes: query [sq, b, heads/tp, d], key/value [sk, b, groups/tp, d] -> [sq, b, heads/tp * d];
    packed ("thd"): query [t, heads/tp, d] -> [t, heads/tp * d].
    ``attention_mask`` follows Megatron's convention: True marks a position that must NOT be
    attended. Rows that mask everything (padding) attend everywhere instead of producing NaN;
    their outputs are meaningless either way and are expected to be loss-masked.
    """

    def __init__(
        self,
        config: TransformerConfig,
        layer_number: int,
        attn_mask_type: AttnMaskType,
        attention_type: str,
        attention_dropout: Optional[float] = None,
        softmax_scale: Optional[float] = None,
        cp_comm_type: Optional[str] = None,
        pg_collection: Optional[ProcessGroupCollection] = None,
        attention_impl: AttentionImpl = "auto",
    ) -> None:
        super().__init__(config=config)
        if attention_impl not in ("auto", "loop", "varlen"):
            raise ValueError(f"--attention-impl must be auto, loop or varlen, got {attention_impl!r}")
        self.attention_impl = attention_impl
        if config.context_parallel_size != 1:
            raise ValueError("SDPAttention does not support context parallelism (--context-parallel-size 1)")
        if config.window_size is not None:
            raise ValueError("SDPAttention does not support sliding-window attention (window_size)")
        if config.softmax_type != "vanilla":
            raise ValueError(f"SDPAttention supports softmax_type='vanilla' only, got {config.softmax_type!r}")
        if pg_collection is None:
            pg_collection = ProcessGroupCollection.use_mpu_process_groups(required_pgs=["tp"])
        tp = pg_collection.tp.size()
        self.attn_mask_type = attn_mask_type
        self.num_heads_per_partition = config.num_attention_heads // tp
        self.num_groups_per_partition = config.num_query_groups // tp
        self.head_dim = config.kv_channels
        self.softmax_scale = (
            softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(self.head_dim)
        )
        self.dropout_p = config.attention_dropout if attention_dropout is None else attention_dropout

    def forward(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        attention_mask: Optional[Tensor],
        attn_mask_type: Optional[AttnMaskType] = None,
        attention_bias: Optional[Tensor] = None,
        packed_seq_params: Optional[PackedSeqParams] = None,
    ) -> Tensor:
        if attention_bias is not None:
            raise ValueError("SDPAttention does not support attention_bias")
        mask_type = attn_mask_type if attn_mask_type is not None else self.attn_mask_type
        if packed_seq_params is not None:
            return self._packed_forward(query, key, value, packed_seq_params, mask_type)

        # [s, b, h, d] -> [b, h, s, d]
        q, k, v = (x.permute(1, 2, 0, 3) for x in (query, key, value))
        if attention_mask is not None:
            allowed = ~attention_mask
            # A row with nothing allowed would give NaN; let it attend everywhere instead.
            allowed = allowed | ~allowed.any(dim=-1, keepdim=True)
            out = self._sdpa(q, k, v, attn_mask=allowed, is_causal=False)
        else:
            causal = mask_type == AttnMaskType.causal and q.size(2) > 1
            out = self._sdpa(q, k, v, attn_mask=None, is_causal=causal)
        # [b, h, s, d] -> [s, b, h*d]
        b, h, s, d = out.shape
        return out.permute(2, 0, 1, 3).reshape(s, b, h * d)

    def _packed_forward(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        params: PackedSeqParams,
        mask_type: AttnMaskType,
    ) -> Tensor:
        if params.qkv_format != "thd":
            raise ValueError(f"SDPAttention packs only qkv_format='thd', got {params.qkv_format!r}")
        cu_q = params.cu_seqlens_q_padded if params.cu_seqlens_q_padded is not None else params.cu_seqlens_q
        cu_kv = params.cu_seqlens_kv_padded if params.cu_seqlens_kv_padded is not None else params.cu_seqlens_kv
        causal = mask_type in (AttnMaskType.causal, AttnMaskType.padding_causal)
        if self._one_call(query):
            return self._varlen_forward(query, key, value, cu_q, cu_kv, causal)
        # Boundaries are read once on the host; one SDPA call per sequence keeps attention
        # block-diagonal by construction.
        bounds_q = cu_q.tolist()
        bounds_kv = cu_kv.tolist()
        out = query.new_zeros(query.size(0), query.size(1), query.size(2))
        for i in range(len(bounds_q) - 1):
            q0, q1, k0, k1 = bounds_q[i], bounds_q[i + 1], bounds_kv[i], bounds_kv[i + 1]
            if q1 == q0:
                continue
            # [t_i, h, d] -> [1, h, t_i, d]
            q, k, v = (
                x[a:b].permute(1, 0, 2).unsqueeze(0)
                for x, a, b in ((query, q0, q1), (key, k0, k1), (value, k0, k1))
            )
            out[q0:q1] = self._sdpa(q, k, v, attn_mask=None, is_causal=causal and q1 - q0 > 1)[0].permute(1, 0, 2)
        return out.reshape(out.size(0), -1)

    def _one_call(self, query: Tensor) -> bool:
        # Dropout is not part of the varlen kernels' calls: training with attention dropout loops.
        if self.attention_impl == "loop" or (self.training and self.dropout_p > 0.0):
            return False
        return self.attention_impl == "varlen" or (query.is_cuda and flash_runs(query.dtype))

    def _varlen_forward(self, query: Tensor, key: Tensor, value: Tensor, cu_q: Tensor, cu_kv: Tensor,
                        causal: bool) -> Tensor:
        """Every packed sequence in one call: [t, h, d] -> [t, h * d]; rows past the last sequence are 0."""
        # One host read of the boundaries (the kernels take the longest length as an int).
        bounds_q = cu_q.tolist()
        bounds_kv = bounds_q if cu_kv is cu_q else cu_kv.tolist()
        max_q = max((b - a for a, b in zip(bounds_q, bounds_q[1:])), default=0)
        max_kv = max((b - a for a, b in zip(bounds_kv, bounds_kv[1:])), default=0)
        end_q, end_kv = bounds_q[-1], bounds_kv[-1]
        kernel = flash_varlen() if query.is_cuda and flash_runs(query.dtype) else None
        if kernel is not None:
            fn = kernel[1]
            cu_q, cu_kv = cu_q.to(torch.int32), cu_kv.to(torch.int32)
            # Flash kernels want dense [t, h, d] rows; q/k/v are views into the fused QKV output.
            query, key, value = query.contiguous(), key.contiguous(), value.contiguous()
        else:
            fn = masked_varlen
        out = fn(query[:end_q], key[:end_kv], value[:end_kv], cu_q, cu_kv, max_q, max_kv, self.softmax_scale,
                 causal)
        if end_q < query.size(0):
            out = torch.cat([out, out.new_zeros(query.size(0) - end_q, *out.shape[1:])])
        return out.reshape(out.size(0), -1)

    def _sdpa(self, q: Tensor, k: Tensor, v: Tensor, attn_mask: Optional[Tensor], is_causal: bool) -> Tensor:
        return F.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=attn_mask,
            dropout_p=self.dropout_p if self.training else 0.0,
            is_causal=is_causal,
            scale=self.softmax_scale,
            enable_gqa=self.num_heads_per_partition != self.num_groups_per_partition,
        )


def gpt_layer_spec(qk_layernorm: bool, use_sdpa: bool, attention_impl: AttentionImpl = "auto") -> ModuleSpec:
    """The local (non-TransformerEngine) GPT layer spec with RMSNorm (`TorchNorm`: usable under
    sequence parallelism), SDPA core attention optional (``attention_impl``: how it attends packed
    sequences)."""
    spec = get_gpt_layer_local_spec(qk_layernorm=qk_layernorm, normalization="RMSNorm")
    use_torch_norm(spec)
    if use_sdpa:
        _use_sdpa(spec, attention_impl)
    return spec


def gpt_model_spec(config: TransformerConfig, use_sdpa: bool,
                   attention_impl: AttentionImpl = "auto") -> TransformerBlockSubmodules:
    """The block spec of this pipeline stage's layers: the dense layer spec, or for an MoE model
    (``num_moe_experts``) dense or MoE layers after ``moe_layer_freq``; the final norm a `TorchNorm`
    (megatron-core's block would pick ``WrappedTorchNorm``, which refuses sequence parallelism)."""
    if not config.num_moe_experts:
        layer = gpt_layer_spec(config.qk_layernorm, use_sdpa, attention_impl)
        # What megatron-core's block builds from one layer spec (_get_block_submodules).
        return TransformerBlockSubmodules(layer_specs=[layer] * get_num_layers_to_build(config), layer_norm=TorchNorm)
    block = get_gpt_decoder_block_spec(config, use_transformer_engine=False, normalization="RMSNorm")
    for spec in block.layer_specs:
        use_torch_norm(spec)
        if use_sdpa:
            _use_sdpa(spec, attention_impl)
    block.layer_norm = TorchNorm
    return block


def _use_sdpa(spec: ModuleSpec, attention_impl: AttentionImpl) -> None:
    spec.submodules.self_attention.submodules.core_attention = ModuleSpec(
        module=SDPAttention, params={"attention_impl": attention_impl})
