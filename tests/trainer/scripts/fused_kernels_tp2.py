"""The chunked logprob head and one-call packed attention equal the paths they replace when the
vocab and the attention heads are split over TP=2 ranks (gloo).

``run_checks`` runs inside a torchrun of 2 ranks (train_step_smoke.py calls it after its own runs,
so the suite pays for one launch); alone: ``torchrun --nproc-per-node 2 fused_kernels_tp2.py``.
Rank 0 writes {"chunked_head": bool, "model_head": bool, "attention_heads_split": bool}.
"""

import argparse
import json

import torch
import torch.distributed as dist
from megatron.core import parallel_state
from megatron.core.packed_seq_params import PackedSeqParams
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.transformer_config import TransformerConfig

from actors.megatron.attention import SDPAttention
from actors.megatron.cpu_compat import apply_cpu_compat
from actors.megatron.parallel import init_model_parallel
from actors.megatron.rank import response_positions
from actors.trainer.fused_logprobs import (
    chunked_vocab_parallel_logprobs,
    head_weight,
    response_token_stats,
    return_hidden_states,
)
from actors.trainer.logprobs import vocab_parallel_logprobs


def close(a: torch.Tensor, b: torch.Tensor, tol: float = 1e-5) -> bool:
    return bool(torch.allclose(a.double(), b.double(), atol=tol, rtol=tol))


def chunked_head(rank: int) -> bool:
    """Function level: each rank holds half of a 24-row vocab (21 real rows), same tokens."""
    gen = torch.Generator().manual_seed(0)
    n, h, v, hf_vocab = 9, 8, 24, 21
    hidden = torch.randn(n, h, generator=gen, dtype=torch.float64)
    weight = torch.randn(v, h, generator=gen, dtype=torch.float64)
    targets = torch.randint(0, hf_vocab, (n,), generator=gen)
    g_lp, g_ent = torch.randn(n, generator=gen, dtype=torch.float64), torch.randn(n, generator=gen, dtype=torch.float64)
    shard = slice(rank * v // 2, (rank + 1) * v // 2)
    out = []
    for chunked in (False, True):
        x, w = hidden.clone().requires_grad_(), weight[shard].clone().requires_grad_()
        if chunked:
            lp, ent = chunked_vocab_parallel_logprobs(x, w, targets, hf_vocab_size=hf_vocab, temperature=0.6,
                                                      chunk_size=4)
        else:
            from megatron.core.tensor_parallel.mappings import copy_to_tensor_model_parallel_region
            logits = copy_to_tensor_model_parallel_region(x) @ w.t()
            lp, ent = vocab_parallel_logprobs(logits, targets, hf_vocab_size=hf_vocab, temperature=0.6)
        ((lp * g_lp).sum() + (ent * g_ent).sum()).backward()
        out.append((lp.detach(), ent.detach(), x.grad, w.grad))
    # And the single-process full-vocab reference: the TP result must not depend on TP.
    x, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    logits = (x @ w.t()).double() / 0.6
    logits[:, hf_vocab:] = float("-inf")
    logp = logits.log_softmax(-1)
    lp_ref = logp.gather(1, targets[:, None]).squeeze(1)
    ent_ref = -(logp.exp() * torch.where(torch.isfinite(logp), logp, torch.zeros_like(logp))).sum(-1)
    ((lp_ref * g_lp).sum() + (ent_ref * g_ent).sum()).backward()
    return (all(close(a, b) for a, b in zip(out[0], out[1]))
            and close(out[1][0], lp_ref.detach()) and close(out[1][1], ent_ref.detach())
            and close(out[1][2], x.grad) and close(out[1][3], w.grad[shard]))


def model_head(hf_dir: str) -> bool:
    """Model level: tied embeddings, a vocab TP must pad (127 -> 128), logprobs and every grad."""
    from actors.megatron.model import build_gpt_model

    full = build_gpt_model(hf_dir, {}, load_weights=True)
    hidden_model = build_gpt_model(hf_dir, {}, load_weights=True)
    return_hidden_states(hidden_model)
    gen = torch.Generator().manual_seed(2)
    tokens = torch.randint(0, 120, (2, 9), generator=gen)
    position_ids = torch.arange(9)[None].expand(2, 9)
    positions, valid = response_positions(torch.tensor([3, 5]), torch.tensor([6, 3]), 6)
    targets = tokens.gather(1, (positions + 1).clamp(max=8))
    logits = full(tokens, position_ids, None)
    picked = logits.gather(1, positions.unsqueeze(-1).expand(-1, -1, logits.size(-1)))
    lp_full, ent_full = vocab_parallel_logprobs(picked, targets, hf_vocab_size=full.hf_vocab_size)
    flat = torch.arange(2)[:, None] * 9 + positions
    lp, ent = response_token_stats(hidden_model(tokens, position_ids, None), head_weight(hidden_model), flat,
                                   valid, targets, hf_vocab_size=hidden_model.hf_vocab_size, temperature=1.0,
                                   chunk_size=3)
    ((lp_full * valid).sum() + 0.1 * (ent_full * valid).sum()).backward()
    ((lp * valid).sum() + 0.1 * (ent * valid).sum()).backward()
    ok = close(lp[valid], lp_full[valid]) and close(ent[valid], ent_full[valid])
    for (_, a), (_, b) in zip(full.named_parameters(), hidden_model.named_parameters()):
        ok = ok and close(a.grad, b.grad, 1e-4)
    return ok


def attention_heads_split() -> bool:
    """8 heads, 4 groups over TP=2: 4 heads and 2 groups per rank, GQA, padding rows."""
    config = TransformerConfig(num_layers=1, hidden_size=64, num_attention_heads=8, num_query_groups=4,
                               kv_channels=8, use_cpu_initialization=True, attention_dropout=0.0,
                               tensor_model_parallel_size=2)
    def attention(impl):
        return SDPAttention(config=config, layer_number=1, attn_mask_type=AttnMaskType.causal,
                            attention_type="self", attention_impl=impl).eval()
    loop, one = attention("loop"), attention("varlen")
    assert loop.num_heads_per_partition == 4 and loop.num_groups_per_partition == 2
    cu = torch.tensor([0, 4, 6, 13], dtype=torch.int32)
    cu_padded = torch.tensor([0, 4, 8, 16], dtype=torch.int32)
    params = PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu, cu_seqlens_q_padded=cu_padded,
                             cu_seqlens_kv_padded=cu_padded, max_seqlen_q=8, max_seqlen_kv=8)
    gen = torch.Generator().manual_seed(10 + parallel_state.get_tensor_model_parallel_rank())
    q = torch.randn(18, 4, 8, generator=gen)
    k, v = (torch.randn(18, 2, 8, generator=gen) for _ in range(2))
    a = loop(q, k, v, attention_mask=None, packed_seq_params=params)
    b = one(q, k, v, attention_mask=None, packed_seq_params=params)
    return a.shape == (18, 32) and close(a, b)


def run_checks(hf_dir: str) -> dict[str, bool] | None:
    """Every check at TP=2, agreed over both ranks: the verdicts on rank 0, None elsewhere."""
    init_model_parallel(tensor_parallel_size=2)
    apply_cpu_compat()
    rank = dist.get_rank()
    checks = {"chunked_head": chunked_head(rank), "model_head": model_head(hf_dir),
              "attention_heads_split": attention_heads_split()}
    verdicts = [None, None]
    dist.all_gather_object(verdicts, checks)
    parallel_state.destroy_model_parallel()
    return {key: all(v[key] for v in verdicts) for key in checks} if rank == 0 else None


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--hf-dir", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    merged = run_checks(args.hf_dir)
    if merged is not None:
        with open(args.out, "w") as f:
            json.dump(merged, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
