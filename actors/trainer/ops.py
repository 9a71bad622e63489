"""The operations one trainer rank serves: model, optimizer and everything done to them.

`TrainerOps` is built once per rank (after torch.distributed and Megatron parallel state are
up) and is called SPMD: the supervisor invokes the same method on every rank, each with its
DP shard of the batch. Methods run on the worker's main thread, one at a time.

Loss scaling. The objective of a micro-batch is already divided by the *global* normalizer
(policies.objective), so the loss to backpropagate is the plain sum over micro-batches and
DP ranks. Megatron's schedule divides a 2-tuple loss by the number of micro-batches and its
DDP averages gradients over DP, so each micro-batch loss is multiplied back by both.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from megatron.core import parallel_state
from megatron.core.pipeline_parallel import get_forward_backward_func

from actors.trainer.bridge import hf_vocab_size_of, load_hf_weights, save_hf_checkpoint, unwrap_model
from actors.trainer.checkpoint import load_checkpoint, save_checkpoint
from actors.trainer.config import TrainerConfig
from actors.trainer.dp_split import split_into_micro_batches
from actors.trainer.logprobs import response_positions, vocab_parallel_logprobs
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
from actors.trainer.protocol import RankInfo, SampleLogprobs, TensorMeta, WeightGroupSpec
from actors.trainer.weight_sync import WeightBroadcaster
from policies.loss_spec import LossSpec
from policies.objective import compute_objective
from slime_async.batch import Batch


class NonFiniteWeights(RuntimeError):
    """The model's weights hold NaN or inf: they must never reach an engine or an export."""


def _grad_of(param: torch.nn.Parameter) -> torch.Tensor | None:
    # Megatron's DDP accumulates into main_grad; plain .grad otherwise.
    main = getattr(param, "main_grad", None)
    return main if main is not None else param.grad


def _all_finite(tensors: list[torch.Tensor]) -> bool:
    # One device sync for all tensors, not one per tensor.
    return bool(torch.stack([torch.isfinite(t).all() for t in tensors]).all()) if tensors else True


def _all_ranks_agree(ok: bool, device: torch.device) -> bool:
    """True when ``ok`` holds on every rank: a rank that alone skipped a collective would hang the rest."""
    flag = torch.tensor([0.0 if ok else 1.0], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return flag.item() == 0.0


def _pad(rows: list[list[float]] | list[list[int]], width: int, dtype: torch.dtype) -> torch.Tensor:
    out = torch.zeros(len(rows), width, dtype=dtype)
    for i, row in enumerate(rows):
        if row:
            out[i, : len(row)] = torch.tensor(row, dtype=dtype)
    return out


def _micro_batch_tensors(batch: Batch, device: torch.device) -> dict[str, Any]:
    """Right-padded model inputs and response-aligned ``[B, T]`` training tensors."""
    seq = max(batch.lengths)
    width = max(max(batch.response_lengths), 1)
    tokens = _pad(batch.tokens, seq, torch.long)
    rlen = torch.tensor(batch.response_lengths, dtype=torch.long)
    plen = torch.tensor(batch.lengths, dtype=torch.long) - rlen
    positions, valid = response_positions(plen, rlen, width)
    # Targets are the tokens one step after each scoring position (padding points at token 1).
    targets = tokens.gather(1, (positions + 1).clamp(max=seq - 1))
    out: dict[str, Any] = {
        "tokens": tokens.to(device),
        "position_ids": torch.arange(seq, device=device).unsqueeze(0).expand(len(batch), seq),
        "positions": positions.to(device),
        "targets": targets.to(device),
        "valid": valid.to(device),
        "response_lengths": batch.response_lengths,
        "loss_mask": (_pad(batch.loss_masks, width, torch.float) * valid).to(device),
    }
    for name in ("advantages", "rollout_logprobs", "ref_logprobs", "old_logprobs"):
        rows = getattr(batch, name)
        out[name] = _pad(rows, width, torch.float).to(device) if rows is not None else None
    return out


class TrainerOps:
    """Model + DDP + optimizer + scheduler of one rank, and the operations on them."""

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
        self.model_config = model.config
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
        self.hf_vocab_size = hf_vocab_size_of(model)
        self.weights = WeightBroadcaster(model, int(config.weight_bucket_mb * 1024 * 1024))
        self.ref_state: dict[str, torch.Tensor] | None = None
        if config.use_reference or config.ref_load:
            self.set_reference_model(config.ref_load)

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
        )

    # ----- forward passes ----------------------------------------------------------------------
    def _micro_batches(self, batch: Batch) -> list[Batch]:
        groups = split_into_micro_batches(
            batch.lengths, max_tokens=self.config.max_tokens_per_gpu, micro_batch_size=self.config.micro_batch_size
        )
        return [batch.select(g) for g in groups]

    def _forward_step(self, loss_fn, data_iterator: Iterator[dict[str, Any]], model: torch.nn.Module):
        mb = next(data_iterator)
        logits = model(mb["tokens"], mb["position_ids"], None)
        return logits, partial(loss_fn, mb)

    def _token_stats(self, mb: dict[str, Any], logits: torch.Tensor, temperature: float, with_grad_entropy: bool):
        """(logprobs, entropy) ``[B, T]`` of the response tokens of a micro-batch."""
        index = mb["positions"].unsqueeze(-1).expand(-1, -1, logits.size(-1))
        picked = logits.gather(1, index)  # [B, T, V_local]: only scoring positions
        logprobs, entropy = vocab_parallel_logprobs(
            picked, mb["targets"], hf_vocab_size=self.hf_vocab_size, temperature=temperature
        )
        if not with_grad_entropy:
            entropy = entropy.detach()
        return logprobs, entropy

    def _run(self, micro_batches: list[Batch], loss_fn, forward_only: bool) -> list[Any]:
        data = iter([_micro_batch_tensors(mb, self.device) for mb in micro_batches])
        seq = max(max(mb.lengths) for mb in micro_batches)
        return get_forward_backward_func()(
            forward_step_func=partial(self._forward_step, loss_fn),
            data_iterator=data,
            model=[self.ddp],
            num_microbatches=len(micro_batches),
            seq_length=seq,
            micro_batch_size=max(len(mb) for mb in micro_batches),
            forward_only=forward_only,
        )

    @torch.no_grad()
    def compute_logprobs(self, batch: Batch, model: str = "actor") -> list[SampleLogprobs] | None:
        """Logprobs (at ``batch.temperature``) and entropy of every response token of this shard.

        ``model="ref"`` uses the frozen reference weights. Answered by the reporting rank of
        each DP group (others return None).
        """
        if model not in ("actor", "ref"):
            raise ValueError(f"compute_logprobs: model must be 'actor' or 'ref', got {model!r}")
        if model == "ref" and self.ref_state is None:
            raise ValueError("compute_logprobs(model='ref') but no reference model is set (--use-reference / --ref-load)")
        micro_batches = self._micro_batches(batch)

        def loss_fn(mb: dict[str, Any], logits: torch.Tensor):
            logprobs, entropy = self._token_stats(mb, logits, batch.temperature, False)
            rows = [
                SampleLogprobs(logprobs[i, :n].tolist(), entropy[i, :n].tolist())
                for i, n in enumerate(mb["response_lengths"])
            ]
            return torch.zeros((), device=logits.device), {"rows": rows}

        self.ddp.eval()
        try:
            if model == "ref":
                with self._weights_swapped(self.ref_state):
                    outputs = self._run(micro_batches, loss_fn, forward_only=True)
            else:
                outputs = self._run(micro_batches, loss_fn, forward_only=True)
        finally:
            self.ddp.train()
        if not self.info().reports:
            return None
        rows = [row for out in outputs for row in out["rows"]]
        # Micro-batching reorders samples: put them back in shard order.
        order = [i for group in split_into_micro_batches(
            batch.lengths, max_tokens=self.config.max_tokens_per_gpu, micro_batch_size=self.config.micro_batch_size
        ) for i in group]
        result: list[SampleLogprobs | None] = [None] * len(batch)
        for i, row in zip(order, rows):
            result[i] = row
        return result  # type: ignore[return-value]

    # ----- training ------------------------------------------------------------------------------
    def train_step(self, batch: Batch, loss_spec: LossSpec, normalizer: float) -> dict[str, float] | None:
        """One optimizer step on this rank's shard; ``normalizer`` is the global-batch one.

        Returns the global metrics (summed over micro-batches and DP ranks) on global rank 0
        (on the last pipeline stage's first rank with PP), None elsewhere.
        """
        started = time.perf_counter()
        loss_spec.validate()
        micro_batches = self._micro_batches(batch)
        scale = len(micro_batches) * parallel_state.get_data_parallel_world_size()

        def loss_fn(mb: dict[str, Any], logits: torch.Tensor):
            logprobs, entropy = self._token_stats(mb, logits, batch.temperature, loss_spec.entropy_coef != 0.0)
            out = compute_objective(
                loss_spec,
                logprobs=logprobs,
                loss_mask=mb["loss_mask"],
                advantages=mb["advantages"],
                old_logprobs=mb["old_logprobs"],
                rollout_logprobs=mb["rollout_logprobs"],
                ref_logprobs=mb["ref_logprobs"],
                entropy=entropy,
                normalizer=normalizer,
            )
            return out.loss * scale, out.metrics

        self.ddp.zero_grad_buffer()
        self.optimizer.zero_grad()
        outputs = self._run(micro_batches, loss_fn, forward_only=False)
        lr = float(self.optimizer.param_groups[0]["lr"])  # the lr this update uses
        # fp16: Megatron's grad scaler finds inf/NaN grads itself, skips the step and lowers the
        # loss scale (skipping before it would never lower the scale). bf16/fp32 optimizers would
        # step on them and every weight would become NaN: skipped here, on every rank alike.
        if has_grad_scaler(self.optimizer) or self._loss_and_grads_finite(outputs):
            update_ok, grad_norm, num_zeros = self.optimizer.step()
        else:
            self.ddp.zero_grad_buffer()
            self.optimizer.zero_grad()
            update_ok, grad_norm, num_zeros = False, float("nan"), None
        self.skipped_steps += not update_ok
        if update_ok:
            self.scheduler.step(increment=1)
            self.step += 1
        info = self.info()
        metrics: dict[str, float] = {}
        if info.pp_rank == info.pp_size - 1:
            keys = sorted({k for out in outputs for k in out})
            sums = torch.tensor([sum(out.get(k, 0.0) for out in outputs) for k in keys], dtype=torch.float64, device=self.device)
            dist.all_reduce(sums, group=parallel_state.get_data_parallel_group())
            metrics = dict(zip(keys, sums.tolist()))
        if not (info.reports and info.dp_rank == 0):
            return None
        metrics.update(
            grad_norm=float(grad_norm) if grad_norm is not None else float("nan"),
            lr=lr,
            update_successful=float(update_ok),
            skipped_steps=float(self.skipped_steps),
            num_micro_batches=float(len(micro_batches)),
            step=float(self.step),
            # This rank's wall time for the op, without RPC and the supervisor's work.
            step_time_s=time.perf_counter() - started,
        )
        return metrics

    def _loss_and_grads_finite(self, outputs: list[Any]) -> bool:
        """Whether this step's loss and every rank's gradients are finite (agreed over all ranks)."""
        local = all(math.isfinite(out.get("loss", 0.0)) for out in outputs if isinstance(out, dict))
        grads = [_grad_of(p) for p in unwrap_model(self.ddp).parameters()]
        return _all_ranks_agree(local and _all_finite([g for g in grads if g is not None]), self.device)

    @torch.no_grad()
    def _refuse_non_finite_weights(self, what: str) -> None:
        """Raise before ``what`` publishes weights (export, broadcast) when any rank's are not finite."""
        params = self._params()
        if _all_ranks_agree(_all_finite(list(params.values())), self.device):
            return
        bad = [name for name, p in params.items() if not bool(torch.isfinite(p).all())]
        where = f"parameter {bad[0]} (and {len(bad) - 1} more) on rank {dist.get_rank()}" if bad else "another rank"
        raise NonFiniteWeights(f"refusing to {what}: non-finite (NaN/inf) weights in {where}")

    # ----- reference model -------------------------------------------------------------------
    def _params(self) -> dict[str, torch.Tensor]:
        return dict(unwrap_model(self.ddp).named_parameters())

    @torch.no_grad()
    def set_reference_model(self, hf_dir: str | None = None) -> None:
        """Freeze a reference: the current weights, or those of an HF directory."""
        if hf_dir is None:
            self.ref_state = {n: p.detach().clone() for n, p in self._params().items()}
            return
        current = {n: p.detach().clone() for n, p in self._params().items()}
        load_hf_weights(unwrap_model(self.ddp), hf_dir)
        self.ref_state = {n: p.detach().clone() for n, p in self._params().items()}
        self._copy_in(current)

    @torch.no_grad()
    def _copy_in(self, state: dict[str, torch.Tensor]) -> None:
        for name, param in self._params().items():
            param.copy_(state[name])

    def _weights_swapped(self, state: dict[str, torch.Tensor]):
        ops = self

        class _Swap:
            def __enter__(self):
                self.saved = {n: p.detach().clone() for n, p in ops._params().items()}
                ops._copy_in(state)

            def __exit__(self, *exc):
                ops._copy_in(self.saved)

        return _Swap()

    # ----- checkpoints and export ------------------------------------------------------------------
    def save(self, path: str) -> None:
        save_checkpoint(path, unwrap_model(self.ddp), self.optimizer, self.scheduler, {"step": self.step})

    def load(self, path: str) -> int:
        """Restore a checkpoint; returns its step."""
        extra = load_checkpoint(path, unwrap_model(self.ddp), self.optimizer, self.scheduler)
        self.step = int(extra.get("step", 0))
        return self.step

    def export_hf(self, path: str) -> None:
        """HF safetensors + config + tokenizer (collective; global rank 0 writes)."""
        self._refuse_non_finite_weights(f"export weights to {path}")
        save_hf_checkpoint(unwrap_model(self.ddp), self.config.hf_checkpoint, Path(path))
        dist.barrier()

    # ----- weight sync ---------------------------------------------------------------------------
    def weight_metadata(self) -> list[list[TensorMeta]] | None:
        return self.weights.metadata()

    def init_weight_group(self, spec: WeightGroupSpec) -> None:
        self.weights.init_group(spec)

    def broadcast_weights(self, group_name: str = "weight_update_group") -> int:
        self._refuse_non_finite_weights("broadcast weights to the engines")
        return self.weights.broadcast(group_name)

    def destroy_weight_group(self, group_name: str = "weight_update_group") -> None:
        self.weights.destroy_group(group_name)
