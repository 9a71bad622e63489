"""The train section: how generation and training interleave, and how weights reach engines."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Literal

from slime_async.config.flags import field_help as _help
from slime_async.config.paths import require_dir, require_writable_dir
from slime_async.quiesce import RENAMED

log = logging.getLogger(__name__)

TrainMode = Literal["sync", "one-step-off", "fully-async"]
# The weight sync's choices (actors/weight_sync/); the loader admits only these values.
WeightTransport = Literal["disk", "distributed", "delta", "tensor"]
# slime_async/quiesce.py's modes, and "pause", the old name of drain (accepted with a warning).
WeightUpdateMode = Literal["abort", "drain", "in_place", "retract", "pause"]


@dataclass
class TrainConfig:
    train_mode: TrainMode = field(default="sync", metadata=_help(
        "sync: generate, train, sync weights; one-step-off: generate step N+1 while training N; "
        "fully-async: rollout never waits for training, bounded by --max-staleness"))
    update_weights_interval: int = field(default=1, metadata=_help("sync weights to engines every N training steps"))
    # None: unset, resolved to disk (tensor with --colocate) by RunConfig.resolve, so that an
    # explicit choice is never overridden.
    update_weight_transport: WeightTransport | None = field(default=None, metadata=_help(
        "default disk (tensor with --colocate). disk: the trainer writes an HF checkpoint every engine "
        "loads; distributed: trainer rank 0 broadcasts buckets (gloo to CPU engines, NCCL to GPU "
        "engines); delta: each engine gets only what changed since the version it holds, compressed "
        "and checksummed, over HTTP (remote engines on slow links; a full transfer after an engine "
        "restart); tensor: SGLang's update_weights_from_tensor with IPC handles (CUDA IPC on GPU, shared "
        "memory on CPU), for engines on the trainer's own devices: --colocate, or both resident on one GPU"))
    colocate: bool = field(default=False, metadata=_help(
        "trainer and engines time-share the same devices (slime's flag): engines release their memory while "
        "the trainer trains, the trainer offloads while they generate, weights move by --update-weight-transport "
        "tensor (its default there); sync and one-step-off modes, --weight-update-mode abort"))
    update_weight_delta_receivers: str | None = field(default=None, metadata=_help(
        "delta transport: ENGINE_URL=RECEIVER_URL pairs, comma-separated, for engines whose receiver "
        "runs beside them (SGLang: python -m actors.engine.delta_receiver); an engine not named is its "
        "own receiver (the CPU engine)"))
    weight_update_mode: WeightUpdateMode = field(default="abort", metadata=_help(
        "before a weight update the router stops dispatching, then abort: aborts the requests in "
        "flight (they resume on the new weights from their partial tokens); drain: lets them finish "
        "on the old weights (pause: its old name); in_place: each engine holds them with their KV cache, the "
        "weights are updated, they continue on the new ones (no abort, no re-prefill; a sample's tokens then "
        "span two versions, recorded per token); retract: each engine moves them back to its queue and "
        "re-prefills them on the new weights (slime_async/quiesce.py)"))
    weight_update_timeout: float = field(default=300.0, metadata=_help(
        "seconds each part of a weight sync may take: the trainer's export, an engine's load, the router's "
        "abort and confirmation (a pause's drain is not limited)"))
    debug_rollout_only: bool = field(default=False, metadata=_help("generate and score, never train"))
    debug_train_only: bool = field(default=False, metadata=_help(
        "train on rollouts replayed from --load-debug-rollout-data"))
    save_debug_rollout_data: str | None = field(default=None, metadata=_help(
        "dump every training batch of samples here (JSONL per step) for --debug-train-only"))
    load_debug_rollout_data: str | None = field(default=None, metadata=_help(
        "replay rollouts dumped by --save-debug-rollout-data"))
    debug_hold_weight_sync: str | None = field(default=None, metadata=_help(
        "fault injection at a known moment (benchmarks/gpu/chaos.py): a weight sync vN for which this directory "
        "holds a file hold-vN waits, its engines paused, after its 'transfer ... begins' line until the file is removed"))

    def validate(self) -> None:
        if self.weight_update_mode in RENAMED:
            new = RENAMED[self.weight_update_mode]
            log.warning("--weight-update-mode %s is now called %s", self.weight_update_mode, new)
            self.weight_update_mode = new  # type: ignore[assignment]
        if self.update_weights_interval <= 0:
            raise ValueError(f"--update-weights-interval must be > 0, got {self.update_weights_interval}")
        if self.debug_rollout_only and self.debug_train_only:
            raise ValueError("--debug-rollout-only and --debug-train-only exclude each other")
        if self.debug_train_only and not self.load_debug_rollout_data:
            raise ValueError("--debug-train-only needs --load-debug-rollout-data DIR")
        self.delta_receivers()
        if self.colocate:
            self._check_colocate()

    def _check_colocate(self) -> None:
        if self.train_mode == "fully-async":
            raise ValueError("--colocate with --train-mode fully-async: colocated engines hold no memory while the "
                             "trainer trains, so rollout cannot run beside training; use sync or one-step-off")
        if self.update_weight_transport in ("distributed", "delta"):
            raise ValueError(f"--colocate with --update-weight-transport {self.update_weight_transport}: colocated "
                             "weights move by IPC handles on the shared devices (an NCCL group cannot span one GPU "
                             "twice); use --update-weight-transport tensor (the default with --colocate)")
        if self.update_weight_transport == "disk":
            raise ValueError("--colocate with --update-weight-transport disk: the engines load the weights the trainer "
                             "holds on the shared devices; use --update-weight-transport tensor (the default)")
        if self.weight_update_mode != "abort":
            raise ValueError(f"--colocate with --weight-update-mode {self.weight_update_mode}: the engines release "
                             "their memory after every rollout, so requests in flight are aborted; use abort")
        if self.update_weights_interval != 1:
            raise ValueError(f"--colocate with --update-weights-interval {self.update_weights_interval}: the engines "
                             "release their weights for every training step, so they must get them back after each")
        if self.debug_rollout_only or self.debug_train_only:
            raise ValueError("--colocate with --debug-rollout-only / --debug-train-only: nothing to time-share")

    def delta_receivers(self) -> dict[str, str]:
        """--update-weight-delta-receivers as engine URL -> receiver URL."""
        pairs: dict[str, str] = {}
        for item in filter(None, (part.strip() for part in (self.update_weight_delta_receivers or "").split(","))):
            engine, sep, receiver = item.partition("=")
            if not sep or not engine.strip() or not receiver.strip():
                raise ValueError(f"--update-weight-delta-receivers: {item!r} is not ENGINE_URL=RECEIVER_URL")
            pairs[engine.strip().rstrip("/")] = receiver.strip().rstrip("/")
        if pairs and self.update_weight_transport != "delta":
            raise ValueError("--update-weight-delta-receivers needs --update-weight-transport delta")
        return pairs

    def preflight(self) -> None:
        if self.save_debug_rollout_data:
            require_writable_dir(self.save_debug_rollout_data, "--save-debug-rollout-data")
        if self.debug_train_only:
            require_dir(self.load_debug_rollout_data, "--load-debug-rollout-data")
        if self.debug_hold_weight_sync:
            require_dir(self.debug_hold_weight_sync, "--debug-hold-weight-sync")
