"""Per-token logprobs and entropy straight from hidden states, chunk by chunk: the
``[tokens x vocab]`` logits are never materialised whole, neither in the forward nor in the
backward.

``chunked_vocab_parallel_logprobs`` equals ``vocab_parallel_logprobs(hidden @ weight.T, ...)``
(same semantics: log-softmax of ``logits / temperature`` at the target, padded vocab rows
masked, TP-sharded vocab reduced across the TP group). A chunk of tokens has its logits
computed, reduced to (log Z, logprob, entropy) and freed; the backward recomputes each chunk's
logits from the saved hidden states and weight (one extra head matmul per chunk, instead of
keeping ``[tokens x vocab]`` fp32 activations alive until the backward).

Gradients, with s = logits / T, p = softmax(s), log p = s - log Z (both over the whole vocab):
    d logprob / d s_j = 1[j = target] - p_j
    d entropy / d s_j = -p_j (log p_j + H)
Every factor that involves the whole vocab (log Z, H) is an all-reduced, replicated value, so
each TP rank's gradient for its own vocab slice is exact; the hidden-state gradient is a sum of
the slices' contributions, all-reduced by ``copy_to_tensor_model_parallel_region``'s backward
exactly as for Megatron's column-parallel output layer.

liger-kernel's fused linear cross-entropy (Triton) was considered: it returns the per-token
loss (the negated target logprob) but not the entropy, and knows nothing of a vocab sharded
over TP ranks, so it cannot replace this on its own.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from megatron.core import parallel_state
from megatron.core.tensor_parallel.mappings import copy_to_tensor_model_parallel_region

from actors.megatron.sequence_parallel import whole_sequence

# Elements of one fp32 logits chunk when --log-probs-chunk-size is not set: 2^26 floats are
# 256 MiB, a few of which (logits, exp, gradient) are alive at once per chunk.
DEFAULT_CHUNK_ELEMENTS = 1 << 26


def chunk_tokens_for(vocab_local: int, chunk_size: int | None) -> int:
    """Tokens per chunk: ``chunk_size`` when given (> 0), else an fp32 element budget."""
    if chunk_size is not None and chunk_size > 0:
        return chunk_size
    return max(1, DEFAULT_CHUNK_ELEMENTS // max(vocab_local, 1))


class _TPContext:
    """This rank's vocab slice and the TP group the softmax statistics are reduced over."""

    def __init__(self, vocab_local: int, hf_vocab_size: int):
        self.size = parallel_state.get_tensor_model_parallel_world_size()
        self.group = parallel_state.get_tensor_model_parallel_group() if self.size > 1 else None
        self.start = parallel_state.get_tensor_model_parallel_rank() * vocab_local
        self.vocab_local = vocab_local
        # Vocab rows at or beyond the HF vocab are TP padding: masked out of every softmax.
        self.pad_from = max(0, min(vocab_local, hf_vocab_size - self.start))

    def all_reduce(self, tensor: torch.Tensor, op: Any = dist.ReduceOp.SUM) -> torch.Tensor:
        if self.group is not None:
            dist.all_reduce(tensor, op=op, group=self.group)
        return tensor


def _chunk_logits(h: torch.Tensor, weight: torch.Tensor, temperature: float, tp: _TPContext) -> torch.Tensor:
    """fp32 ``s = (h @ W.T) / T`` of one chunk, padded vocab rows at -inf.

    The matmul runs in the weight's dtype, like the output layer it replaces, then is upcast:
    the numbers are those of today's path (bf16 logits, then ``.float()``).
    """
    logits = torch.matmul(h, weight.t()).float()
    if temperature != 1.0:
        logits = logits / temperature
    if tp.pad_from < tp.vocab_local:
        logits[:, tp.pad_from:] = float("-inf")
    return logits


def _entropy_term(p: torch.Tensor, logp: torch.Tensor, entropy: torch.Tensor, tp: _TPContext) -> torch.Tensor:
    """d entropy / d logits of one chunk ``[chunk, V_local]``, up to the incoming gradient."""
    term = p * (logp + entropy[:, None])
    if tp.pad_from < tp.vocab_local:
        term[:, tp.pad_from:] = 0.0  # 0 · -inf there: no probability, no gradient
    return term


class _ChunkedLogprobs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, hf_vocab_size: int,
                temperature: float, chunk: int, with_entropy: bool):
        tp = _TPContext(weight.size(0), hf_vocab_size)
        n = hidden.size(0)
        logprobs = torch.empty(n, dtype=torch.float32, device=hidden.device)
        entropy = torch.empty(n, dtype=torch.float32, device=hidden.device)
        log_z = torch.empty(n, dtype=torch.float32, device=hidden.device)
        local_targets = targets - tp.start
        is_local = (local_targets >= 0) & (local_targets < tp.vocab_local)
        index = local_targets.clamp(0, tp.vocab_local - 1)
        for a in range(0, n, chunk):
            b = min(n, a + chunk)
            s = _chunk_logits(hidden[a:b], weight, temperature, tp)
            # The max is only a shift that keeps exp() finite; any common value would do.
            shift = tp.all_reduce(s.max(dim=-1).values, dist.ReduceOp.MAX)
            s = s - shift[:, None]
            e = s.exp()
            picked = s.gather(1, index[a:b, None]).squeeze(1)
            stats = torch.stack([
                e.sum(dim=-1),
                torch.where(is_local[a:b], picked, torch.zeros_like(picked)),
                # Σ e^s · s over finite s (padding rows are -inf, with e^s = 0).
                (e * torch.where(torch.isfinite(s), s, torch.zeros_like(s))).sum(dim=-1) if with_entropy
                else torch.zeros_like(picked),
            ])
            sum_exp, picked_sum, weighted = tp.all_reduce(stats)  # one collective for the three sums
            del s, e
            lz = sum_exp.log()
            log_z[a:b] = lz + shift
            logprobs[a:b] = picked_sum - lz
            entropy[a:b] = lz - weighted / sum_exp
        ctx.save_for_backward(hidden, weight, targets, log_z, entropy)
        ctx.hf_vocab_size, ctx.temperature, ctx.chunk = hf_vocab_size, temperature, chunk
        # An output the loss does not use reaches backward as None, not as zeros: the [chunk x V]
        # entropy term is then skipped (autograd would otherwise hand in materialised zeros).
        ctx.set_materialize_grads(False)
        return logprobs, entropy if with_entropy else entropy.zero_()

    @staticmethod
    def backward(ctx, grad_logprobs: torch.Tensor | None, grad_entropy: torch.Tensor | None):
        hidden, weight, targets, log_z, entropy = ctx.saved_tensors
        tp = _TPContext(weight.size(0), ctx.hf_vocab_size)
        want_h, want_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        grad_h = torch.zeros_like(hidden) if want_h else None
        # fp32 accumulation over chunks, cast to the weight's dtype once at the end.
        grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if want_w else None
        local_targets = targets - tp.start
        is_local = (local_targets >= 0) & (local_targets < tp.vocab_local)
        index = local_targets.clamp(0, tp.vocab_local - 1)
        n = hidden.size(0)
        for a in range(0, n, ctx.chunk):
            b = min(n, a + ctx.chunk)
            logp = _chunk_logits(hidden[a:b], weight, ctx.temperature, tp) - log_z[a:b, None]
            p = logp.exp()
            grad_s = torch.zeros_like(p)
            if grad_logprobs is not None:
                g = grad_logprobs[a:b]
                grad_s -= p * g[:, None]
                # The target's one-hot term lives on the rank holding the target's vocab row
                # (a scatter, not a boolean index: no host sync per chunk).
                grad_s.scatter_add_(1, index[a:b, None], torch.where(is_local[a:b], g, torch.zeros_like(g))[:, None])
            if grad_entropy is not None:
                grad_s -= _entropy_term(p, logp, entropy[a:b], tp) * grad_entropy[a:b, None]
            del p, logp
            if ctx.temperature != 1.0:
                grad_s = grad_s / ctx.temperature
            grad_s = grad_s.to(weight.dtype)
            if want_h:
                grad_h[a:b] = torch.matmul(grad_s, weight)
            if want_w:
                grad_w += torch.matmul(grad_s.t(), hidden[a:b]).float()
        return (grad_h, grad_w.to(weight.dtype) if want_w else None, None, None, None, None, None)


def chunked_vocab_parallel_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    *,
    hf_vocab_size: int,
    temperature: float = 1.0,
    with_entropy: bool = True,
    chunk_size: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log p(target) and entropy of ``hidden`` ``[N, H]`` under this TP rank's head slice
    ``weight`` ``[V_local, H]``; ``targets`` ``[N]`` are global token ids.

    Returns fp32 ``[N]`` tensors, differentiable with respect to ``hidden`` and ``weight``.
    ``chunk_size``: tokens per chunk (None or <= 0: an element budget per chunk). Within a TP
    group every rank must call this with the same tokens (the statistics are all-reduced).
    """
    if hidden.dim() != 2 or targets.shape != hidden.shape[:1]:
        raise ValueError(f"chunked logprobs: hidden must be [N, H] and targets [N], got {tuple(hidden.shape)} "
                         f"and {tuple(targets.shape)}")
    # Forward identity, backward all-reduce over TP: what the column-parallel output layer does
    # to its input, so the hidden-state gradient sums every vocab slice's share.
    hidden = copy_to_tensor_model_parallel_region(hidden)
    chunk = chunk_tokens_for(weight.size(0), chunk_size)
    logprobs, entropy = _ChunkedLogprobs.apply(
        hidden, weight, targets, hf_vocab_size, temperature, chunk, with_entropy
    )
    return logprobs, (entropy if with_entropy else None)


def _hidden_states_passthrough(hidden_states: torch.Tensor, weight: torch.Tensor | None = None,
                               runtime_gather_output: Any = None) -> tuple[torch.Tensor, None]:
    return hidden_states, None


def _whole_hidden_states(hidden_states: torch.Tensor, weight: torch.Tensor | None = None,
                         runtime_gather_output: Any = None) -> tuple[torch.Tensor, None]:
    # Sequence parallelism: the final norm's output is this rank's slice of the sequence. The head's
    # hidden-state gradient is all-reduced over TP (copy_to_tensor_model_parallel_region above), so
    # the gather's backward only keeps this rank's slice of it.
    return whole_sequence(hidden_states), None


def return_hidden_states(model: torch.nn.Module) -> None:
    """Make this (last-stage) GPTModel return its final hidden states ``[B, S, H]`` instead of
    logits: the head is then applied chunk by chunk by ``chunked_vocab_parallel_logprobs``.

    Only the output layer's forward is replaced, on this instance: the layer itself (its weight,
    parameter names, TP attributes and sharded-checkpoint layout) stays where it was, so
    checkpoints, HF export and weight sync see the model they saw before. Under sequence
    parallelism the hidden states are gathered over TP first, as the output layer gathers them.
    """
    layer = model.output_layer
    if getattr(layer, "bias", None) is not None:
        raise ValueError("the chunked logprob head supports an output layer without bias only")
    layer.forward = _whole_hidden_states if layer.sequence_parallel else _hidden_states_passthrough


def head_weight(model: torch.nn.Module) -> torch.Tensor:
    """The output projection ``[V_local, H]`` of this (last-stage) GPTModel rank."""
    if getattr(model, "share_embeddings_and_output_weights", False):
        return model.shared_embedding_or_output_weight()
    return model.output_layer.weight


def response_token_stats(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    flat_positions: torch.Tensor,
    valid: torch.Tensor,
    targets: torch.Tensor,
    *,
    hf_vocab_size: int,
    temperature: float,
    chunk_size: int | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(logprobs, entropy) ``[B, T]`` of the response tokens from the model's hidden states
    (``[B, S, H]`` padded or ``[1, total, H]`` packed): ``flat_positions`` ``[B, T]`` index the
    rows of ``hidden`` flattened to ``[-1, H]``. Only the ``valid`` entries go through the head;
    the others are 0 (they are loss-masked and never reported)."""
    rows = hidden.reshape(-1, hidden.size(-1))[flat_positions]  # [B, T, H]
    logprobs, entropy = chunked_vocab_parallel_logprobs(
        rows[valid], weight, targets[valid], hf_vocab_size=hf_vocab_size, temperature=temperature,
        chunk_size=chunk_size,
    )
    shape = flat_positions.shape
    full_lp = logprobs.new_zeros(shape).masked_scatter(valid, logprobs)
    full_ent = entropy.new_zeros(shape).masked_scatter(valid, entropy)
    return full_lp, full_ent
