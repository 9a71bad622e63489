"""The trainer's fast paths equal the paths they replace: the chunked logprob head (logprobs,
entropy and gradients, from hidden states, never the whole [tokens x vocab] logits) and packed
attention in one call (GQA, padding rows, empty sequences), at TP=1 here and TP=2 under torchrun."""

from __future__ import annotations

import pytest
import torch
from megatron.core.packed_seq_params import PackedSeqParams
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.transformer_config import TransformerConfig

from actors.megatron.attention import SDPAttention
from actors.megatron.config import TrainerConfig
from actors.megatron.rank import response_positions
from actors.megatron.varlen import describe_attention
from actors.trainer.fused_logprobs import (
    chunk_tokens_for,
    chunked_vocab_parallel_logprobs,
    head_weight,
    response_token_stats,
    return_hidden_states,
)
from actors.trainer.kernels import resolve_kernels
from actors.trainer.logprobs import vocab_parallel_logprobs


pytestmark = pytest.mark.usefixtures("single_rank_megatron")


def _reference(hidden, weight, targets, hf_vocab, temperature):
    logits = hidden @ weight.t()
    return vocab_parallel_logprobs(logits, targets, hf_vocab_size=hf_vocab, temperature=temperature)


@pytest.mark.parametrize("chunk_size", [3, None])
def test_chunked_head_equals_full_logits_in_values_and_gradients(chunk_size):
    gen = torch.Generator().manual_seed(0)
    n, h, v, hf_vocab, temperature = 10, 16, 24, 21, 0.7  # 3 padded vocab rows, 4 chunks of 3
    hidden = torch.randn(n, h, generator=gen, dtype=torch.float64) * 2
    weight = torch.randn(v, h, generator=gen, dtype=torch.float64)
    targets = torch.randint(0, hf_vocab, (n,), generator=gen)
    g_lp, g_ent = torch.randn(n, generator=gen, dtype=torch.float64), torch.randn(n, generator=gen, dtype=torch.float64)
    results = []
    for fn in (_reference, lambda *a: chunked_vocab_parallel_logprobs(
            *a[:3], hf_vocab_size=a[3], temperature=a[4], chunk_size=chunk_size)):
        x, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
        lp, ent = fn(x, w, targets, hf_vocab, temperature)
        ((lp * g_lp).sum() + (ent * g_ent).sum()).backward()
        results.append((lp.detach(), ent.detach(), x.grad, w.grad))
    for expected, actual, name in zip(results[0], results[1], ("logprobs", "entropy", "d/d hidden", "d/d weight")):
        torch.testing.assert_close(actual.double(), expected.double(), atol=1e-5, rtol=1e-5, msg=name)
    # Padded vocab rows get no gradient at all.
    assert torch.all(results[1][3][hf_vocab:] == 0)


def test_chunked_head_without_entropy_gradient_matches_the_logprob_only_gradient():
    gen = torch.Generator().manual_seed(1)
    hidden = torch.randn(7, 8, generator=gen)
    weight = torch.randn(12, 8, generator=gen)
    targets = torch.randint(0, 12, (7,), generator=gen)
    grads = []
    for chunked in (False, True):
        x = hidden.clone().requires_grad_()
        if chunked:
            lp, _ = chunked_vocab_parallel_logprobs(x, weight, targets, hf_vocab_size=12, chunk_size=2)
        else:
            lp, _ = _reference(x, weight, targets, 12, 1.0)
        lp.sum().backward()
        grads.append(x.grad)
    torch.testing.assert_close(grads[1], grads[0], atol=1e-5, rtol=1e-5)


def test_the_entropy_backward_runs_only_when_the_loss_uses_the_entropy(monkeypatch):
    import actors.trainer.fused_logprobs as fused

    calls = []
    real = fused._entropy_term
    monkeypatch.setattr(fused, "_entropy_term", lambda *a: calls.append(1) or real(*a))
    gen = torch.Generator().manual_seed(2)
    hidden, weight = torch.randn(6, 8, generator=gen), torch.randn(12, 8, generator=gen)
    targets = torch.randint(0, 12, (6,), generator=gen)
    for use_entropy in (False, True):
        calls.clear()
        x = hidden.clone().requires_grad_()
        lp, ent = chunked_vocab_parallel_logprobs(x, weight, targets, hf_vocab_size=12, chunk_size=2)
        (lp.sum() + (ent.sum() if use_entropy else 0)).backward()
        assert len(calls) == (3 if use_entropy else 0), use_entropy  # one per chunk of 2 tokens


def test_chunk_size_defaults_to_an_element_budget():
    assert chunk_tokens_for(151936, 512) == 512
    assert chunk_tokens_for(151936, None) == (1 << 26) // 151936 == 441
    assert chunk_tokens_for(1 << 30, -1) == 1


@pytest.mark.parametrize("arch", ["qwen2", "llama"])  # tied embeddings (vocab 127) / an untied head
def test_the_model_returning_hidden_states_gives_the_full_paths_logprobs_and_gradients(tiny_hf_dirs, arch):
    from actors.megatron.model import build_gpt_model

    full = build_gpt_model(tiny_hf_dirs[arch], {}, load_weights=True)
    hidden = build_gpt_model(tiny_hf_dirs[arch], {}, load_weights=True)
    return_hidden_states(hidden)
    gen = torch.Generator().manual_seed(2)
    tokens = torch.randint(0, 120, (2, 9), generator=gen)
    positions_ids = torch.arange(9)[None].expand(2, 9)
    plen, rlen = torch.tensor([3, 5]), torch.tensor([6, 3])
    positions, valid = response_positions(plen, rlen, 6)
    targets = tokens.gather(1, (positions + 1).clamp(max=8))
    out_full = full(tokens, positions_ids, None)
    picked = out_full.gather(1, positions.unsqueeze(-1).expand(-1, -1, out_full.size(-1)))
    lp_full, ent_full = vocab_parallel_logprobs(picked, targets, hf_vocab_size=full.hf_vocab_size, temperature=0.8)
    out_hidden = hidden(tokens, positions_ids, None)
    assert out_hidden.shape == (2, 9, hidden.config.hidden_size)
    flat = torch.arange(2)[:, None] * 9 + positions
    lp, ent = response_token_stats(out_hidden, head_weight(hidden), flat, valid, targets,
                                   hf_vocab_size=hidden.hf_vocab_size, temperature=0.8, chunk_size=4)
    torch.testing.assert_close(lp[valid], lp_full[valid], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ent[valid], ent_full[valid], atol=1e-5, rtol=1e-5)
    ((lp_full * valid).sum() + 0.1 * (ent_full * valid).sum()).backward()
    ((lp * valid).sum() + 0.1 * (ent * valid).sum()).backward()
    assert [n for n, _ in full.named_parameters()] == [n for n, _ in hidden.named_parameters()]
    for (name, p_full), (_, p) in zip(full.named_parameters(), hidden.named_parameters()):
        torch.testing.assert_close(p.grad, p_full.grad, atol=1e-4, rtol=1e-4, msg=name)


# ----- packed attention in one call ------------------------------------------------------------

HEADS, GROUPS, HEAD_DIM = 4, 2, 8


def _attention(impl: str) -> SDPAttention:
    config = TransformerConfig(num_layers=1, hidden_size=HEADS * HEAD_DIM, num_attention_heads=HEADS,
                               num_query_groups=GROUPS, kv_channels=HEAD_DIM, use_cpu_initialization=True,
                               attention_dropout=0.0)
    return SDPAttention(config=config, layer_number=1, attn_mask_type=AttnMaskType.causal,
                        attention_type="self", attention_impl=impl).eval()


@pytest.mark.parametrize("padded", [False, True])
def test_packed_attention_in_one_call_equals_the_per_sequence_loop(padded):
    lengths = [3, 5, 0, 1, 4]
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    extra = {}
    total = int(cu[-1])
    if padded:
        # Each sequence padded to a multiple of 4 (Megatron's padded boundaries), plus 3 trailing rows.
        padded_lengths = [(n + 3) // 4 * 4 for n in lengths]
        cu_padded = torch.tensor([0, *torch.tensor(padded_lengths).cumsum(0).tolist()], dtype=torch.int32)
        extra = dict(cu_seqlens_q_padded=cu_padded, cu_seqlens_kv_padded=cu_padded)
        total = int(cu_padded[-1]) + 3
    params = PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=5,
                             max_seqlen_kv=5, **extra)
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(total, HEADS, HEAD_DIM, generator=gen)
    k, v = (torch.randn(total, GROUPS, HEAD_DIM, generator=gen) for _ in range(2))
    loop = _attention("loop")(q, k, v, attention_mask=None, packed_seq_params=params)
    one_call = _attention("varlen")
    assert one_call._one_call(q)  # the one-call path runs, not the loop again
    one = one_call(q, k, v, attention_mask=None, packed_seq_params=params)
    assert one.shape == loop.shape == (total, HEADS * HEAD_DIM)
    torch.testing.assert_close(one, loop, atol=1e-5, rtol=0)
    if padded:
        assert torch.all(one[-3:] == 0)


def _trainer_ops(hf_dir, **kernels):
    from actors.trainer.ops import TrainerOps

    config = TrainerConfig(hf_checkpoint=str(hf_dir), max_tokens_per_gpu=64, use_sdpa=True,
                           megatron={"lr": 1e-2, "clip_grad": 0.0}, **kernels).validate()
    return TrainerOps(config)


def _varied_batch():
    from slime_async.batch import Batch

    gen = torch.Generator().manual_seed(5)
    lengths, responses = [9, 4, 13, 6, 11], [5, 2, 7, 1, 6]
    return Batch(
        tokens=[torch.randint(2, 120, (n,), generator=gen).tolist() for n in lengths],
        response_lengths=responses,
        loss_masks=[[1] * r for r in responses],
        advantages=[[1.0 if i % 2 else -1.0] * r for i, r in enumerate(responses)],
        temperature=0.9,
    )


def test_trainer_packed_and_chunked_equals_padded_and_full_logits_before_and_after_a_step(tiny_hf_dirs):
    """The whole TrainerOps: packed micro-batches (one-call attention) + the chunked head vs the
    right-padded, full-logits path, on samples of different lengths: logprobs, entropy, the
    step's loss and grad norm, and the logprobs after the update."""
    from policies.algorithm import AlgorithmConfig

    batch = _varied_batch()
    spec = AlgorithmConfig(entropy_coef=0.01)
    results = []
    for kernels in (dict(attention_impl="loop", logprob_impl="full"),
                    dict(attention_impl="varlen", logprob_impl="chunked", log_probs_chunk_size=4)):
        ops = _trainer_ops(tiny_hf_dirs["qwen2"], **kernels)
        assert ops.kernels.pack_sequences == (kernels["attention_impl"] == "varlen")
        before = ops.compute_logprobs(batch)
        metrics = ops.train_step(batch, spec, batch.normalizer(spec.loss_agg))
        after = ops.compute_logprobs(batch)
        results.append((before, metrics, after))
    (before_a, metrics_a, after_a), (before_b, metrics_b, after_b) = results
    for rows_a, rows_b in ((before_a, before_b), (after_a, after_b)):
        for a, b in zip(rows_a, rows_b):
            torch.testing.assert_close(torch.tensor(b.logprobs), torch.tensor(a.logprobs), atol=1e-4, rtol=1e-4)
            torch.testing.assert_close(torch.tensor(b.entropy), torch.tensor(a.entropy), atol=1e-4, rtol=1e-4)
    assert metrics_a["num_micro_batches"] > 1  # the budget splits the batch: several packed rows
    for key in ("loss", "grad_norm"):
        assert metrics_b[key] == pytest.approx(metrics_a[key], rel=1e-4, abs=1e-6), key
    assert not torch.allclose(torch.tensor(after_a[0].logprobs), torch.tensor(before_a[0].logprobs))


def test_auto_keeps_padded_micro_batches_and_full_logits_and_the_choice_is_described():
    assert describe_attention("auto", torch.float32) == "per-sequence SDPA loop"
    assert describe_attention("loop", torch.bfloat16) == "per-sequence SDPA loop"
    if not torch.cuda.is_available():
        assert "block-diagonal" in describe_attention("varlen", torch.bfloat16)
    # auto keeps the paths an H200 measured fastest (right-padded, full logits).
    assert not resolve_kernels("auto", "auto", -1).chunked_logprobs
    assert resolve_kernels("auto", "chunked", -1).chunked_logprobs
    assert resolve_kernels("loop", "chunked", 256).chunk_size == 256
    # Packing is asked for (varlen), and needs SDPA and one pipeline stage.
    assert not resolve_kernels("auto", "auto", -1, use_sdpa=True).pack_sequences
    assert resolve_kernels("varlen", "auto", -1, use_sdpa=True).pack_sequences
    assert not resolve_kernels("varlen", "auto", -1, use_sdpa=True, pipeline_parallel=2).pack_sequences
    assert not resolve_kernels("varlen", "auto", -1, use_sdpa=False).pack_sequences


@pytest.mark.parametrize("field, value, flag", [("logprob_impl", "fast", "--logprob-impl"),
                                                ("attention_impl", "flex", "--attention-impl"),
                                                ("log_probs_chunk_size", 0, "--log-probs-chunk-size")])
def test_a_bad_kernel_choice_is_refused_naming_the_flag(field, value, flag):
    with pytest.raises(ValueError, match=flag):
        TrainerConfig(hf_checkpoint="unused", **{field: value}).validate()


@pytest.mark.timeout(300)
def test_tp2_chunked_head_and_one_call_attention_equal_the_paths_they_replace(tp2_smoke):
    # Run in the same torchrun as test_cpu_compat's TP=2 smoke steps (tests/trainer/conftest.py).
    assert tp2_smoke["kernels"] == {"chunked_head": True, "model_head": True, "attention_heads_split": True}
