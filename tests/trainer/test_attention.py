"""SDPA core attention: same numbers as megatron-core's unfused local attention, and packed
sequences never attend across their boundaries."""

from __future__ import annotations

import pytest
import torch
from megatron.core.packed_seq_params import PackedSeqParams
from megatron.core.transformer.dot_product_attention import DotProductAttention
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.transformer_config import TransformerConfig

from actors.megatron.attention import SDPAttention, gpt_layer_spec

HEADS, GROUPS, HEAD_DIM = 4, 2, 8


pytestmark = pytest.mark.usefixtures("single_rank_megatron")


def _config() -> TransformerConfig:
    return TransformerConfig(
        num_layers=1, hidden_size=HEADS * HEAD_DIM, num_attention_heads=HEADS,
        num_query_groups=GROUPS, kv_channels=HEAD_DIM, masked_softmax_fusion=False,
        attention_softmax_in_fp32=True, use_cpu_initialization=True, attention_dropout=0.0,
    )


def _attentions() -> tuple[DotProductAttention, SDPAttention]:
    args = dict(config=_config(), layer_number=1, attn_mask_type=AttnMaskType.causal, attention_type="self")
    return DotProductAttention(**args).eval(), SDPAttention(**args).eval()


def _qkv(seq: int, batch: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(seq, batch, HEADS, HEAD_DIM, generator=gen)
    k = torch.randn(seq, batch, GROUPS, HEAD_DIM, generator=gen)
    v = torch.randn(seq, batch, GROUPS, HEAD_DIM, generator=gen)
    return q, k, v


def test_sdpa_equals_unfused_local_attention_with_causal_gqa():
    unfused, sdpa = _attentions()
    q, k, v = _qkv(seq=11, batch=3)
    expected = unfused(q, k, v, attention_mask=None)
    actual = sdpa(q, k, v, attention_mask=None)
    assert actual.shape == expected.shape == (11, 3, HEADS * HEAD_DIM)
    torch.testing.assert_close(actual, expected, atol=1e-5, rtol=0)


def test_sdpa_equals_unfused_local_attention_with_an_explicit_padding_mask():
    unfused, sdpa = _attentions()
    q, k, v = _qkv(seq=9, batch=2, seed=1)
    # Megatron's convention: True = masked out. Causal, plus the last 3 keys of sample 1 are padding.
    mask = torch.triu(torch.ones(9, 9, dtype=torch.bool), diagonal=1).expand(2, 1, 9, 9).clone()
    mask[1, :, :, 6:] = True
    expected = unfused(q, k, v, attention_mask=mask)
    actual = sdpa(q, k, v, attention_mask=mask)
    torch.testing.assert_close(actual, expected, atol=1e-5, rtol=0)


def _packed(lengths: list[int], seed: int):
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    params = PackedSeqParams(
        qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu,
        max_seqlen_q=max(lengths), max_seqlen_kv=max(lengths),
    )
    q, k, v = _qkv(seq=sum(lengths), batch=1, seed=seed)
    return (q.squeeze(1), k.squeeze(1), v.squeeze(1)), params, cu.tolist()


def test_packed_sequences_equal_each_sequence_attended_alone():
    unfused, sdpa = _attentions()
    lengths = [3, 5, 1, 4]
    (q, k, v), params, cu = _packed(lengths, seed=2)
    packed = sdpa(q, k, v, attention_mask=None, packed_seq_params=params)
    assert packed.shape == (sum(lengths), HEADS * HEAD_DIM)
    for start, end in zip(cu, cu[1:]):
        alone = unfused(q[start:end, None], k[start:end, None], v[start:end, None], attention_mask=None)
        torch.testing.assert_close(packed[start:end], alone[:, 0], atol=1e-5, rtol=0)


def test_packed_sequence_output_ignores_the_other_sequences_entirely():
    _, sdpa = _attentions()
    (q, k, v), params, cu = _packed([4, 6], seed=3)
    before = sdpa(q, k, v, attention_mask=None, packed_seq_params=params)
    # Rewrite every key and value of sequence 0: sequence 1's outputs must not move at all.
    k2, v2 = k.clone(), v.clone()
    k2[: cu[1]] = torch.randn_like(k2[: cu[1]])
    v2[: cu[1]] = torch.randn_like(v2[: cu[1]])
    after = sdpa(q, k2, v2, attention_mask=None, packed_seq_params=params)
    assert torch.equal(after[cu[1]:], before[cu[1]:])
    assert not torch.allclose(after[: cu[1]], before[: cu[1]])


def test_gpt_layer_spec_swaps_only_the_core_attention():
    local = gpt_layer_spec(qk_layernorm=True, use_sdpa=False).submodules.self_attention.submodules
    sdpa = gpt_layer_spec(qk_layernorm=True, use_sdpa=True).submodules.self_attention.submodules
    assert local.core_attention is DotProductAttention
    assert sdpa.core_attention.module is SDPAttention
    assert sdpa.linear_qkv == local.linear_qkv and sdpa.q_layernorm == local.q_layernorm


def test_packed_batch_through_gpt_model_equals_sequences_run_separately(tiny_hf_dirs):
    from actors.megatron.model import build_gpt_model

    model = build_gpt_model(tiny_hf_dirs["qwen3"], {}, use_sdpa=True, load_weights=True).eval()
    lengths = [3, 5, 4]
    gen = torch.Generator().manual_seed(4)
    seqs = [torch.randint(0, 120, (n,), generator=gen) for n in lengths]
    cu = torch.tensor([0, 3, 8, 12], dtype=torch.int32)
    params = PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=5, max_seqlen_kv=5)
    # Positions restart at 0 in each sequence; RoPE uses cu_seqlens to do the same.
    positions = torch.cat([torch.arange(n) for n in lengths])[None]
    with torch.no_grad():
        packed = model(torch.cat(seqs)[None], positions, attention_mask=None, packed_seq_params=params)
        alone = [model(s[None], torch.arange(len(s))[None], attention_mask=None) for s in seqs]
    torch.testing.assert_close(packed, torch.cat(alone, dim=1), atol=1e-5, rtol=0)
