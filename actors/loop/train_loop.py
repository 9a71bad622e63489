"""The RL loop, in one screen: take groups from the buffer, train, sync weights, log, evaluate.

The same loop serves every mode; the buffer's admission bound sets the pace of generation
(sync = 0 steps stale, one-step-off = 1, fully-async = --max-staleness), so the rollout side
never needs to know which mode runs. Evaluations run beside training in a task group the loop
owns: one still running at the end is awaited, an error in the loop cancels them.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Any

from actors.loop.batching import advantage_logprobs, build_train_batch
from actors.loop.run_checkpoint import RunCheckpointer
from actors.loop.critic import critic_values, train_critic, trains_policy, uses_critic
from actors.loop.debug_dump import dump_groups
from actors.loop.opd import trainer_teacher_logprobs
from actors.loop.run_config import RunConfig
from slime_async.actor import ActorRef
from slime_async.task_group import gather_or_cancel, task_group
from slime_async.trace import TraceRecorder

log = logging.getLogger(__name__)


@dataclass
class RunProgress:
    """What one attempt of a run achieved; the launcher reads it after a failure."""

    steps_trained: int = 0


@dataclass
class Handles:
    """The running actors the loop talks to."""

    rollout: ActorRef
    buffer: ActorRef
    trainer: ActorRef | None
    router: ActorRef
    monitor: ActorRef
    weight_sync: ActorRef | None  # actors/weight_sync: None with --debug-rollout-only
    checkpointer: RunCheckpointer | None
    eval_dataset: Any | None
    total_steps: int
    start_step: int = 0
    start_version: int = 0
    restarts: int = 0  # how often this run was restarted from a checkpoint after a failure
    progress: RunProgress = field(default_factory=RunProgress)
    colocate: bool = False  # --colocate: engines and trainer take turns on the devices (the weight sync's phases)
    trace: TraceRecorder = field(default_factory=TraceRecorder.off)  # --trace-dir


async def train_loop(config: RunConfig, h: Handles) -> int:
    step, version = h.start_step, h.start_version
    spec, rollout_cfg = config.algorithm, config.rollout
    evaluated_at: int | None = None  # the step of the last evaluation started
    async with task_group() as evaluations:
        if h.eval_dataset is not None:
            evaluated_at = _start_evaluation(evaluations, h, step)
        h.rollout.tell("start")
        while step < h.total_steps:
            started = time.monotonic()
            waited = h.trace.now()
            # None once the rollout has told the buffer that the data ended and too few groups are left.
            groups = await h.buffer.ask("get", rollout_cfg.rollout_batch_size, version, timeout=None)
            h.trace.record("wait for data", h.trace.lane("buffer", "trainer waits for data"), waited,
                           cat="buffer_wait", min_seconds=0.001, step=step + 1)
            step_started = h.trace.now()
            if groups is None:
                log.warning("prompt data ran out after %d of %d steps", step, h.total_steps)
                break
            # Colocated: the engines release the devices, the trainer's state comes back to them.
            colocated = await h.weight_sync.ask("hand_devices_to_trainer", timeout=None) if h.colocate else {}
            temperature = rollout_cfg.logprob_temperature
            ref_logprobs = old_logprobs = None
            if h.trainer is not None:
                ref_logprobs, old_logprobs = await advantage_logprobs(h.trainer, groups, spec, temperature)
            values = await critic_values(h.trainer, groups, temperature) if h.trainer and uses_critic(spec) else None
            teacher = await trainer_teacher_logprobs(h.trainer, groups, spec, temperature)  # --opd-type megatron
            batch, metrics = build_train_batch(
                groups, spec, train_version=version, temperature=temperature, max_staleness=config.buffer.max_staleness,
                mask_offpolicy=config.buffer.mask_offpolicy_in_partial_rollout, ref_logprobs=ref_logprobs,
                old_logprobs=old_logprobs, values=values, lambd=config.critic.lambd, teacher_logprobs=teacher)
            metrics.update(colocated)
            if config.train.save_debug_rollout_data:
                dump_groups(config.train.save_debug_rollout_data, step + 1, groups)
            if h.trainer is not None:
                train_started = time.monotonic()
                # The policy and the critic (PPO) train at once, each in its own torchrun group. During the critic's
                # warm-up the policy rests; its unchanged weights still sync (the version paces admission).
                policy_step = (h.trainer.ask("train_step", batch, spec, timeout=None,
                                             max_response_len=rollout_cfg.rollout_max_response_len)
                               if trains_policy(config, step) else _no_update())
                # One failing cancels the other (neither is left training for a step that will not be taken).
                train_metrics, critic_metrics = await gather_or_cancel(policy_step, train_critic(h.trainer, batch, config))
                metrics.update({f"train/{k}": v for k, v in train_metrics.items()} | critic_metrics)
                metrics["perf/train_time"] = time.monotonic() - train_started
            step += 1
            if h.weight_sync is not None and step % config.train.update_weights_interval == 0:
                version += 1
                metrics["perf/weight_sync_time"] = await h.weight_sync.ask("sync", version, timeout=None)
                await h.buffer.ask("set_version", version)
            metrics["perf/step_time"] = time.monotonic() - started
            h.trace.record(f"step {step}", h.trace.lane("train loop", "steps"), step_started, cat="train_step",
                           step=step, version=version, samples=len(batch))
            metrics["train/version"] = float(version)
            metrics["run/restarts"] = float(h.restarts)
            metrics.update(await h.rollout.ask("metrics"))
            metrics.update(await h.buffer.ask("metrics"))
            metrics.update(await h.router.ask("metrics"))
            if h.weight_sync is not None:
                metrics.update(await h.weight_sync.ask("metrics"))
            h.monitor.tell("log", step, metrics)
            h.progress.steps_trained += 1
            if h.eval_dataset is not None and config.rollout.eval_interval and step % config.rollout.eval_interval == 0:
                evaluated_at = _start_evaluation(evaluations, h, step)
            if h.checkpointer is not None and h.checkpointer.due(step):
                await _on_device(h, h.checkpointer.save(step, version))
        if h.eval_dataset is not None and evaluated_at != step:
            _start_evaluation(evaluations, h, step)
    # Leaving the task group awaited every evaluation still running.
    if h.checkpointer is not None and h.checkpointer.enabled:
        await _on_device(h, h.checkpointer.save(step, version))
    await h.monitor.ask("flush")
    return 0


async def _on_device(h: Handles, work: Awaitable[Any]) -> Any:
    """Colocated, the trainer's state is in host memory between steps: a checkpoint brings it back first."""
    if not h.colocate:
        return await work
    await h.weight_sync.ask("trainer_on_device", timeout=None)
    try:
        return await work
    finally:
        await h.weight_sync.ask("trainer_off_device", timeout=None)


async def _no_update() -> dict[str, float]:
    return {}


def _start_evaluation(evaluations: asyncio.TaskGroup, h: Handles, step: int) -> int:
    evaluations.create_task(_evaluate(h, step), name=f"eval:{step}")
    return step


async def _evaluate(h: Handles, step: int) -> None:
    try:
        metrics = await h.rollout.ask("evaluate", h.eval_dataset, timeout=None)
    except Exception as error:  # noqa: BLE001 - an engine error: logged, counted by the rollout, training goes on
        log.error("eval at step %d failed: %s: %s", step, type(error).__name__, error)
        return
    rewards = ", ".join(f"{key} {value:.3f}" for key, value in metrics.items() if key.endswith("/reward_mean"))
    failed = sum(value for key, value in metrics.items() if key.endswith("/failed_samples"))
    log.info("eval at step %d: %s%s", step, rewards or "no samples",
             f" ({failed:g} failed sample(s) left out)" if failed else "")
    h.monitor.tell("log", step, metrics)

