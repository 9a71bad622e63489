"""Rollout routing replay (R3): the trainer's MoE layers route each token to the experts the engine used.

megatron-core routes through ``router.router_replay.get_replay_topk(scores, topk, ..., default)``
when a router has a replay object (``moe_enable_routing_replay``; megatron/core/transformer/moe/
router_replay.py). Its own ``RouterReplay`` replays a whole micro-batch or nothing and keeps a
process-global list of instances; the trainer needs per-token replay (a sample without the
engine's experts, the last token, padding: own routing) and the router's own choice alongside
(the routing-mismatch metric). So each TopKRouter of the model gets a ``RouterProbe`` (a
``RouterReplay`` taken out of that global list) that

- computes the router's own top-k (it costs one top-k per layer),
- returns the engine's experts for the rows that have them (``target`` row ``>= 0``) and its own
  elsewhere, with probabilities gathered from the router's scores exactly as megatron-core's
  replay does (softmax over the replayed logits, or the replayed sigmoid scores renormalised),
- counts per layer: rows replayed, rows whose own expert set differs from the engine's, and
  tokens per expert of the routing actually used (the expert load).

Layout. ``Sample.rollout_routed_experts`` is ``[len(tokens) - 1, MoE layers, top-k]``: row i holds
the experts that processed token position i (the last token was never fed to the engine). The
model runs sequence-first, so a right-padded ``[B, S]`` micro-batch is routed as ``S * B`` rows
(row ``s * B + b``) and a packed ``[1, total]`` one as ``total`` rows in packing order.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from megatron.core import parallel_state
from megatron.core.transformer.moe.router import TopKRouter
from megatron.core.transformer.moe.router_replay import RouterReplay

from actors.megatron.sequence_parallel import local_rows

NO_REPLAY = -1  # a target row of -1: the router routes this token itself


class RoutingReplayError(ValueError):
    """A sample's routed experts do not fit the model (shape, expert ids)."""


def moe_layer_indices(config: Any) -> list[int]:
    """0-based decoder layer numbers of the MoE layers, from ``moe_layer_freq`` (int or 0/1 list)."""
    if not getattr(config, "num_moe_experts", None):
        return []
    freq = config.moe_layer_freq
    if isinstance(freq, int):
        return [i for i in range(config.num_layers) if i % freq == 0]
    return [i for i, is_moe in enumerate(freq) if is_moe]


class RouterProbe(RouterReplay):
    """One router's replay target for the current micro-batch and its routing counters."""

    def __init__(self, num_experts: int, layer: int):
        super().__init__()
        # Not megatron-core's global replay: that list would keep every model's probes alive.
        RouterReplay.global_router_replay_instances.remove(self)
        self.num_experts = num_experts
        self.layer = layer  # 0-based decoder layer number
        self.target: torch.Tensor | None = None  # [rows, topk] long; NO_REPLAY rows route themselves
        self.valid: torch.Tensor | None = None  # [rows] bool: real tokens (not padding), counted in the load
        self.own: torch.Tensor | None = None  # the router's own top-k [rows, topk] of the last forward
        self.reset_counts()

    def reset_counts(self) -> None:
        # [replayed rows, of those the rows whose own top-k set differs from the engine's, tokens per
        # expert of the routing used...]; kept on the router's device (no host sync per layer).
        self.counts: torch.Tensor | None = None

    def get_replay_topk(self, scores, topk, num_groups=None, group_topk=None, default_compute_topk=None):
        probs, own = default_compute_topk(scores, topk, num_groups=num_groups, group_topk=group_topk)
        self.own = own.detach()
        used = own
        if self.counts is None:
            self.counts = torch.zeros(2 + self.num_experts, dtype=torch.float64, device=scores.device)
        if self.target is not None:
            target = self.target.to(scores.device)
            if target.shape != own.shape:
                raise RoutingReplayError(f"layer {self.layer}: replay targets {tuple(target.shape)} for a router "
                                         f"input of {tuple(own.shape)} rows x top-k")
            replay = target[:, 0] >= 0
            used = torch.where(replay[:, None], target, own)
            probs = scores.gather(1, used)
            same = (target.sort(dim=1).values == own.sort(dim=1).values).all(dim=1)
            self.counts[0] += replay.sum()
            self.counts[1] += (replay & ~same).sum()
        counted = used if self.valid is None else used[self.valid.to(used.device)]
        self.counts[2:] += torch.bincount(counted.reshape(-1), minlength=self.num_experts)
        return probs, used


class RoutingReplay:
    """The probes of one model's routers and the micro-batch layout of the engine's experts."""

    def __init__(self, model: torch.nn.Module, moe_layers: Sequence[int]):
        self.moe_layers = list(moe_layers)  # every MoE layer of the model (all pipeline stages)
        self.probes: list[RouterProbe] = []
        for module in model.modules():
            if isinstance(module, TopKRouter):
                probe = RouterProbe(module.config.num_moe_experts, module.layer_number - 1)
                module.router_replay = probe
                self.probes.append(probe)
        self.topk = model.config.moe_router_topk if self.probes else 0
        self.num_experts = model.config.num_moe_experts or 0
        # Sequence parallelism: each TP rank's routers see its slice of the tokens.
        self.sequence_parallel = bool(self.probes) and model.config.sequence_parallel

    @property
    def active(self) -> bool:
        return bool(self.probes)

    # ----- one micro-batch -----------------------------------------------------------------------
    def targets(self, experts: Sequence[Any] | None, lengths: Sequence[int], packed: bool,
                sample_ids: Sequence[Any] = (), pad_to: tuple[int, ...] | None = None
                ) -> tuple[torch.Tensor | None, torch.Tensor]:
        """(targets ``[rows, MoE layers, topk]`` or None, valid ``[rows]``) of a micro-batch.

        ``experts``: per sample its ``[len - 1, MoE layers, topk]`` array or None (route itself).
        ``pad_to``: the inputs' padded shape (`micro_batch_shape`, EP alignment), pad rows route
        themselves. Raises RoutingReplayError naming the sample when an array does not fit.
        """
        total = sum(lengths)
        if packed:
            rows_shape: tuple[int, ...] = (pad_to[0] if pad_to else total,)
            valid = torch.arange(rows_shape[0]) < total
        else:
            n, seq = pad_to if pad_to else (len(lengths), max(lengths))
            rows_shape = (seq, n)  # the model's token order, sequence first
            padded_lengths = torch.tensor([*lengths, *[0] * (n - len(lengths))])
            valid = (torch.arange(seq)[:, None] < padded_lengths[None, :]).reshape(-1)
        if experts is None or all(e is None for e in experts):
            return None, valid
        layers = len(self.moe_layers)
        grid = torch.full((*rows_shape, layers, self.topk), NO_REPLAY, dtype=torch.long)
        start = 0
        for i, (array, length) in enumerate(zip(experts, lengths)):
            if array is not None:
                rows = self._checked(array, length, sample_ids[i] if i < len(sample_ids) else i)
                if packed:
                    grid[start:start + length - 1] = rows
                else:
                    grid[: length - 1, i] = rows
            start += length
        return grid.reshape(-1, layers, self.topk), valid

    def _checked(self, array: Any, length: int, sample: Any) -> torch.Tensor:
        expected = (length - 1, len(self.moe_layers), self.topk)
        shape = tuple(np.shape(array))
        if shape != expected:
            raise RoutingReplayError(
                f"sample {sample}: rollout_routed_experts has shape {shape}, the trainer expects {expected} "
                "= [len(tokens) - 1, MoE layers, top-k]")
        rows = torch.as_tensor(np.asarray(array), dtype=torch.long)
        if rows.numel() and (int(rows.min()) < 0 or int(rows.max()) >= self.num_experts):
            raise RoutingReplayError(f"sample {sample}: rollout_routed_experts holds expert ids outside "
                                     f"[0, {self.num_experts}) (min {int(rows.min())}, max {int(rows.max())})")
        if rows.numel() and bool((rows.sort(dim=-1).values.diff(dim=-1) == 0).any()):
            raise RoutingReplayError(f"sample {sample}: rollout_routed_experts repeats an expert within a token's "
                                     "top-k")
        return rows

    def begin(self, targets: torch.Tensor | None, valid: torch.Tensor | None) -> None:
        """Route the next forward by ``targets`` (None: every router routes itself); ``targets`` and
        ``valid`` cover the micro-batch's tokens, of which each TP rank routes its slice under SP."""
        if self.sequence_parallel:
            targets = None if targets is None else local_rows(targets)
            valid = None if valid is None else local_rows(valid)
        for probe in self.probes:
            ordinal = self.moe_layers.index(probe.layer)
            probe.target = None if targets is None else targets[:, ordinal].contiguous()
            probe.valid = valid

    def end(self) -> None:
        for probe in self.probes:
            probe.target = probe.valid = None

    # ----- metrics ---------------------------------------------------------------------------------
    def reset_counts(self) -> None:
        for probe in self.probes:
            probe.reset_counts()

    def metrics(self, device: torch.device) -> dict[str, float]:
        """This step's routing metrics over every DP rank and pipeline stage (a collective on all ranks):

        ``moe/routing_mismatch``: fraction of replayed (token, MoE layer) pairs whose trainer top-k set
        differs from the engine's (absent when nothing was replayed); ``moe/load_imbalance`` (mean over
        MoE layers) and ``moe/load_imbalance_layer{i}``: max / mean tokens per expert of the routing used;
        ``moe/max_expert_load_layer{i}``: the busiest expert's share of the layer's token slots.
        """
        if not self.moe_layers:
            return {}
        counts = torch.zeros(max(self.moe_layers) + 1, self.num_experts + 2, dtype=torch.float64, device=device)
        for probe in self.probes:
            if probe.counts is not None:
                counts[probe.layer] += probe.counts
        if self.sequence_parallel:  # each TP rank counted its slice of the tokens
            dist.all_reduce(counts, group=parallel_state.get_tensor_model_parallel_group())
        dist.all_reduce(counts, group=parallel_state.get_data_parallel_group())
        dist.all_reduce(counts, group=parallel_state.get_pipeline_model_parallel_group())
        counts = counts.cpu()
        out: dict[str, float] = {}
        replayed = float(counts[:, 0].sum())
        if replayed:
            out["moe/routing_mismatch"] = float(counts[:, 1].sum()) / replayed
        imbalances = []
        for layer in self.moe_layers:
            load = counts[layer, 2:]
            if load.sum() == 0:
                continue
            imbalance = float(load.max() / load.mean())
            imbalances.append(imbalance)
            out[f"moe/load_imbalance_layer{layer}"] = imbalance
            out[f"moe/max_expert_load_layer{layer}"] = float(load.max() / load.sum())
        if imbalances:
            out["moe/load_imbalance"] = sum(imbalances) / len(imbalances)
        return out


# The losses megatron-core's routers track (megatron/core/transformer/moe/router.py), in a fixed order so
# every rank issues the same collectives whichever of them its layers track.
_TRACKED_LOSSES = ("load_balancing_loss", "seq_load_balancing_loss", "global_load_balancing_loss", "z_loss")


def aux_loss_metrics(num_layers: int, num_moe_layers: int, num_micro_batches: int,
                     device: torch.device) -> dict[str, float]:
    """megatron-core's tracked MoE losses of this step (``moe/load_balancing_loss``, ``moe/z_loss``...)
    without their coefficients, per MoE layer and micro-batch, averaged over DP ranks; then clears the
    tracker. A collective on every rank (over the DP and pipeline groups)."""
    from megatron.core.transformer.moe.moe_utils import clear_aux_losses_tracker, get_moe_layer_wise_logging_tracker

    if not num_moe_layers:
        return {}
    tracker = get_moe_layer_wise_logging_tracker()
    # [loss, layer + presence flag]: a stage whose layers track nothing still joins the reduction.
    values = torch.zeros(len(_TRACKED_LOSSES), num_layers + 1, dtype=torch.float64, device=device)
    for row, name in enumerate(_TRACKED_LOSSES):
        if name in tracker:
            tracked = tracker[name]["values"].detach().double().to(device)
            group = tracker[name].get("reduce_group")
            if group is not None and dist.get_world_size(group) > 1:
                # Each rank's value covers its own tokens (its slice of the sequence under SP): summed
                # over the router's reduce group first, as megatron-core's own logging does.
                dist.all_reduce(tracked, group=group)
            values[row, : tracked.numel()] = tracked[:num_layers]
            values[row, -1] = 1.0
    clear_aux_losses_tracker()
    dist.all_reduce(values, group=parallel_state.get_data_parallel_group())
    dist.all_reduce(values, group=parallel_state.get_pipeline_model_parallel_group())
    dp = parallel_state.get_data_parallel_world_size()
    return {f"moe/{name}": float(values[row, :-1].sum()) / (dp * num_moe_layers * max(num_micro_batches, 1))
            for row, name in enumerate(_TRACKED_LOSSES) if values[row, -1] > 0}
