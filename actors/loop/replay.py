"""``--debug-train-only``: train on rollouts dumped by ``--save-debug-rollout-data``, no engines.

Reproduces a run's training side exactly (same groups, same order) to debug the trainer or a
loss without generating anything.
"""

from __future__ import annotations

import time

from actors.loop.batching import advantage_logprobs, build_train_batch
from actors.loop.debug_dump import load_groups
from actors.loop.opd import trainer_teacher_logprobs
from slime_async.actor import ActorRef
from actors.loop.run_config import RunConfig


async def replay_loop(config: RunConfig, *, trainer: ActorRef, monitor: ActorRef) -> int:
    steps = 0
    for step, groups in load_groups(config.train.load_debug_rollout_data):
        started = time.monotonic()
        # Each dumped batch was trained at version step - 1 (one weight sync per step).
        temperature = config.rollout.logprob_temperature
        ref_logprobs, old_logprobs = await advantage_logprobs(trainer, groups, config.algorithm, temperature)
        teacher_logprobs = await trainer_teacher_logprobs(trainer, groups, config.algorithm, temperature)
        # The dump holds the samples as generated: the off-policy mask is recomputed as the run did.
        batch, metrics = build_train_batch(groups, config.algorithm, train_version=step - 1, temperature=temperature,
                                           max_staleness=config.buffer.max_staleness,
                                           mask_offpolicy=config.buffer.mask_offpolicy_in_partial_rollout,
                                           ref_logprobs=ref_logprobs, old_logprobs=old_logprobs,
                                           teacher_logprobs=teacher_logprobs)
        train_metrics = await trainer.ask("train_step", batch, config.algorithm,
                                          max_response_len=config.rollout.rollout_max_response_len, timeout=None)
        metrics.update({f"train/{k}": v for k, v in train_metrics.items()})
        metrics["perf/step_time"] = time.monotonic() - started
        monitor.tell("log", step, metrics)
        steps += 1
    if steps == 0:
        raise FileNotFoundError(f"--load-debug-rollout-data {config.train.load_debug_rollout_data}: no step_*.jsonl dumps")
    await monitor.ask("flush")
    return 0
