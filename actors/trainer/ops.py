"""The operations one trainer rank serves: model, optimizer and everything done to them.

`TrainerOps` is built once per rank (after torch.distributed and Megatron parallel state are
up) and is called SPMD: the supervisor invokes the same method on every rank, each with its
DP shard of the batch. Methods run on the worker's main thread, one at a time.

Loss scaling. The objective of a micro-batch is already divided by the *global* normalizer
(policies.objective), so the loss to backpropagate is the plain sum over micro-batches and
DP ranks. Megatron's schedule divides a 2-tuple loss by the number of micro-batches and its
DDP averages gradients over DP, so each micro-batch loss is multiplied back by both
(``loss_scale``, set by `MegatronRank._schedule`, which knows how many micro-batches run).
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from actors.megatron.bridge import hf_vocab_size_of, load_hf_weights, save_hf_checkpoint, unwrap_model
from actors.megatron.checkpoint import load_model_weights, megatron_checkpoint_dir
from actors.megatron.config import TrainerConfig
from actors.megatron.rank import MegatronRank, all_finite, all_ranks_agree, response_tensors
from actors.trainer.residency import DeviceResidency
from actors.trainer.fused_logprobs import head_weight, response_token_stats, return_hidden_states
from actors.trainer.kernels import resolve_kernels
from actors.trainer.logprobs import vocab_parallel_logprobs
from actors.trainer.protocol import SampleLogprobs
from slime_async.weights.protocol import TensorMeta, WeightGroupSpec
from actors.trainer.weight_broadcast import WeightBroadcaster
from policies.algorithm import AlgorithmConfig
from policies.objective import compute_objective
from slime_async.batch import Batch

log = logging.getLogger(__name__)


class NonFiniteWeights(RuntimeError):
    """The model's weights hold NaN or inf: they must never reach an engine or an export."""


def _micro_batch_tensors(batch: Batch, device: torch.device, pack: bool = False,
                         pad_to: tuple[int, ...] | None = None) -> dict[str, Any]:
    """Model inputs (right-padded, or packed) and response-aligned ``[B, T]`` training tensors."""
    out = response_tensors(batch, device, ("advantages", "rollout_logprobs", "ref_logprobs", "old_logprobs"),
                           pack=pack, pad_to=pad_to)
    # Targets are the tokens one step after each scoring position (padding entries point at
    # some token; they are masked out).
    tokens = out["tokens"].reshape(-1)
    out["targets"] = tokens[(out["flat_positions"] + 1).clamp(max=tokens.numel() - 1)]
    return out


class TrainerOps(DeviceResidency, MegatronRank):
    """The policy's rank: logprobs, the policy loss's optimizer step, the reference model,
    HF export and weight broadcast to the engines."""

    def __init__(self, config: TrainerConfig):
        self._use_sdpa = config.use_sdpa if config.use_sdpa is not None else torch.cuda.is_available()
        super().__init__(config, adapt_model=self._adapt_head)  # resolves self.kernels
        model = unwrap_model(self.ddp)
        if dist.get_rank() == 0:
            log.info("trainer kernels: %s", self.kernels.describe(self.model_config.params_dtype, self._use_sdpa))
        self.hf_vocab_size = hf_vocab_size_of(model)
        self.weights = WeightBroadcaster(model, int(config.weight_bucket_mb * 1024 * 1024))
        self.ref_state: dict[str, torch.Tensor] | None = None
        if config.use_reference or config.ref_load:
            self.set_reference_model(config.ref_load)
        # --opd-type megatron: the frozen teacher's weights, swapped in for its forward passes.
        self.teacher_state: dict[str, torch.Tensor] | None = None
        if config.opd_teacher_load:
            self.teacher_state = self._frozen_state(config.opd_teacher_load)

    def _adapt_head(self, model: torch.nn.Module) -> None:
        config = self.config
        self.kernels = resolve_kernels(
            config.attention_impl, config.logprob_impl, config.log_probs_chunk_size, use_sdpa=self._use_sdpa,
            pipeline_parallel=config.megatron.get("pipeline_model_parallel_size", 1))
        # With the chunked head the last stage's model returns hidden states, not logits.
        if self.kernels.chunked_logprobs and model.post_process:
            return_hidden_states(model)

    # ----- forward passes ----------------------------------------------------------------------
    def _micro_batches(self, batch: Batch) -> list[Batch]:
        return [batch.select(g) for g in self._micro_batch_indices(batch)]

    def _token_stats(self, mb: dict[str, Any], output: torch.Tensor, temperature: float, with_grad_entropy: bool):
        """(logprobs, entropy) ``[B, T]`` of the response tokens of a micro-batch, from the model's
        ``output``: hidden states with the chunked head, else logits."""
        if self.kernels.chunked_logprobs:
            logprobs, entropy = response_token_stats(
                output, head_weight(unwrap_model(self.ddp)), mb["flat_positions"], mb["valid"], mb["targets"],
                hf_vocab_size=self.hf_vocab_size, temperature=temperature, chunk_size=self.kernels.chunk_size,
            )
            return logprobs, entropy if with_grad_entropy else entropy.detach()
        # [B, T, V_local]: only scoring positions (of padded [B, S] or packed [1, total] logits)
        picked = output.reshape(-1, output.size(-1))[mb["flat_positions"]]
        logprobs, entropy = vocab_parallel_logprobs(
            picked, mb["targets"], hf_vocab_size=self.hf_vocab_size, temperature=temperature
        )
        if not with_grad_entropy:
            entropy = entropy.detach()
        return logprobs, entropy

    def _run(self, micro_batches: list[Batch], loss_fn, forward_only: bool) -> list[Any]:
        pack = self.kernels.pack_sequences
        return self._schedule(micro_batches, partial(_micro_batch_tensors, pack=pack), loss_fn, forward_only, pack)

    @torch.no_grad()
    def compute_logprobs(self, batch: Batch, model: str = "actor") -> list[SampleLogprobs] | None:
        """Logprobs (at ``batch.temperature``) and entropy of every response token of this shard.

        ``model="ref"`` uses the frozen reference weights, ``"teacher"`` the OPD teacher's
        (--opd-teacher-load). Answered by the reporting rank of each DP group (others return None).
        """
        frozen = {"actor": None, "ref": self.ref_state, "teacher": self.teacher_state}
        if model not in frozen:
            raise ValueError(f"compute_logprobs: model must be 'actor', 'ref' or 'teacher', got {model!r}")
        if model == "ref" and self.ref_state is None:
            raise ValueError("compute_logprobs(model='ref') but no reference model is set (--use-reference / --ref-load)")
        if model == "teacher" and self.teacher_state is None:
            raise ValueError("compute_logprobs(model='teacher') but no teacher is loaded (--opd-teacher-load)")
        if model != "actor":
            # The engine's experts are the policy's routing; the frozen models route themselves (as slime).
            batch = replace(batch, routed_experts=None)
        groups = self._micro_batch_indices(batch)
        micro_batches = [batch.select(g) for g in groups]

        def loss_fn(mb: dict[str, Any], logits: torch.Tensor):
            logprobs, entropy = self._token_stats(mb, logits, batch.temperature, False)
            rows = [
                SampleLogprobs(logprobs[i, :n].tolist(), entropy[i, :n].tolist())
                for i, n in enumerate(mb["response_lengths"])
            ]
            return torch.zeros((), device=logits.device), {"rows": rows}

        self.ddp.eval()
        try:
            if frozen[model] is not None:
                with self._weights_swapped(frozen[model]):
                    outputs = self._run(micro_batches, loss_fn, forward_only=True)
            else:
                outputs = self._run(micro_batches, loss_fn, forward_only=True)
        finally:
            self.ddp.train()
        if not self.info().reports:
            return None
        rows = [row for out in outputs for row in out["rows"]]
        # Micro-batching reorders samples: put them back in shard order.
        order = [i for group in groups for i in group]
        result: list[SampleLogprobs | None] = [None] * len(batch)
        for i, row in zip(order, rows):
            result[i] = row
        return result  # type: ignore[return-value]

    # ----- training ------------------------------------------------------------------------------
    def train_step(self, batch: Batch, loss_spec: AlgorithmConfig, normalizer: float) -> dict[str, float] | None:
        """One optimizer step on this rank's shard; ``normalizer`` is the global-batch one.

        Returns the global metrics (summed over micro-batches and DP ranks) on global rank 0
        (on the last pipeline stage's first rank with PP), None elsewhere.
        """
        started = time.perf_counter()
        micro_batches = self._micro_batches(batch)

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
            return out.loss * mb["loss_scale"], out.metrics

        self.ddp.zero_grad_buffer()
        self.optimizer.zero_grad()
        self.routing.reset_counts()  # this step's routing only (not the logprob recompute's)
        outputs = self._run(micro_batches, loss_fn, forward_only=False)
        lr = float(self.optimizer.param_groups[0]["lr"])  # the lr this update uses
        update_ok, grad_norm = self._optimizer_step(outputs)
        metrics = self._summed_metrics(outputs) | self._routing_metrics(len(micro_batches))
        info = self.info()
        if not (info.reports and info.dp_rank == 0):
            return None
        metrics.update(
            grad_norm=grad_norm,
            lr=lr,
            update_successful=float(update_ok),
            skipped_steps=float(self.skipped_steps),
            num_micro_batches=float(len(micro_batches)),
            step=float(self.step),
            # This rank's wall time for the op, without RPC and the supervisor's work.
            step_time_s=time.perf_counter() - started,
        )
        if torch.cuda.is_available():  # this rank's peak device memory since start (or since colocation's last phase)
            metrics.update(memory_peak_allocated_gb=torch.cuda.max_memory_allocated() / 2**30,
                           memory_peak_reserved_gb=torch.cuda.max_memory_reserved() / 2**30)
        return metrics

    @torch.no_grad()
    def _refuse_non_finite_weights(self, what: str) -> None:
        """Raise before ``what`` publishes weights (export, broadcast) when any rank's are not finite."""
        params = self._params()
        if all_ranks_agree(all_finite(list(params.values())), self.device):
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
        self.ref_state = self._frozen_state(hf_dir)

    @torch.no_grad()
    def _frozen_state(self, path: str) -> dict[str, torch.Tensor]:
        """The weights of an HF directory or a Megatron checkpoint (this model's architecture),
        loaded through the model and copied out; the model keeps its own weights."""
        current = {n: p.detach().clone() for n, p in self._params().items()}
        megatron_dir = megatron_checkpoint_dir(path)
        if megatron_dir is not None:
            load_model_weights(megatron_dir, unwrap_model(self.ddp))
        else:
            load_hf_weights(unwrap_model(self.ddp), path)
        frozen = {n: p.detach().clone() for n, p in self._params().items()}
        self._copy_in(current)
        return frozen

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

    # ----- export ---------------------------------------------------------------------------------
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

    def weight_store_port(self) -> int | None:
        return self.weights.store_port()

    def broadcast_weights(self, group_name: str = "weight_update_group", flattened: bool = True) -> int:
        self._refuse_non_finite_weights("broadcast weights to the engines")
        return self.weights.broadcast(group_name, flattened=flattened)

    def destroy_weight_group(self, group_name: str = "weight_update_group") -> None:
        self.weights.destroy_group(group_name)
