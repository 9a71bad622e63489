"""What every Megatron rank of a torchrun group does, whatever its model computes.

The policy's ranks (`actors.trainer.ops.TrainerOps`) and the critic's
(`actors.critic.ops.CriticOps`) differ in their head and their losses; they share the model,
DDP, optimizer and schedule set-up, discovery, micro-batching, Megatron's forward-backward
schedule, the guarded optimizer step (a non-finite loss or gradient on any rank skips it on
every rank) and checkpoints. Methods run SPMD on each rank's worker thread, one at a time.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import torch
import torch.distributed as dist
from megatron.core import parallel_state
from megatron.core.packed_seq_params import PackedSeqParams
from megatron.core.pipeline_parallel import get_forward_backward_func

from actors.megatron.bridge import unwrap_model
from actors.megatron.checkpoint import load_checkpoint, save_checkpoint
from actors.megatron.config import TrainerConfig
from actors.megatron.dp_split import split_into_micro_batches, spread_micro_batches
from actors.megatron.mb_align import ExpertAlignment, zero_loss_copy
from actors.megatron.model import build_gpt_model
from actors.megatron.optimizer import build_optimizer, has_grad_scaler, optimizer_config, wrap_ddp
from actors.megatron.options import ScheduleConfig, split_megatron_overrides
from actors.megatron.parallel import init_model_parallel
from actors.megatron.protocol import RankInfo
from actors.megatron.routing_replay import RoutingReplay, aux_loss_metrics, moe_layer_indices
from actors.megatron.sequence_parallel import round_up_shape, sequence_multiple
from slime_async.batch import Batch


def response_positions(
    prompt_lengths: torch.Tensor, response_lengths: torch.Tensor, max_response: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(logit positions, valid mask), both ``[B, max_response]``.

    Response token t of sample i sits at ``prompt_len_i + t`` and is predicted by the logits at
    ``prompt_len_i + t - 1``. Padding entries point at position 0 and are masked invalid.
    """
    t = torch.arange(max_response, device=prompt_lengths.device)
    valid = t[None, :] < response_lengths[:, None]
    positions = torch.where(valid, prompt_lengths[:, None] - 1 + t[None, :], torch.zeros_like(t)[None, :])
    return positions, valid


def pad_rows(rows: list[list[float]] | list[list[int]], width: int, dtype: torch.dtype) -> torch.Tensor:
    out = torch.zeros(len(rows), width, dtype=dtype)
    for i, row in enumerate(rows):
        if row:
            out[i, : len(row)] = torch.tensor(row, dtype=dtype)
    return out


def micro_batch_shape(batch: Batch, pack: bool) -> tuple[int, ...]:
    """The model input's shape for ``batch``: ``(total tokens,)`` packed, ``(samples, longest)`` padded."""
    return (sum(batch.lengths),) if pack else (len(batch), max(batch.lengths))


def response_tensors(batch: Batch, device: torch.device, fields: tuple[str, ...], pack: bool = False,
                     pad_to: tuple[int, ...] | None = None) -> dict[str, Any]:
    """Model inputs of one micro-batch, where each response token is scored (``positions``,
    ``valid``), its loss mask, and the ``[B, T]`` per-token ``fields`` of the batch.

    Inputs are right-padded ``[B, S]``, or with ``pack`` the samples back to back in one row
    ``[1, total]`` with positions restarting per sample and the ``thd`` ``packed_seq_params``
    (no padding at all; attended in one varlen call). ``flat_positions`` ``[B, T]`` is each
    scoring position's row in the model output flattened to ``[B * S or total, ...]``.
    ``pad_to`` (a `micro_batch_shape` at least this batch's) grows the inputs with pad tokens:
    pad rows and columns, or one pad sequence after the packed ones; ``padding_mask`` (True on
    pad tokens) has the inputs' shape.
    """
    shape = pad_to or micro_batch_shape(batch, pack)
    seq = max(batch.lengths)
    width = max(max(batch.response_lengths), 1)
    rlen = torch.tensor(batch.response_lengths, dtype=torch.long)
    plen = torch.tensor(batch.lengths, dtype=torch.long) - rlen
    positions, valid = response_positions(plen, rlen, width)
    out: dict[str, Any] = {
        "positions": positions.to(device),
        "valid": valid.to(device),
        "response_lengths": batch.response_lengths,
        "loss_mask": (pad_rows(batch.loss_masks, width, torch.float) * valid).to(device),
    }
    if pack:
        lengths = torch.tensor(batch.lengths, dtype=torch.long)
        starts = lengths.cumsum(0) - lengths
        extra = shape[0] - int(lengths.sum())
        seq_lengths = batch.lengths + ([extra] if extra else [])
        cu = torch.tensor([0, *seq_lengths], dtype=torch.long).cumsum(0).to(torch.int32).to(device)
        out["tokens"] = torch.tensor([t for row in batch.tokens for t in row] + [0] * extra, dtype=torch.long,
                                     device=device)[None]
        out["position_ids"] = torch.cat([torch.arange(n) for n in seq_lengths]).to(device)[None]
        longest = max(seq_lengths)
        out["packed_seq_params"] = PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu,
                                                   max_seqlen_q=longest, max_seqlen_kv=longest)
        out["padding_mask"] = (torch.arange(shape[0]) >= int(lengths.sum())).to(device)[None]
        flat = torch.where(valid, starts[:, None] + positions, torch.zeros_like(positions))
    else:
        rows, seq = shape
        out["tokens"] = pad_rows(batch.tokens + [[]] * (rows - len(batch)), seq, torch.long).to(device)
        out["position_ids"] = torch.arange(seq, device=device).unsqueeze(0).expand(rows, seq)
        lengths = torch.tensor(batch.lengths + [0] * (rows - len(batch)), dtype=torch.long)
        out["padding_mask"] = (torch.arange(seq)[None, :] >= lengths[:, None]).to(device)
        flat = torch.arange(len(batch))[:, None] * seq + positions
    out["flat_positions"] = flat.to(device)
    for name in fields:
        rows_of = getattr(batch, name)
        out[name] = pad_rows(rows_of, width, torch.float).to(device) if rows_of is not None else None
    return out


def grad_of(param: torch.nn.Parameter) -> torch.Tensor | None:
    # Megatron's DDP accumulates into main_grad; plain .grad otherwise.
    main = getattr(param, "main_grad", None)
    return main if main is not None else param.grad


def all_finite(tensors: list[torch.Tensor]) -> bool:
    # One device sync for all tensors, not one per tensor.
    return bool(torch.stack([torch.isfinite(t).all() for t in tensors]).all()) if tensors else True


def all_ranks_agree(ok: bool, device: torch.device) -> bool:
    """True when ``ok`` holds on every rank: a rank that alone skipped a collective would hang the rest."""
    flag = torch.tensor([0.0 if ok else 1.0], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return flag.item() == 0.0


class MegatronRank:
    """Model + DDP + optimizer + scheduler of one rank, and the operations every rank has."""

    def __init__(self, config: TrainerConfig, adapt_model: Callable[[torch.nn.Module], None] | None = None):
        self.config = config
        sections = split_megatron_overrides(config.megatron)
        init_model_parallel(
            tensor_parallel_size=sections.transformer.get("tensor_model_parallel_size", 1),
            pipeline_parallel_size=sections.transformer.get("pipeline_model_parallel_size", 1),
            seed=config.seed,
            expert_parallel_size=sections.transformer.get("expert_model_parallel_size", 1),
            expert_tensor_parallel_size=sections.transformer.get("expert_tensor_parallel_size"),
        )
        self.device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
        model = build_gpt_model(config.hf_checkpoint, sections.transformer, use_sdpa=config.use_sdpa, load_weights=True,
                                attention_impl=config.attention_impl)
        if adapt_model is not None:
            adapt_model(model)  # e.g. the critic's value head, before DDP wraps the parameters
        # MoE: a probe on every router (routing metrics; the engine's experts with R3).
        self.routing = RoutingReplay(model, moe_layer_indices(model.config))
        self.model_config = model.config
        # MoE with experts spread over ranks: micro-batches agree in number (and shape) over them.
        self.alignment = ExpertAlignment.of(self.model_config, self.device)
        self._moe = bool(getattr(self.model_config, "num_moe_experts", None))
        self.ddp = wrap_ddp(model, self.model_config, sections.ddp)
        self.optimizer, self.scheduler = build_optimizer(
            self.ddp, optimizer_config(sections.optimizer, self.model_config), ScheduleConfig(**sections.schedule)
        )
        if has_grad_scaler(self.optimizer):
            # Megatron's schedule scales the loss only through this hook, while the optimizer
            # unscales the grads regardless: without it fp16 grads come out 1/scale too small.
            self.model_config.grad_scale_func = self.optimizer.scale_loss
        self.step = 0
        self.skipped_steps = 0  # optimizer steps skipped for a non-finite loss or gradient

    # ----- discovery ---------------------------------------------------------------------------
    def info(self) -> RankInfo:
        return RankInfo(
            rank=dist.get_rank(),
            world_size=dist.get_world_size(),
            pid=os.getpid(),
            dp_rank=parallel_state.get_data_parallel_rank(),
            dp_size=parallel_state.get_data_parallel_world_size(),
            tp_rank=parallel_state.get_tensor_model_parallel_rank(),
            tp_size=parallel_state.get_tensor_model_parallel_world_size(),
            pp_rank=parallel_state.get_pipeline_model_parallel_rank(),
            pp_size=parallel_state.get_pipeline_model_parallel_world_size(),
            node_ip=os.environ.get("SLIME_NODE_IP", ""),
        )

    # ----- forward-backward --------------------------------------------------------------------
    def _micro_batch_indices(self, batch: Batch) -> list[list[int]]:
        """This rank's micro-batches (indices into ``batch``), as many as any rank of its expert
        dispatch group cuts where it holds the samples for them (collective under MoE EP / expert-TP)."""
        groups = split_into_micro_batches(
            batch.lengths, max_tokens=self.config.max_tokens_per_gpu, micro_batch_size=self.config.micro_batch_size
        )
        return spread_micro_batches(groups, batch.lengths, self.alignment.count(len(groups)))

    def _forward_step(self, loss_fn, data_iterator: Iterator[dict[str, Any]], model: torch.nn.Module):
        mb = next(data_iterator)
        # The MoE router leaves pad tokens out of its aux loss (and expert-bias counts).
        extra = {"padding_mask": mb["padding_mask"]} if self._moe else {}
        self.routing.begin(*mb.get("routing", (None, None)))
        try:
            output = model(mb["tokens"], mb["position_ids"], None, packed_seq_params=mb.get("packed_seq_params"),
                           **extra)
        finally:
            self.routing.end()
        return output, partial(loss_fn, mb)

    def _inputs(self, mb: Batch, tensors: Callable[..., dict[str, Any]], shape: tuple[int, ...] | None
                ) -> dict[str, Any]:
        """A micro-batch's model inputs (grown to ``shape`` if given) and, for an MoE, its routing:
        with R3 the engine's experts per token in the model's token order (checked against the
        model: a bad sample fails here, by name)."""
        out = tensors(mb, self.device, pad_to=shape)
        if self.routing.active:
            experts = mb.routed_experts if self.config.use_rollout_routing_replay else None
            targets, valid = self.routing.targets(experts, mb.lengths, out.get("packed_seq_params") is not None,
                                                  mb.sample_ids, pad_to=shape)
            # On the device once per micro-batch, not once per layer.
            out["routing"] = (None if targets is None else targets.to(self.device), valid.to(self.device))
        return out

    def _routing_metrics(self, num_micro_batches: int) -> dict[str, float]:
        """The step's MoE routing metrics and aux losses (collective; {} for a dense model)."""
        if not self.routing.moe_layers:
            return {}
        return self.routing.metrics(self.device) | aux_loss_metrics(
            self.model_config.num_layers, len(self.routing.moe_layers), num_micro_batches, self.device)

    def _schedule(self, micro_batches: list[Batch], tensors: Callable[..., dict[str, Any]],
                  loss_fn, forward_only: bool, pack: bool = False) -> list[Any]:
        """Megatron's forward-backward schedule over ``micro_batches``; ``loss_fn(mb, output)``.

        ``tensors(batch, device, pad_to=shape)`` builds a micro-batch's inputs (``pack``: packed).
        Under MoE EP / expert-TP the ranks of a dispatch group run as many micro-batches (zero-loss
        copies fill a short rank's) of equal shapes where the dispatcher needs it; under sequence
        parallelism each input's sequence is padded to a multiple of TP. The outputs of
        ``micro_batches`` alone come back. Each input carries ``loss_scale`` (micro-batches run x
        DP ranks): Megatron's schedule divides a loss by the first and DDP averages over the second.
        """
        count = self.alignment.count(len(micro_batches))
        padded = micro_batches + [zero_loss_copy(micro_batches[0])] * (count - len(micro_batches))
        # Sequence parallelism splits each input's sequence evenly over the TP ranks: pad tokens make it fit.
        multiple = sequence_multiple(self.model_config)
        local = [round_up_shape(micro_batch_shape(mb, pack), multiple) for mb in padded]
        shapes = self.alignment.shapes(local, count) or local
        loss_scale = count * parallel_state.get_data_parallel_world_size()
        inputs = [self._inputs(mb, tensors, shape) for mb, shape in zip(padded, shapes)]
        for mb in inputs:
            mb["loss_scale"] = loss_scale
        outputs = get_forward_backward_func()(
            forward_step_func=partial(self._forward_step, loss_fn),
            data_iterator=iter(inputs),
            model=[self.ddp],
            num_microbatches=count,
            seq_length=max(max(mb.lengths) for mb in padded),
            micro_batch_size=max(len(mb) for mb in padded),
            forward_only=forward_only,
        )
        return outputs[: len(micro_batches)]

    # ----- the optimizer step ------------------------------------------------------------------
    def _optimizer_step(self, outputs: list[Any]) -> tuple[bool, float]:
        """``(update_ok, grad_norm)`` of the step after a backward pass that produced ``outputs``.

        fp16: Megatron's grad scaler finds inf/NaN grads itself, skips the step and lowers the
        loss scale (skipping before it would never lower the scale). bf16/fp32 optimizers would
        step on them and every weight would become NaN: skipped here, on every rank alike.
        """
        if has_grad_scaler(self.optimizer) or self._loss_and_grads_finite(outputs):
            update_ok, grad_norm, _ = self.optimizer.step()
        else:
            self.ddp.zero_grad_buffer()
            self.optimizer.zero_grad()
            update_ok, grad_norm = False, float("nan")
        self.skipped_steps += not update_ok
        if update_ok:
            self.scheduler.step(increment=1)
            self.step += 1
        return update_ok, float(grad_norm) if grad_norm is not None else float("nan")

    def _loss_and_grads_finite(self, outputs: list[Any]) -> bool:
        """Whether this step's loss and every rank's gradients are finite (agreed over all ranks)."""
        local = all(math.isfinite(value) for out in outputs if isinstance(out, dict)
                    for key, value in out.items() if key.endswith("loss"))
        grads = [grad_of(p) for p in unwrap_model(self.ddp).parameters()]
        return all_ranks_agree(local and all_finite([g for g in grads if g is not None]), self.device)

    def _summed_metrics(self, outputs: list[Any]) -> dict[str, float]:
        """The micro-batches' metrics summed over this DP group (on the last pipeline stage)."""
        info = self.info()
        if info.pp_rank != info.pp_size - 1:
            return {}
        keys = sorted({k for out in outputs for k in out})
        sums = torch.tensor([sum(out.get(k, 0.0) for out in outputs) for k in keys], dtype=torch.float64,
                            device=self.device)
        dist.all_reduce(sums, group=parallel_state.get_data_parallel_group())
        return dict(zip(keys, sums.tolist()))

    # ----- checkpoints -------------------------------------------------------------------------
    def save(self, path: str) -> None:
        save_checkpoint(path, unwrap_model(self.ddp), self.optimizer, self.scheduler, {"step": self.step})

    def load(self, path: str) -> int:
        """Restore everything `save` wrote (a resume); returns its step."""
        extra = load_checkpoint(path, unwrap_model(self.ddp), self.optimizer, self.scheduler)
        self.step = int(extra.get("step", 0))
        return self.step
