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

import time
from functools import partial
from typing import Any

import torch
from megatron.core import dist_checkpointing, parallel_state

from actors.megatron.bridge import unwrap_model
from actors.megatron.config import TrainerConfig
from actors.megatron.rank import MegatronRank, response_tensors
from actors.megatron.sequence_parallel import whole_sequence
from policies.value_loss import clipped_value_loss
from slime_async.batch import Batch


class ValueHead(torch.nn.Linear):
    """hidden -> one value per position, in place of GPTModel's output layer (which GPTModel
    calls as ``(hidden, weight=..., runtime_gather_output=...) -> (output, bias)``).

    Zero-initialised: every rank builds the same head without sharing an RNG, and the first
    values are exactly 0 (a neutral baseline) instead of noise. It is replicated across TP: the
    hidden states after the final layernorm are whole on every TP rank (gathered first under
    sequence parallelism, where each rank holds a slice of the sequence).
    """

    def __init__(self, hidden_size: int, dtype: torch.dtype, device: torch.device, sequence_parallel: bool = False):
        super().__init__(hidden_size, 1, bias=True, dtype=dtype, device=device)
        self.sequence_parallel = sequence_parallel
        with torch.no_grad():
            self.weight.zero_()
            self.bias.zero_()

    def forward(self, hidden_states: torch.Tensor, weight: Any = None, runtime_gather_output: Any = None):
        if self.sequence_parallel:
            hidden_states = whole_sequence(hidden_states)
        return super().forward(hidden_states), None


def _tensors(batch: Batch, device: torch.device, pad_to: tuple[int, ...] | None = None) -> dict[str, Any]:
    """Right-padded inputs and response-aligned ``[B, T]`` targets of one micro-batch."""
    return response_tensors(batch, device, ("values", "returns"), pad_to=pad_to)


class CriticOps(MegatronRank):
    """The critic's rank: the value model's values, its clipped value loss's optimizer step, checkpoints."""

    def __init__(self, config: TrainerConfig):
        super().__init__(config, adapt_model=self._value_head)

    def _value_head(self, model: torch.nn.Module) -> None:
        # The LM head (or the tied embedding it reads) is not needed: values come from the head.
        # Untied on every pipeline stage, so the stages' embedding gradients are not summed.
        model.share_embeddings_and_output_weights = False
        if model.post_process:  # the last pipeline stage (the only one with PP = 1)
            model.output_layer = ValueHead(model.config.hidden_size, model.config.params_dtype, self.device,
                                           model.config.sequence_parallel)

    def _forward_step(self, loss_fn, data_iterator, model: torch.nn.Module):
        mb = next(data_iterator)
        extra = {"padding_mask": mb["padding_mask"]} if self._moe else {}  # pad tokens out of the MoE aux loss
        # [B, S, 1]; hidden states before the last stage
        output = model(mb["tokens"], mb["position_ids"], None, **extra)
        if not parallel_state.is_pipeline_last_stage():
            return output, partial(loss_fn, mb)  # sent on to the next stage; loss_fn runs on the last
        values = output[..., 0].gather(1, mb["positions"]) * mb["valid"]  # [B, T] response-aligned
        return values, partial(loss_fn, mb)

    def _run(self, micro_batches: list[Batch], loss_fn, forward_only: bool) -> list[Any]:
        return self._schedule(micro_batches, _tensors, loss_fn, forward_only)

    @torch.no_grad()
    def compute_values(self, batch: Batch) -> list[list[float]] | None:
        """V of every response token of this shard (answered by each DP group's reporting rank)."""
        groups = self._micro_batch_indices(batch)

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
        groups = self._micro_batch_indices(batch)

        def loss_fn(mb: dict[str, Any], values: torch.Tensor):
            terms = clipped_value_loss(values, mb["values"], mb["returns"], mb["loss_mask"], value_clip=value_clip,
                                       loss_agg=loss_agg, normalizer=normalizer)
            return terms.loss * mb["loss_scale"], {"value_loss": float(terms.loss.detach()),
                                        "value_clipfrac": float(terms.clipfrac)}

        self.ddp.zero_grad_buffer()
        self.optimizer.zero_grad()
        outputs = self._run([batch.select(g) for g in groups], loss_fn, forward_only=False)
        lr = float(self.optimizer.param_groups[0]["lr"])
        update_ok, grad_norm = self._optimizer_step(outputs)
        metrics = self._summed_metrics(outputs)
        info = self.info()
        if not (info.reports and info.dp_rank == 0):
            return None
        metrics.update(grad_norm=grad_norm, lr=lr, update_successful=float(update_ok),
                       skipped_steps=float(self.skipped_steps), step=float(self.step),
                       step_time_s=time.perf_counter() - started)
        return metrics

    # ----- checkpoints -----------------------------------------------------------------------------
    def load_weights(self, path: str) -> None:
        """Only the value model's weights from a critic checkpoint (``--critic-load``): a new run
        starts from a trained critic with a fresh optimizer and schedule."""
        model = unwrap_model(self.ddp)
        if not dist_checkpointing.check_is_distributed_checkpoint(path):
            raise FileNotFoundError(f"--critic-load {path}: not a Megatron distributed checkpoint")
        loaded = dist_checkpointing.load({"model": model.sharded_state_dict()}, path)
        model.load_state_dict(loaded["model"])
