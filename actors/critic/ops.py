"""The operations one critic rank serves: a value model, its optimizer, and what is done to them.

The value model is the policy's GPTModel (same architecture and HF initial weights) whose LM
head is replaced by `ValueHead`, one scalar per position, as slime's critic does. The value of
response token t is read where the policy reads its logit: at position prompt_len + t − 1, the
state just before the token was generated.

Called SPMD like `actors.trainer.ops.TrainerOps` (each rank gets its DP shard; methods run on
the worker's main thread, one at a time). Loss scaling follows TrainerOps: the value loss of a
micro-batch is already divided by the global normalizer, so it is multiplied back by the
number of micro-batches and the DP size that Megatron's schedule and DDP divide by.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from functools import partial
from typing import Any

import torch
import torch.distributed as dist
from megatron.core import dist_checkpointing, parallel_state
from megatron.core.pipeline_parallel import get_forward_backward_func

from actors.trainer.bridge import unwrap_model
from actors.trainer.checkpoint import load_checkpoint, save_checkpoint
from actors.trainer.config import TrainerConfig
from actors.trainer.dp_split import split_into_micro_batches
from actors.trainer.logprobs import response_positions
from actors.trainer.model import build_gpt_model
from actors.trainer.optimizer import (
    ScheduleConfig,
    build_optimizer,
    has_grad_scaler,
    optimizer_config,
    split_megatron_overrides,
    wrap_ddp,
)
from actors.trainer.parallel import init_model_parallel
from actors.trainer.protocol import RankInfo
from policies.value_loss import clipped_value_loss
from slime_async.batch import Batch


class ValueHead(torch.nn.Linear):
    """hidden -> one value per position, in place of GPTModel's output layer (which GPTModel
    calls as ``(hidden, weight=..., runtime_gather_output=...) -> (output, bias)``).

    Zero-initialised: every rank builds the same head without sharing an RNG, and the first
    values are exactly 0 (a neutral baseline) instead of noise. It is replicated across TP: the
    hidden states after the final layernorm are whole on every TP rank.
    """

    def __init__(self, hidden_size: int, dtype: torch.dtype, device: torch.device):
        super().__init__(hidden_size, 1, bias=True, dtype=dtype, device=device)
        with torch.no_grad():
            self.weight.zero_()
            self.bias.zero_()

    def forward(self, hidden_states: torch.Tensor, weight: Any = None, runtime_gather_output: Any = None):
        return super().forward(hidden_states), None


def _pad(rows: list[list[float]] | list[list[int]], width: int, dtype: torch.dtype) -> torch.Tensor:
    out = torch.zeros(len(rows), width, dtype=dtype)
    for i, row in enumerate(rows):
        if row:
            out[i, : len(row)] = torch.tensor(row, dtype=dtype)
    return out


def _tensors(batch: Batch, device: torch.device) -> dict[str, Any]:
    """Right-padded inputs and response-aligned ``[B, T]`` targets of one micro-batch."""
    seq = max(batch.lengths)
    width = max(max(batch.response_lengths), 1)
    rlen = torch.tensor(batch.response_lengths, dtype=torch.long)
    plen = torch.tensor(batch.lengths, dtype=torch.long) - rlen
    positions, valid = response_positions(plen, rlen, width)
    out: dict[str, Any] = {
        "tokens": _pad(batch.tokens, seq, torch.long).to(device),
        "position_ids": torch.arange(seq, device=device).unsqueeze(0).expand(len(batch), seq),
        "positions": positions.to(device),
        "valid": valid.float().to(device),
        "response_lengths": batch.response_lengths,
        "loss_mask": (_pad(batch.loss_masks, width, torch.float) * valid).to(device),
    }
    for name in ("values", "returns"):
        rows = getattr(batch, name)
        out[name] = _pad(rows, width, torch.float).to(device) if rows is not None else None
    return out


class CriticOps:
    """Value model + DDP + optimizer + scheduler of one critic rank, and the operations on them."""

    def __init__(self, config: TrainerConfig):
        self.config = config
        sections = split_megatron_overrides(config.megatron)
        init_model_parallel(
            tensor_parallel_size=sections.transformer.get("tensor_model_parallel_size", 1),
            pipeline_parallel_size=sections.transformer.get("pipeline_model_parallel_size", 1),
            seed=config.seed,
        )
        self.device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
        model = build_gpt_model(config.hf_checkpoint, sections.transformer, use_sdpa=config.use_sdpa, load_weights=True)
        # The LM head (or the tied embedding it reads) is not needed: values come from the head.
        model.share_embeddings_and_output_weights = False
        model.output_layer = ValueHead(model.config.hidden_size, model.config.params_dtype, self.device)
        self.model_config = model.config
        self.ddp = wrap_ddp(model, self.model_config, sections.ddp)
        self.optimizer, self.scheduler = build_optimizer(
            self.ddp, optimizer_config(sections.optimizer, self.model_config), ScheduleConfig(**sections.schedule)
        )
        if has_grad_scaler(self.optimizer):
            self.model_config.grad_scale_func = self.optimizer.scale_loss  # see TrainerOps
        self.step = 0

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
        )

    # ----- forward passes ----------------------------------------------------------------------
    def _groups(self, batch: Batch) -> list[list[int]]:
        return split_into_micro_batches(
            batch.lengths, max_tokens=self.config.max_tokens_per_gpu, micro_batch_size=self.config.micro_batch_size
        )

    def _forward_step(self, loss_fn, data_iterator: Iterator[dict[str, Any]], model: torch.nn.Module):
        mb = next(data_iterator)
        output = model(mb["tokens"], mb["position_ids"], None)  # [B, S, 1]
        values = output[..., 0].gather(1, mb["positions"]) * mb["valid"]  # [B, T] response-aligned
        return values, partial(loss_fn, mb)

    def _run(self, micro_batches: list[Batch], loss_fn, forward_only: bool) -> list[Any]:
        data = iter([_tensors(mb, self.device) for mb in micro_batches])
        return get_forward_backward_func()(
            forward_step_func=partial(self._forward_step, loss_fn),
            data_iterator=data,
            model=[self.ddp],
            num_microbatches=len(micro_batches),
            seq_length=max(max(mb.lengths) for mb in micro_batches),
            micro_batch_size=max(len(mb) for mb in micro_batches),
            forward_only=forward_only,
        )

    @torch.no_grad()
    def compute_values(self, batch: Batch) -> list[list[float]] | None:
        """V of every response token of this shard (answered by each DP group's reporting rank)."""
        groups = self._groups(batch)

        def loss_fn(mb: dict[str, Any], values: torch.Tensor):
            rows = [values[i, :n].float().tolist() for i, n in enumerate(mb["response_lengths"])]
            return torch.zeros((), device=values.device), {"rows": rows}

        self.ddp.eval()
        try:
            outputs = self._run([batch.select(g) for g in groups], loss_fn, forward_only=True)
        finally:
            self.ddp.train()
        if not self.info().reports:
            return None
        result: list[list[float] | None] = [None] * len(batch)
        rows = [row for out in outputs for row in out["rows"]]
        for i, row in zip((i for g in groups for i in g), rows):  # micro-batching reorders samples
            result[i] = row
        return result  # type: ignore[return-value]

    # ----- training ------------------------------------------------------------------------------
    def train_step(self, batch: Batch, value_clip: float, loss_agg: str, normalizer: float) -> dict[str, float] | None:
        """One optimizer step of the clipped value loss on this shard (``batch.values`` = the
        values at rollout, ``batch.returns`` = the targets); global metrics on the reporting rank."""
        if batch.values is None or batch.returns is None:
            raise ValueError("critic train_step needs batch.values and batch.returns")
        started = time.perf_counter()
        groups = self._groups(batch)
        scale = len(groups) * parallel_state.get_data_parallel_world_size()

        def loss_fn(mb: dict[str, Any], values: torch.Tensor):
            terms = clipped_value_loss(values, mb["values"], mb["returns"], mb["loss_mask"], value_clip=value_clip,
                                       loss_agg=loss_agg, normalizer=normalizer)
            return terms.loss * scale, {"value_loss": float(terms.loss.detach()),
                                        "value_clipfrac": float(terms.clipfrac)}

        self.ddp.zero_grad_buffer()
        self.optimizer.zero_grad()
        outputs = self._run([batch.select(g) for g in groups], loss_fn, forward_only=False)
        lr = float(self.optimizer.param_groups[0]["lr"])
        update_ok, grad_norm, _ = self.optimizer.step()
        if update_ok:
            self.scheduler.step(increment=1)
            self.step += 1
        info = self.info()
        metrics: dict[str, float] = {}
        if info.pp_rank == info.pp_size - 1:
            keys = sorted({k for out in outputs for k in out})
            sums = torch.tensor([sum(out.get(k, 0.0) for out in outputs) for k in keys], dtype=torch.float64,
                                device=self.device)
            dist.all_reduce(sums, group=parallel_state.get_data_parallel_group())
            metrics = dict(zip(keys, sums.tolist()))
        if not (info.reports and info.dp_rank == 0):
            return None
        metrics.update(grad_norm=float(grad_norm) if grad_norm is not None else float("nan"), lr=lr,
                       step=float(self.step), step_time_s=time.perf_counter() - started)
        return metrics

    # ----- checkpoints -----------------------------------------------------------------------------
    def save(self, path: str) -> None:
        save_checkpoint(path, unwrap_model(self.ddp), self.optimizer, self.scheduler, {"step": self.step})

    def load(self, path: str) -> int:
        """Restore everything `save` wrote (a resume); returns its step."""
        extra = load_checkpoint(path, unwrap_model(self.ddp), self.optimizer, self.scheduler)
        self.step = int(extra.get("step", 0))
        return self.step

    def load_weights(self, path: str) -> None:
        """Only the value model's weights from a critic checkpoint (``--critic-load``): a new run
        starts from a trained critic with a fresh optimizer and schedule."""
        model = unwrap_model(self.ddp)
        if not dist_checkpointing.check_is_distributed_checkpoint(path):
            raise FileNotFoundError(f"--critic-load {path}: not a Megatron distributed checkpoint")
        loaded = dist_checkpointing.load({"model": model.sharded_state_dict()}, path)
        model.load_state_dict(loaded["model"])
